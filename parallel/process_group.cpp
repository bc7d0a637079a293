// The names of the reduce ops (for messages and the debug check).
#include "parallel/process_group.h"

namespace weft::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
  }
  return "unknown";
}

}  // namespace weft::parallel
