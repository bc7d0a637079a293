// gather_optimizer_state: the descriptions, then the tensors; see optimizer_state_gather.h.
#include "parallel/optim/optimizer_state_gather.h"

#include <algorithm>
#include <charconv>
#include <sstream>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "parallel/process_group/text_collectives.h"

namespace weft::parallel {

namespace {

// One entry of a rank's state, as its description line says it:
//   "tensor <DType as a number> <d0,d1,...> <key>"   or   "scalar <value> <key>"
struct Entry {
  bool is_tensor = false;
  DType dtype = DType::Float32;
  Shape shape;
  double value = 0;
  std::string key;
  int rank = 0;
};

std::string exact(double v) {
  char buffer[40];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
  return std::string(buffer, end);
}

std::string describe_tensor(const std::string& key, const Tensor& t) {
  std::ostringstream out;
  out << "tensor " << static_cast<int>(t.dtype()) << " ";
  if (t.dim() == 0) out << "-";
  for (int64_t k = 0; k < t.dim(); ++k) out << (k ? "," : "") << t.shape()[k];
  out << " " << key;
  return out.str();
}

Entry parse_entry(const std::string& line, int rank, const std::string& who) {
  std::istringstream in(line);
  std::string kind, first, second;
  in >> kind >> first;
  Entry e;
  e.rank = rank;
  if (kind == "tensor") {
    in >> second;
    e.is_tensor = true;
    e.dtype = static_cast<DType>(std::stoi(first));
    std::vector<int64_t> dims;
    if (second != "-") {
      std::istringstream d(second);
      for (std::string part; std::getline(d, part, ',');) dims.push_back(std::stoll(part));
    }
    e.shape = Shape(dims);
  } else {
    WEFT_CHECK(kind == "scalar", who, ": malformed state description from rank ", rank, ": '", line, "'");
    std::from_chars(first.data(), first.data() + first.size(), e.value);
  }
  in.get();  // the space before the key, which may itself hold spaces
  std::getline(in, e.key);
  return e;
}

std::string destination(std::optional<int> to) { return to ? "to " + std::to_string(*to) : "to every rank"; }

}  // namespace

std::optional<std::pair<size_t, std::string>> split_state_key(const std::string& key) {
  const size_t dot = key.find('.');
  if (dot == 0 || dot == std::string::npos || dot > 9) return std::nullopt;
  size_t index = 0;
  auto [end, ec] = std::from_chars(key.data(), key.data() + dot, index);
  if (ec != std::errc() || end != key.data() + dot) return std::nullopt;
  return std::make_pair(index, key.substr(dot + 1));
}

optim::OptimizerState gather_optimizer_state(ProcessGroup& group, const optim::OptimizerState& mine,
                                             std::optional<int> to, Device device, const std::string& who,
                                             const std::string& problem) {
  NoGradGuard no_grad;
  const int me = group.rank();
  // 1. Every rank's entries, where they go and its own problem, described to every rank.
  std::string description = destination(to) + "\n";
  std::string trouble = problem;
  for (const auto& [key, t] : mine.tensors) {
    if (split_state_key(key)) description += describe_tensor(key, t) + "\n";
    else if (trouble.empty()) trouble = "state tensor '" + key + "' does not name a parameter ('<index>.<name>')";
  }
  if (!trouble.empty()) description += "error " + trouble + "\n";
  for (const auto& [key, value] : mine.scalars) description += "scalar " + exact(value) + " " + key + "\n";
  std::vector<Entry> tensors, scalars;
  const std::vector<std::string> texts = all_gather_text(group, description, device);
  for (int r = 0; r < group.size(); ++r) {
    std::istringstream in(texts[static_cast<size_t>(r)]);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("to ", 0) == 0) {
        WEFT_CHECK(line == destination(to), who, ": rank ", r, " gathers the state ", line.substr(3), ", this rank (",
                   me, ") ", destination(to), " (every rank must name the same rank)");
        continue;
      }
      WEFT_CHECK(line.rfind("error ", 0) != 0, who, ": on rank ", r, ", ", line.substr(6));
      Entry e = parse_entry(line, r, who);
      (e.is_tensor ? tensors : scalars).push_back(std::move(e));
    }
  }
  // 2. The tensors, in the order of their parameters, each from its rank to `to` (or to all),
  // kept on the CPU. Every rank walks one list and waits for each message, so the tags 0, 1,
  // ... of the sends meet no other call's messages.
  std::stable_sort(tensors.begin(), tensors.end(), [](const Entry& a, const Entry& b) {
    return split_state_key(a.key)->first < split_state_key(b.key)->first;
  });
  const bool receives = !to || *to == me;
  optim::OptimizerState whole;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Entry& e = tensors[k];
    const Tensor* own = nullptr;
    if (e.rank == me) {
      auto it = std::find_if(mine.tensors.begin(), mine.tensors.end(), [&](const auto& t) { return t.first == e.key; });
      WEFT_CHECK(it != mine.tensors.end(), who, ": lost state tensor '", e.key, "'");
      own = &it->second;
    }
    if (!to) {
      Tensor message = own ? own->to(device).contiguous() : empty(e.shape, TensorOptions(e.dtype, device));
      group.broadcast(message, e.rank)->wait();
      whole.tensors.emplace_back(e.key, message.to(kCPU).clone());
    } else if (own) {
      if (*to == me) whole.tensors.emplace_back(e.key, own->to(kCPU).clone());
      else group.send(own->to(device).contiguous(), *to, static_cast<int>(k))->wait();
    } else if (*to == me) {
      Tensor received = empty(e.shape, TensorOptions(e.dtype, device));
      group.recv(received, e.rank, static_cast<int>(k))->wait();
      whole.tensors.emplace_back(e.key, received.to(kCPU));
    }
  }
  if (!receives) return {};
  for (const Entry& e : scalars) whole.scalars[e.key] = e.value;
  return whole;
}

}  // namespace weft::parallel
