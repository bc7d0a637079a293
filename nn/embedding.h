// Embedding (torch.nn.Embedding): a lookup table of num_embeddings vectors of size
// embedding_dim, indexed by int64 tensors of any shape.
#pragma once

#include <cstdint>
#include <string>

#include "core/generator.h"
#include "nn/module.h"

namespace weft::nn {

// Parameter "weight" [num_embeddings, embedding_dim], initialised N(0, 1) from `gen` (the
// default generator when null), as PyTorch's. forward(indices) -> [..., embedding_dim]; an
// index outside [0, num_embeddings) is an error naming it (kernels/index_ops.h).
class Embedding : public Cloneable<Embedding> {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, const TensorOptions& options = {},
            Generator* gen = nullptr);

  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;

  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }

 private:
  int64_t num_embeddings_;
  int64_t embedding_dim_;
};

}  // namespace weft::nn
