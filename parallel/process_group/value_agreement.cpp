// Host values checked across ranks; see value_agreement.h.
#include "parallel/process_group/value_agreement.h"

#include <sstream>

#include "core/error.h"
#include "core/tensor.h"

namespace weft::parallel {

std::vector<ValueRange> value_ranges(ProcessGroup& group, const std::vector<double>& values, Device device) {
  const size_t n = values.size();
  std::vector<ValueRange> ranges(n);
  if (n == 0) return ranges;
  // [v..., -v...] reduced by max gives [max..., -min...].
  std::vector<double> both = values;
  for (double v : values) both.push_back(-v);
  Tensor extremes = tensor(both);
  if (!device.is_cpu()) extremes = extremes.to(device);
  if (group.size() > 1) group.all_reduce(extremes, ReduceOp::Max)->wait();
  const std::vector<double> e = extremes.to(kCPU).to_vector<double>();
  for (size_t i = 0; i < n; ++i) ranges[i] = {.low = -e[n + i], .high = e[i]};
  return ranges;
}

std::optional<std::string> first_disagreement(ProcessGroup& group, const std::vector<NamedValue>& values,
                                              Device device) {
  std::vector<double> numbers;
  for (const NamedValue& v : values) numbers.push_back(v.value);
  const std::vector<ValueRange> ranges = value_ranges(group, numbers, device);
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].agreed()) continue;
    std::ostringstream out;
    out.precision(17);
    out << values[i].name << " = " << values[i].value << " here, from " << ranges[i].low << " to " << ranges[i].high
        << " over the group's " << group.size() << " ranks";
    return out.str();
  }
  return std::nullopt;
}

}  // namespace weft::parallel
