// Generators and the registry of per-device default generators.
#include "core/generator.h"

#include <memory>

namespace weft {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}

uint64_t Generator::seed() const {
  std::lock_guard lock(mutex_);
  return seed_;
}

uint64_t Generator::offset() const {
  std::lock_guard lock(mutex_);
  return offset_;
}

void Generator::set_offset(uint64_t offset) {
  std::lock_guard lock(mutex_);
  offset_ = offset;
}

std::pair<uint64_t, uint64_t> Generator::reserve(uint64_t blocks) {
  std::lock_guard lock(mutex_);
  uint64_t first = offset_;
  offset_ += blocks;
  return {seed_, first};
}

uint64_t device_seed(uint64_t seed, Device device) {
  if (device.index == 0) return seed;
  auto words = philox4x32(seed, static_cast<uint64_t>(device.index));
  return (static_cast<uint64_t>(words[1]) << 32) | words[0];
}

namespace {

struct GeneratorRegistry {
  std::mutex mutex;
  uint64_t seed = Generator::kDefaultSeed;
  std::vector<std::pair<Device, std::unique_ptr<Generator>>> generators;
};

// Never destroyed: random ops may run during static teardown.
GeneratorRegistry& registry() {
  static GeneratorRegistry* r = new GeneratorRegistry;
  return *r;
}

}  // namespace

Generator& default_generator(Device device) {
  GeneratorRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  for (auto& [d, gen] : r.generators)
    if (d == device) return *gen;
  r.generators.emplace_back(device, std::make_unique<Generator>(device_seed(r.seed, device)));
  return *r.generators.back().second;
}

void manual_seed(uint64_t seed) {
  GeneratorRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  r.seed = seed;
  for (auto& [device, gen] : r.generators) gen->manual_seed(device_seed(seed, device));
}

std::vector<std::pair<Device, Generator*>> default_generators() {
  GeneratorRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::pair<Device, Generator*>> out;
  for (auto& [device, gen] : r.generators) out.emplace_back(device, gen.get());
  return out;
}

}  // namespace weft
