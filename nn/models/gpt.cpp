// GPT: configuration checks, the layers, initialisation, the loss and sampling.
#include "nn/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "core/autograd.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/linalg.h"
#include "kernels/loss.h"
#include "kernels/random.h"
#include "kernels/shape_ops.h"
#include "kernels/softmax.h"
#include "nn/activation.h"
#include "nn/embedding.h"
#include "nn/init.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"

namespace weft::nn {

namespace {

constexpr double kInitStd = 0.02;

// A Linear initialised as GPT-2's: weight N(0, std), bias 0.
std::shared_ptr<Linear> gpt_linear(int64_t in, int64_t out, bool bias, double std, const TensorOptions& options,
                                   Generator* gen) {
  auto layer = std::make_shared<Linear>(in, out, bias, options, gen);
  init::normal_(layer->param("weight"), 0.0, std, gen);
  if (bias) init::zeros_(layer->param("bias"));
  return layer;
}

// The residual projections' std: their outputs add up over 2 n_layer branches.
double residual_std(const GPTConfig& c) { return kInitStd / std::sqrt(2.0 * static_cast<double>(c.n_layer)); }

}  // namespace

void GPTConfig::check() const {
  WEFT_CHECK(vocab_size > 0 && block_size > 0 && n_layer > 0 && n_head > 0 && n_embd > 0,
             "GPT: vocab_size, block_size, n_layer, n_head and n_embd must be positive, got ", str());
  WEFT_CHECK(n_embd % n_head == 0, "GPT: n_head ", n_head, " does not divide n_embd ", n_embd,
             " (each head takes n_embd / n_head channels)");
  WEFT_CHECK(dropout >= 0 && dropout < 1, "GPT: dropout must be in [0, 1), got ", dropout);
}

std::string GPTConfig::str() const {
  std::ostringstream out;
  out << "vocab_size=" << vocab_size << ", block_size=" << block_size << ", n_layer=" << n_layer
      << ", n_head=" << n_head << ", n_embd=" << n_embd << ", dropout=" << dropout
      << ", bias=" << (bias ? "true" : "false") << ", tie_embeddings=" << (tie_embeddings ? "true" : "false");
  return out.str();
}

// --- attention -------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config, const TensorOptions& options, Generator* gen)
    : Cloneable("CausalSelfAttention"), n_head_(config.n_head), dropout_(config.dropout) {
  config.check();
  const int64_t C = config.n_embd;
  register_module("c_attn", gpt_linear(C, 3 * C, config.bias, kInitStd, options, gen));
  register_module("c_proj", gpt_linear(C, C, config.bias, residual_std(config), options, gen));
  register_module("resid_dropout", std::make_shared<Dropout>(config.dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& input) {
  WEFT_CHECK(input.defined() && input.dim() == 3, "CausalSelfAttention: expected [B, T, C], got ",
             input.defined() ? input.shape().str() : "an undefined tensor");
  const int64_t B = input.size(0), T = input.size(1), C = input.size(2), D = C / n_head_;
  const Tensor qkv = child("c_attn")(input);  // [B, T, 3C]
  // Each of q, k, v is a view [B, n_head, T, D] of qkv (the fused kernel takes them contiguous as
  // [B * n_head, T, D], copying these strided views once).
  auto head_view = [&](int64_t part) { return qkv.narrow(2, part * C, C).view({B, T, n_head_, D}).transpose(1, 2); };
  const Tensor y = scaled_dot_product_attention(head_view(0), head_view(1), head_view(2), /*is_causal=*/true,
                                                is_training() ? dropout_ : 0.0);
  return child("resid_dropout")(child("c_proj")(y.transpose(1, 2).reshape({B, T, C})));
}

std::string CausalSelfAttention::extra_repr() const {
  std::ostringstream out;
  out << "n_head=" << n_head_ << ", dropout=" << dropout_;
  return out.str();
}

// --- MLP and block ---------------------------------------------------------------------

GPTMLP::GPTMLP(const GPTConfig& config, const TensorOptions& options, Generator* gen) : Cloneable("GPTMLP") {
  config.check();
  const int64_t C = config.n_embd;
  register_module("c_fc", gpt_linear(C, 4 * C, config.bias, kInitStd, options, gen));
  register_module("gelu", std::make_shared<GELU>());
  register_module("c_proj", gpt_linear(4 * C, C, config.bias, residual_std(config), options, gen));
  register_module("dropout", std::make_shared<Dropout>(config.dropout));
}

Tensor GPTMLP::forward(const Tensor& input) {
  return child("dropout")(child("c_proj")(child("gelu")(child("c_fc")(input))));
}

Block::Block(const GPTConfig& config, const TensorOptions& options, Generator* gen) : Cloneable("Block") {
  config.check();
  register_module("ln_1", std::make_shared<LayerNorm>(config.n_embd, 1e-5, true, config.bias, options));
  register_module("attn", std::make_shared<CausalSelfAttention>(config, options, gen));
  register_module("ln_2", std::make_shared<LayerNorm>(config.n_embd, 1e-5, true, config.bias, options));
  register_module("mlp", std::make_shared<GPTMLP>(config, options, gen));
}

Tensor Block::forward(const Tensor& input) {
  const Tensor x = add(input, child("attn")(child("ln_1")(input)));
  return add(x, child("mlp")(child("ln_2")(x)));
}

// --- the two ends ------------------------------------------------------------------------

GPTEmbedding::GPTEmbedding(const GPTConfig& config, const TensorOptions& options, Generator* gen)
    : Cloneable("GPTEmbedding"), block_size_(config.block_size) {
  config.check();
  auto& wte = register_module("wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd, options, gen));
  init::normal_(wte.param("weight"), 0.0, kInitStd, gen);
  auto& wpe = register_module("wpe", std::make_shared<Embedding>(config.block_size, config.n_embd, options, gen));
  init::normal_(wpe.param("weight"), 0.0, kInitStd, gen);
  register_module("drop", std::make_shared<Dropout>(config.dropout));
}

Tensor GPTEmbedding::forward(const Tensor& input) {
  WEFT_CHECK(input.defined() && input.dim() == 2 && input.dtype() == DType::Int64,
             "GPT: expected token ids int64 [B, T], got ",
             input.defined() ? input.shape().str() + " " + std::string(dtype_name(input.dtype()))
                             : std::string("an undefined tensor"));
  const int64_t T = input.size(1);
  WEFT_CHECK(T >= 1 && T <= block_size_, "GPT: a sequence of ", T, " tokens; the model's block_size is ",
             block_size_, " (positions 0 .. ", block_size_ - 1, ")");
  const Tensor positions = arange(T, TensorOptions(DType::Int64, input.device()));
  return child("drop")(add(child("wte")(input), child("wpe")(positions)));
}

GPTHead::GPTHead(const GPTConfig& config, const Tensor& tied, const TensorOptions& options, Generator* gen)
    : Cloneable("GPTHead") {
  config.check();
  register_module("ln_f", std::make_shared<LayerNorm>(config.n_embd, 1e-5, true, config.bias, options));
  if (tied.defined()) {
    WEFT_CHECK(tied.dim() == 2 && tied.size(0) == config.vocab_size && tied.size(1) == config.n_embd,
               "GPTHead: the tied weight is ", tied.shape(), ", expected [", config.vocab_size, ", ", config.n_embd,
               "]");
    register_parameter("weight", tied);
  } else {
    init::normal_(register_parameter("weight", empty({config.vocab_size, config.n_embd},
                                                     TensorOptions(options.dtype, options.device))),
                  0.0, kInitStd, gen);
  }
}

Tensor GPTHead::forward(const Tensor& input) { return linear(child("ln_f")(input), param("weight")); }

// --- the model -------------------------------------------------------------------------

GPT::GPT(const GPTConfig& config, const TensorOptions& options, Generator* gen) : Cloneable("GPT"), config_(config) {
  config.check();
  auto& embed = register_module("embed", std::make_shared<GPTEmbedding>(config, options, gen));
  for (int64_t i = 0; i < config.n_layer; ++i)
    register_module("h" + std::to_string(i), std::make_shared<Block>(config, options, gen));
  const Tensor tied = config.tie_embeddings ? embed.child("wte").param("weight") : Tensor();
  register_module("head", std::make_shared<GPTHead>(config, tied, options, gen));
}

Tensor GPT::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, layer] : named_children()) x = layer->forward(x);
  return x;
}

std::shared_ptr<Sequential> GPT::as_sequential() const {
  auto seq = std::make_shared<Sequential>();
  for (const auto& [name, layer] : named_children()) seq->push_back(name, layer);
  return seq;
}

int64_t GPT::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

Tensor next_token_loss(const Tensor& logits, const Tensor& targets) {
  WEFT_CHECK(logits.defined() && targets.defined() && logits.dim() == 3 && targets.dim() == 2 &&
                 logits.size(0) == targets.size(0) && logits.size(1) == targets.size(1),
             "next_token_loss: expected logits [B, T, V] and targets [B, T], got ",
             logits.defined() ? logits.shape().str() : "undefined", " and ",
             targets.defined() ? targets.shape().str() : "undefined");
  return cross_entropy(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}));
}

