// parallel_apply: forward of each replica on its own thread, errors named by replica.
#include "parallel/local/parallel_apply.h"

#include <exception>
#include <functional>

#include "core/error.h"
#include "core/trace.h"
#include "parallel/local/fork_join.h"

namespace weft::parallel {

namespace {

[[noreturn]] void rethrow_named(const std::exception_ptr& error, size_t replica, Device device) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    WEFT_FAIL("in replica ", replica, " on device ", device, ": ", e.what());
  } catch (...) {
    WEFT_FAIL("in replica ", replica, " on device ", device, ": an exception that is not a std::exception");
  }
}

}  // namespace

std::vector<Tensor> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& replicas,
                                   const std::vector<Tensor>& inputs, const std::vector<Device>& devices) {
  WEFT_CHECK(replicas.size() == inputs.size() && replicas.size() == devices.size(), "parallel_apply: ",
             replicas.size(), " replicas, ", inputs.size(), " inputs and ", devices.size(),
             " devices (one of each per replica)");
  std::vector<Tensor> outputs(replicas.size());
  auto run = [&](size_t i) {
    TraceSpan span("forward", devices[i]);
    span.arg("replica", static_cast<int64_t>(i));
    outputs[i] = replicas[i]->forward(inputs[i]);
  };
  if (replicas.size() == 1) {
    try {
      run(0);
    } catch (...) {
      rethrow_named(std::current_exception(), 0, devices[0]);
    }
    return outputs;
  }
  std::vector<std::function<void()>> tasks;
  tasks.reserve(replicas.size());
  for (size_t i = 0; i < replicas.size(); ++i)
    tasks.push_back([&run, i] { run(i); });
  const std::vector<std::exception_ptr> errors = fork_join(tasks);
  for (size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) rethrow_named(errors[i], i, devices[i]);
  return outputs;
}

}  // namespace weft::parallel
