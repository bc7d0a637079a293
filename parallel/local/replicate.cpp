// replicate: one coalesced broadcast of the parameters, one of the buffers, then a
// shallow replica per device.
#include "parallel/local/replicate.h"

#include "core/autograd.h"
#include "core/error.h"
#include "parallel/local/comm.h"
#include "parallel/local/functions.h"

namespace weft::parallel {

namespace {

void check_on(const nn::NamedTensors& tensors, const char* what, const nn::Module& module, Device device) {
  for (const auto& [name, t] : tensors)
    WEFT_CHECK(t.device() == device, "replicate: ", module.type_name(), "'s ", what, " '", name, "' is on ", t.device(),
               " but the module must be on devices[0], ", device, " (move it there first: module->to(", device, "))");
}

std::vector<Tensor> values(const nn::NamedTensors& named) {
  std::vector<Tensor> out;
  out.reserve(named.size());
  for (const auto& [name, t] : named) out.push_back(t);
  return out;
}

}  // namespace

std::vector<std::shared_ptr<nn::Module>> replicate(const nn::Module& module, const std::vector<Device>& devices,
                                                   bool detach) {
  WEFT_CHECK(!devices.empty(), "replicate: no devices given");
  const nn::NamedTensors params = module.named_parameters(), buffers = module.named_buffers();
  check_on(params, "parameter", module, devices[0]);
  check_on(buffers, "buffer", module, devices[0]);
  const auto param_copies = detach || !GradMode::is_enabled() ? comm::broadcast_coalesced(values(params), devices)
                                                              : broadcast(values(params), devices);
  const auto buffer_copies = comm::broadcast_coalesced(values(buffers), devices);
  std::vector<std::shared_ptr<nn::Module>> replicas;
  replicas.reserve(devices.size());
  for (size_t d = 0; d < devices.size(); ++d) replicas.push_back(module.replica(param_copies[d], buffer_copies[d]));
  return replicas;
}

}  // namespace weft::parallel
