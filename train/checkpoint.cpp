// Writing and reading the TrainLoop's checkpoints; see checkpoint.h.
#include "train/checkpoint.h"

#include <charconv>
#include <cstdio>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/generator.h"
#include "nn/safetensors.h"

namespace weft::train {

namespace {

constexpr const char* kFormat = "weft-checkpoint-2";
constexpr const char* kFormat1 = "weft-checkpoint-1";

std::string exact(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}

const std::string& metadata_value(const std::map<std::string, std::string>& meta, const std::string& key,
                                  const std::string& path) {
  auto it = meta.find(key);
  WEFT_CHECK(it != meta.end(), "resume: checkpoint '", path, "' has no '", key, "' entry in its metadata");
  return it->second;
}

double parse_double(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  const std::string& text = metadata_value(meta, key, path);
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  WEFT_CHECK(!text.empty() && *end == '\0', "resume: checkpoint '", path, "': metadata '", key,
             "' is not a number: '", text, "'");
  return v;
}

uint64_t parse_u64(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  const std::string& text = metadata_value(meta, key, path);
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  WEFT_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size(), "resume: checkpoint '", path,
             "': metadata '", key, "' is not a non-negative integer: '", text, "'");
  return v;
}


std::vector<GeneratorState> read_generator_states(const std::map<std::string, std::string>& meta,
                                                  const std::string& format, const std::string& path) {
  if (format == kFormat1) return {{kCPU, parse_u64(meta, "rng.seed", path), parse_u64(meta, "rng.offset", path)}};
  std::vector<GeneratorState> out;
  const std::string prefix = "rng.", suffix = ".seed";
  for (const auto& [key, value] : meta) {
    if (key.size() <= prefix.size() + suffix.size() || key.rfind(prefix, 0) != 0 ||
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string name = key.substr(prefix.size(), key.size() - prefix.size() - suffix.size());
    std::optional<Device> device;
    try {
      device = Device(name);
    } catch (const Error&) {
      WEFT_FAIL("resume: checkpoint '", path, "': metadata '", key, "' names no device ('", name, "')");
    }
    out.push_back({*device, parse_u64(meta, key, path), parse_u64(meta, prefix + name + ".offset", path)});
  }
  return out;
}

}  // namespace

bool is_checkpoint_metadata(const std::string& key) {
  for (const char* exact : {"format", "epoch", "epoch_samples", "epoch_loss_sum", "epoch_batches", "epoch_order",
                            "scheduler"})
    if (key == exact) return true;
  for (const char* prefix : {"rng.", "optimizer.", "scheduler.", "strategy."})
    if (key.rfind(prefix, 0) == 0) return true;
  return false;
}

void write_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : checkpoint.model) tensors.emplace_back("model." + name, t);
  for (const auto& [name, t] : checkpoint.optimizer.tensors) tensors.emplace_back("optimizer." + name, t);
  std::map<std::string, std::string> meta{{"format", kFormat},
                                          {"epoch", std::to_string(checkpoint.epoch)},
                                          {"epoch_samples", std::to_string(checkpoint.epoch_samples)},
                                          {"epoch_loss_sum", exact(checkpoint.epoch_loss_sum)},
                                          {"epoch_batches", std::to_string(checkpoint.epoch_batches)}};
  if (!checkpoint.epoch_order.empty()) meta["epoch_order"] = checkpoint.epoch_order;
  for (const GeneratorState& g : checkpoint.generators) {
    meta["rng." + g.device.str() + ".seed"] = std::to_string(g.seed);
    meta["rng." + g.device.str() + ".offset"] = std::to_string(g.offset);
  }
  for (const auto& [name, v] : checkpoint.optimizer.scalars) meta["optimizer." + name] = exact(v);
  if (checkpoint.scheduler) {
    meta["scheduler"] = *checkpoint.scheduler;
    for (const auto& [name, v] : checkpoint.scheduler_state) meta["scheduler." + name] = exact(v);
  }
  for (const auto& [name, v] : checkpoint.strategy_state) meta["strategy." + name] = exact(v);
  meta.insert(checkpoint.metadata.begin(), checkpoint.metadata.end());
  save_safetensors(path, tensors, meta);
}

