// DataParallel: scatter, replicate, parallel_apply, gather; see data_parallel.h.
#include "parallel/local/data_parallel.h"

#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/trace.h"
#include "parallel/local/functions.h"
#include "parallel/local/parallel_apply.h"
#include "parallel/local/replicate.h"

namespace weft::parallel {

namespace {

std::vector<Device> default_devices(const nn::Module& module) {
  if (!cuda_available()) return {module.device()};
  std::vector<Device> all;
  for (int i = 0; i < cuda_device_count(); ++i) all.push_back(Device::cuda(i));
  return all;
}

void check_device_list(const std::vector<Device>& devices, const char* who) {
  WEFT_CHECK(!devices.empty(), who, ": no devices given");
  for (size_t i = 0; i < devices.size(); ++i) {
    WEFT_CHECK(devices[i].type == devices[0].type, who, ": devices must all be CPU devices or all CUDA devices, got ",
               devices[0], " and ", devices[i]);
    for (size_t j = 0; j < i; ++j) WEFT_CHECK(devices[j] != devices[i], who, ": device ", devices[i], " is given twice");
  }
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> device_ids,
                           std::optional<Device> output_device, int64_t dim)
    : Cloneable("DataParallel"), device_ids_(std::move(device_ids)), dim_(dim) {
  WEFT_CHECK(module != nullptr, "DataParallel: the module is null");
  if (device_ids_.empty()) device_ids_ = default_devices(*module);
  check_device_list(device_ids_, "DataParallel");
  output_device_ = output_device.value_or(device_ids_[0]);
  register_module("module", std::move(module));
}

Tensor DataParallel::forward(const Tensor& input) {
  WEFT_CHECK(input.defined(), "DataParallel: the input is undefined");
  nn::Module& wrapped = module();
  if (device_ids_.size() == 1) {
    const Device device = device_ids_[0];
    for (const auto& [name, t] : wrapped.named_parameters())
      WEFT_CHECK(t.device() == device, "DataParallel: parameter '", name, "' is on ", t.device(),
                 " but the module must be on device_ids[0], ", device);
    return wrapped.forward(input.to(device));
  }
  WEFT_CHECK(input.dim() > 0, "DataParallel: cannot split a 0-d input across devices");
  std::vector<Tensor> chunks;
  {
    TraceSpan span("scatter", input.device());
    chunks = scatter(input, device_ids_, {}, dim_);
  }
  const std::vector<Device> used(device_ids_.begin(), device_ids_.begin() + static_cast<std::ptrdiff_t>(chunks.size()));
  std::vector<std::shared_ptr<nn::Module>> replicas;
  {
    TraceSpan span("replicate", used[0]);
    replicas = replicate(wrapped, used, !GradMode::is_enabled());
  }
  std::vector<Tensor> outputs = parallel_apply(replicas, chunks, used);
  TraceSpan span("gather", output_device_);
  return gather(outputs, output_device_, dim_);
}

std::string DataParallel::extra_repr() const {
  std::ostringstream out;
  out << "device_ids=[";
  for (size_t i = 0; i < device_ids_.size(); ++i) out << (i ? ", " : "") << device_ids_[i];
  out << "], output_device=" << output_device_ << ", dim=" << dim_;
  return out.str();
}

std::vector<Device> parse_device_list(const std::string& text) {
  std::vector<Device> devices;
  std::istringstream in(text);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    const size_t begin = entry.find_first_not_of(' '), end = entry.find_last_not_of(' ');
    entry = begin == std::string::npos ? "" : entry.substr(begin, end - begin + 1);
    WEFT_CHECK(!entry.empty(), "device list '", text, "': entry ", devices.size(), " is empty");
    try {
      devices.emplace_back(entry);
    } catch (const Error& e) {
      WEFT_FAIL("device list '", text, "': entry ", devices.size(), ": ", e.what());
    }
  }
  check_device_list(devices, ("device list '" + text + "'").c_str());
  return devices;
}

}  // namespace weft::parallel
