// GPT: a decoder-only transformer in the shape of GPT-2 (Radford et al. 2019) as nanoGPT writes
// it: token and position embeddings, pre-LN residual blocks of causal self-attention and an
// MLP, a final LayerNorm and an output projection tied to the token embedding.
//
//   x = drop(wte[idx] + wpe[0..T))                                  embed
//   x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))                      h0 .. h{n_layer-1}
//   logits = ln_f(x) @ wte^T                                         head
//
// The model's children are exactly those stages, applied one after the other, so its
// as_sequential() is the same layers under the same names: a pipeline splits a GPT between
// blocks like any Sequential. Parameter names (nanoGPT's inside each block):
//   embed.wte.weight [V, C], embed.wpe.weight [block_size, C],
//   h<i>.ln_1.{weight,bias}, h<i>.attn.c_attn.{weight [3C, C], bias}, h<i>.attn.c_proj.{weight, bias},
//   h<i>.ln_2.{weight,bias}, h<i>.mlp.c_fc.{weight [4C, C], bias}, h<i>.mlp.c_proj.{weight, bias},
//   head.ln_f.{weight,bias}, and head.weight [V, C] when untied.
// Tied (the default), head.weight is embed.wte.weight itself (nn/module.h, Note [Tied
// parameters]): listed, saved and optimised once, under embed.wte.weight. A pipeline cannot
// put the two ends of a tie on different stages; it refuses such a split by name, and
// tie_embeddings = false makes the head its own weight (as torchtitan's models are).
//
// Initialisation as GPT-2's: every Linear and Embedding weight N(0, 0.02), biases 0,
// LayerNorms 1 and 0, and the residual projections (attn.c_proj and mlp.c_proj weights)
// N(0, 0.02 / sqrt(2 n_layer)), drawn from `gen` in registration order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/generator.h"
#include "nn/module.h"
#include "nn/sequential.h"

namespace weft::nn {

struct GPTConfig {
  int64_t vocab_size = 256;  // byte-level (data/text_dataset.h)
  int64_t block_size = 64;   // the longest sequence (positions of wpe)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;      // C; a multiple of n_head
  double dropout = 0.0;      // embeddings, attention weights, residual branches (nanoGPT's places)
  bool bias = true;          // biases in the Linears and LayerNorms
  bool tie_embeddings = true;

  // Throws naming the value when the configuration cannot make a model.
  void check() const;
  // "vocab_size=256, block_size=64, ..." (repr and error messages).
  std::string str() const;
};

// Multi-head causal self-attention: one fused projection c_attn to q, k and v [B, T, C], the
// heads as views [B, n_head, T, C / n_head], scaled_dot_product_attention (kernels/attention.h)
// with is_causal, then c_proj and a dropout.
class CausalSelfAttention : public Cloneable<CausalSelfAttention> {
 public:
  CausalSelfAttention(const GPTConfig& config, const TensorOptions& options = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;  // [B, T, C] -> [B, T, C]
  std::string extra_repr() const override;

 private:
  int64_t n_head_;
  double dropout_;
};

// c_fc (C -> 4C), GELU, c_proj (4C -> C), dropout.
class GPTMLP : public Cloneable<GPTMLP> {
 public:
  GPTMLP(const GPTConfig& config, const TensorOptions& options = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;
};

// A pre-LN residual block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
class Block : public Cloneable<Block> {
 public:
  Block(const GPTConfig& config, const TensorOptions& options = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;
};

// Token ids [B, T] (int64, T <= block_size) -> drop(wte[idx] + wpe[0..T)) [B, T, C].
class GPTEmbedding : public Cloneable<GPTEmbedding> {
 public:
  GPTEmbedding(const GPTConfig& config, const TensorOptions& options = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;

 private:
  int64_t block_size_;
};

// ln_f, then the projection to the vocabulary [B, T, C] -> [B, T, V]; `tied`, when defined,
// is the token embedding's weight, which it uses instead of a weight of its own.
class GPTHead : public Cloneable<GPTHead> {
 public:
  GPTHead(const GPTConfig& config, const Tensor& tied, const TensorOptions& options = {}, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override;
};

class GPT : public Cloneable<GPT> {
 public:
  explicit GPT(const GPTConfig& config = {}, const TensorOptions& options = {}, Generator* gen = nullptr);

  // Token ids [B, T] -> logits [B, T, vocab_size].
  Tensor forward(const Tensor& input) override;
  // embed, h0 .. h{n_layer-1}, head: the model's own children under its names.
  std::shared_ptr<Sequential> as_sequential() const override;
  std::string extra_repr() const override { return config_.str(); }

  const GPTConfig& config() const { return config_; }
  // Parameters, counting a tied weight once (GPT-2 small: 124M with 50257 tokens).
  int64_t num_parameters() const;

 private:
  GPTConfig config_;
};

// The mean cross-entropy of next-token logits [B, T, V] against targets [B, T] (int64): the
// GPT's training criterion (nn/criterion.h).
Tensor next_token_loss(const Tensor& logits, const Tensor& targets);

struct GenerateOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;       // > 0; the logits are divided by it
  std::optional<int64_t> top_k;   // sample among the k most likely tokens only
  Generator* gen = nullptr;       // the sampling's uniforms (default: the CPU's default generator)
};

// Appends options.max_new_tokens sampled tokens to each row of `prompt` [B, T0] (int64, T0 >=
// 1), feeding the model at most its last block_size tokens, in evaluation mode and without
// gradients (the model's training mode is restored). Returns [B, T0 + max_new_tokens] on the
// CPU. The model's forward maps [B, T] ids to [B, T, V] logits: a GPT, or any module that does.
Tensor generate(Module& model, int64_t block_size, const Tensor& prompt, const GenerateOptions& options = {});

}  // namespace weft::nn
