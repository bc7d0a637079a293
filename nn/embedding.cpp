// Embedding: the table and its lookup.
#include "nn/embedding.h"

#include "kernels/index_ops.h"
#include "nn/init.h"

namespace weft::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, const TensorOptions& options, Generator* gen)
    : Cloneable("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  WEFT_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: num_embeddings and embedding_dim must be positive, "
             "got ", num_embeddings, " and ", embedding_dim);
  WEFT_CHECK(is_floating(options.dtype), "Embedding: the table needs a floating dtype, got ", options.dtype);
  init::normal_(register_parameter("weight", empty({num_embeddings, embedding_dim},
                                                   TensorOptions(options.dtype, options.device))),
                0.0, 1.0, gen);
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(param("weight"), indices); }

std::string Embedding::extra_repr() const {
  return std::to_string(num_embeddings_) + ", " + std::to_string(embedding_dim_);
}

}  // namespace weft::nn
