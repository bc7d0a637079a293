// Text between ranks: lengths all-reduced, padded bytes all-gathered.
#include "parallel/process_group/text_collectives.h"

#include <algorithm>

#include "core/error.h"
#include "core/tensor.h"

namespace weft::parallel {

std::vector<std::string> all_gather_text(ProcessGroup& group, const std::string& text, Device device) {
  WEFT_CHECK(text.find('\0') == std::string::npos, "all_gather_text: the text holds a NUL byte");
  Tensor length = tensor(std::vector<int64_t>{static_cast<int64_t>(text.size())}).to(device);
  group.all_reduce(length, ReduceOp::Max)->wait();
  const int64_t longest = length.item<int64_t>();
  if (longest == 0) return std::vector<std::string>(static_cast<size_t>(group.size()));
  std::vector<uint8_t> bytes(static_cast<size_t>(longest), 0);
  std::copy(text.begin(), text.end(), bytes.begin());
  Tensor local = tensor(bytes, Shape{longest}).to(device);
  std::vector<Tensor> all;
  for (int r = 0; r < group.size(); ++r) all.push_back(zeros({longest}, TensorOptions(DType::UInt8, device)));
  group.all_gather(all, local)->wait();
  std::vector<std::string> out;
  for (const Tensor& t : all) {
    std::string received;
    for (uint8_t v : t.to_vector<uint8_t>())
      if (v != 0) received += static_cast<char>(v);
    out.push_back(std::move(received));
  }
  return out;
}

std::optional<std::string> first_difference_across_ranks(ProcessGroup& group, const std::vector<std::string>& lines,
                                                         Device device) {
  std::string mine;
  for (const std::string& line : lines) {
    WEFT_CHECK(line.find('\n') == std::string::npos, "first_difference_across_ranks: a line holds a newline");
    mine += line + "\n";
  }
  std::vector<std::vector<std::string>> ranks;
  for (const std::string& text : all_gather_text(group, mine, device)) {
    std::vector<std::string> split;
    size_t start = 0;
    for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
      split.push_back(text.substr(start, end - start));
    ranks.push_back(std::move(split));
  }
  const auto& a = ranks[0];
  for (size_t r = 1; r < ranks.size(); ++r) {
    const auto& b = ranks[r];
    for (size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
      if (k < a.size() && k < b.size() && a[k] == b[k]) continue;
      return "on rank 0, " + (k < a.size() ? a[k] : std::string("there is nothing more")) + "; on rank " +
             std::to_string(r) + ", " + (k < b.size() ? b[k] : std::string("there is nothing more"));
    }
  }
  return std::nullopt;
}

}  // namespace weft::parallel
