// Messages of device-side error records (see device_error_record.h). Plain C++.
#include "kernels/cuda/device_error_record.h"

#include <sstream>

namespace weft::cuda {

std::string describe_device_error(const DeviceErrorRecord& record) {
  std::ostringstream out;
  const char* op = record.op != nullptr ? record.op : "a CUDA op";
  switch (static_cast<DeviceErrorKind>(record.kind)) {
    case DeviceErrorKind::IndexOutOfRange:
      out << op << ": index " << record.value << " at flat position " << record.position
          << " is out of range (expected 0 <= index < " << record.bound << ")";
      break;
    case DeviceErrorKind::TargetOutOfRange:
      out << op << ": target value " << record.value << " at flat position " << record.position
          << " is out of range for " << record.bound << " classes (expected 0 .. " << record.bound - 1
          << ", or ignore_index " << record.ignore_index << ")";
      break;
    default:
      out << op << ": device-side error of kind " << record.kind << " (value " << record.value << ", position "
          << record.position << ", bound " << record.bound << ")";
      break;
  }
  out << "; found on cuda:" << record.device_index
      << " by the op's kernel and reported at the next synchronisation with the GPU, so ops launched after it ran"
         " (the bad entries read as 0); set WEFT_CUDA_SYNC_LAUNCHES=1 to stop at the op itself";
  return out.str();
}

}  // namespace weft::cuda
