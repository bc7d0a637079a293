// bench/allreduce without NCCL: no direct reference; see nccl_direct.h.
#include <stdexcept>

#include "nccl_direct.h"

namespace weft::bench {

bool direct_nccl_built() { return false; }

struct DirectNccl::State {};

DirectNccl::DirectNccl(parallel::Store&, int, int, int, int64_t) {
  throw std::runtime_error("direct NCCL: weft was built without NCCL");
}
DirectNccl::~DirectNccl() = default;
DirectResult DirectNccl::all_reduce(int64_t, DType, int) { return {}; }

}  // namespace weft::bench