Checkpoint read_checkpoint(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  auto format = file.metadata.find("format");
  WEFT_CHECK(format != file.metadata.end() && (format->second == kFormat || format->second == kFormat1), "resume: '",
             path, "' is not a weft checkpoint (metadata 'format' should be '", kFormat, "')");
  Checkpoint c;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind("model.", 0) == 0) c.model.emplace_back(name.substr(6), t);
    else if (name.rfind("optimizer.", 0) == 0) c.optimizer.tensors.emplace_back(name.substr(10), t);
    else WEFT_FAIL("resume: '", path, "' holds an unexpected tensor '", name, "'");
  }
  for (auto& [key, value] : file.metadata) {
    if (key.rfind("optimizer.", 0) == 0) c.optimizer.scalars[key.substr(10)] = parse_double(file.metadata, key, path);
    if (key.rfind("scheduler.", 0) == 0) c.scheduler_state[key.substr(10)] = parse_double(file.metadata, key, path);
    if (key.rfind("strategy.", 0) == 0) c.strategy_state[key.substr(9)] = parse_double(file.metadata, key, path);
  }
  c.generators = read_generator_states(file.metadata, format->second, path);
  const uint64_t epoch = parse_u64(file.metadata, "epoch", path);
  WEFT_CHECK(epoch <= static_cast<uint64_t>(std::numeric_limits<int>::max()), "resume: checkpoint '", path,
             "': metadata 'epoch' is ", epoch, ", more epochs than a run can have");
  c.epoch = static_cast<int>(epoch);
  // Absent (a checkpoint written before mid-epoch checkpoints existed): an epoch's end.
  auto count = [&](const std::string& key) -> int64_t {
    if (!file.metadata.count(key)) return 0;
    const uint64_t v = parse_u64(file.metadata, key, path);
    WEFT_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "resume: checkpoint '", path,
               "': metadata '", key, "' is ", v, ", out of range");
    return static_cast<int64_t>(v);
  };
  c.epoch_samples = count("epoch_samples");
  c.epoch_batches = count("epoch_batches");
  c.epoch_loss_sum = file.metadata.count("epoch_loss_sum") ? parse_double(file.metadata, "epoch_loss_sum", path) : 0.0;
  if (auto it = file.metadata.find("epoch_order"); it != file.metadata.end()) c.epoch_order = it->second;
  if (auto it = file.metadata.find("scheduler"); it != file.metadata.end()) c.scheduler = it->second;
  for (auto& [key, value] : file.metadata)
    if (!is_checkpoint_metadata(key)) c.metadata.emplace(key, value);
  return c;
}

void check_resumable(const Checkpoint& checkpoint, const std::string& path, const optim::LRScheduler* scheduler,
                     const Strategy& strategy) {
  if (scheduler) {
    const std::string& mine = scheduler->name();
    WEFT_CHECK(checkpoint.scheduler.has_value(), "resume: checkpoint '", path, "' was written without a "
               "learning-rate scheduler, but this loop has a ", mine, " (its schedule would restart after epoch ",
               checkpoint.epoch, "); resume without a scheduler, or start a new run");
    WEFT_CHECK(*checkpoint.scheduler == mine, "resume: checkpoint '", path, "' was written with a ",
               *checkpoint.scheduler, " scheduler, but this loop has a ", mine);
    try {
      scheduler->check_state_dict(checkpoint.scheduler_state);
    } catch (const Error& e) {
      WEFT_FAIL("resume: checkpoint '", path, "': ", e.what());
    }
  } else {
    WEFT_CHECK(!checkpoint.scheduler && checkpoint.scheduler_state.empty(), "resume: checkpoint '", path,
               "' holds the state of a ", checkpoint.scheduler.value_or(""), " learning-rate scheduler, but this "
               "loop has none (TrainLoopOptions::scheduler): its learning rate would stay where the schedule left it");
  }
  try {
    strategy.check_state_dict(checkpoint.strategy_state);
  } catch (const Error& e) {
    WEFT_FAIL("resume: checkpoint '", path, "': ", e.what());
  }
}

void restore_checkpoint(const Checkpoint& checkpoint, nn::Module& model, optim::Optimizer& optimizer,
                        Strategy& strategy, optim::LRScheduler* scheduler) {
  model.load_state_dict(checkpoint.model);
  optimizer.load_state_dict(checkpoint.optimizer);
  strategy.load_state_dict(checkpoint.strategy_state);
  if (scheduler) scheduler->load_state_dict(checkpoint.scheduler_state);
  for (const GeneratorState& g : checkpoint.generators) {
    default_generator(g.device).manual_seed(g.seed);
    default_generator(g.device).set_offset(g.offset);
  }
}

}  // namespace weft::train