// --- sampling ----------------------------------------------------------------------------

Tensor generate(Module& model, int64_t block_size, const Tensor& prompt, const GenerateOptions& options) {
  WEFT_CHECK(prompt.defined() && prompt.dim() == 2 && prompt.size(1) >= 1 && prompt.dtype() == DType::Int64,
             "generate: expected a prompt of token ids int64 [B, T] with T >= 1, got ",
             prompt.defined() ? prompt.shape().str() : "undefined");
  WEFT_CHECK(block_size >= 1, "generate: block_size must be positive, got ", block_size);
  WEFT_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens must be non-negative, got ",
             options.max_new_tokens);
  WEFT_CHECK(options.temperature > 0 && std::isfinite(options.temperature),
             "generate: temperature must be positive, got ", options.temperature);
  WEFT_CHECK(!options.top_k || *options.top_k >= 1, "generate: top_k must be positive, got ", *options.top_k);
  NoGradGuard no_grad;
  struct RestoreMode {  // the model's training mode comes back, also when a forward throws
    Module& model;
    bool training;
    ~RestoreMode() { model.train(training); }
  } restore{model, model.is_training()};
  model.eval();
  const Device device = model.device();
  const int64_t B = prompt.size(0);
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
  const Tensor host_prompt = prompt.to(kCPU).contiguous();
  const int64_t* ids = host_prompt.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) rows[b].assign(ids + b * prompt.size(1), ids + (b + 1) * prompt.size(1));
  Generator& gen = options.gen ? *options.gen : default_generator(kCPU);
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const int64_t T = std::min<int64_t>(block_size, static_cast<int64_t>(rows[0].size()));
    std::vector<int64_t> window;
    for (const auto& row : rows) window.insert(window.end(), row.end() - T, row.end());
    const Tensor logits = model.forward(tensor(window, {B, T}).to(device));  // [B, T, V]
    const Tensor last = logits.select(1, T - 1).to(kCPU).to(DType::Float64).contiguous();  // [B, V]
    const Tensor uniforms = rand({B}, DType::Float64, &gen);
    const int64_t V = last.size(1);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> p(static_cast<size_t>(V));
      const double* l = last.data_ptr<double>() + b * V;
      for (int64_t v = 0; v < V; ++v) p[v] = l[v] / options.temperature;
      if (options.top_k && *options.top_k < V) {
        std::vector<double> sorted = p;
        std::nth_element(sorted.begin(), sorted.begin() + (*options.top_k - 1), sorted.end(), std::greater<>());
        const double kth = sorted[*options.top_k - 1];
        for (double& x : p)
          if (x < kth) x = -INFINITY;
      }
      const double m = *std::max_element(p.begin(), p.end());
      double total = 0;
      for (double& x : p) total += (x = std::exp(x - m));
      // The first token whose cumulative probability passes the uniform (the last possible
      // one if rounding leaves the sum short of it).
      const double u = uniforms.data_ptr<double>()[b] * total;
      int64_t chosen = -1;
      double cumulative = 0;
      for (int64_t v = 0; v < V && (chosen < 0 || u >= cumulative); ++v) {
        if (p[v] == 0) continue;
        cumulative += p[v];
        chosen = v;
      }
      rows[b].push_back(chosen);
    }
  }
  std::vector<int64_t> flat;
  for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
  return tensor(flat, {B, static_cast<int64_t>(rows[0].size())});
}

}  // namespace weft::nn
