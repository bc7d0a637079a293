// What the teaching ladders' mains and bench/kernels share: finding a GPU, random inputs, RAII
// device buffers for the standalone mains, kernel timing with CUDA events, and the --json file
// of a ladder's timing table.
//
// Timing enqueues every repetition back to back, with one event between consecutive
// launches, and waits only at the end: the host runs ahead of the GPU, so a launch's
// host cost (or a weft op's dispatch and allocation) is hidden behind the previous
// kernel and the events measure GPU time. The median of the per-launch times is reported.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"

namespace weft::dev {

// `count` floats uniform in [-1, 1) from std::mt19937 seeded with `seed`.
inline std::vector<float> random_uniform(int64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> values(static_cast<size_t>(count));
  for (auto& x : values) x = dist(gen);
  return values;
}

// Whether a CUDA GPU is visible; otherwise `reason` says why (no driver, no device).
inline bool gpu_present(std::string& reason) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    reason = cudaGetErrorString(status);
    cudaGetLastError();  // clear the error so that it does not surface at a later check
    return false;
  }
  if (count == 0) reason = "no device";
  return count > 0;
}

// cudaMalloc'd memory for `count` elements of T, freed on destruction.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0) WEFT_CUDA_CHECK(cudaMalloc(&data_, count * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);  // a destructor never throws: an error here is left unreported
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return data_; }
  size_t size() const { return count_; }

 private:
  T* data_ = nullptr;
  size_t count_;
};

// Host <-> device copies on the kernels' stream, so that they are ordered with the launches;
// download waits for its copy.
inline void upload(float* dst, const std::vector<float>& src, cudaStream_t stream) {
  WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
}

inline std::vector<float> download(const float* src, size_t count, cudaStream_t stream) {
  std::vector<float> dst(count);
  WEFT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return dst;
}

// Median GPU time in milliseconds of `launch()` on `stream`, after `warmup` untimed calls.
template <class Launch>
double median_ms(cudaStream_t stream, int warmup, int reps, Launch&& launch) {
  for (int i = 0; i < warmup; ++i) launch();
  reps = std::max(reps, 1);
  std::vector<cudaEvent_t> events(reps + 1);
  for (auto& event : events) WEFT_CUDA_CHECK(cudaEventCreate(&event));
  WEFT_CUDA_CHECK(cudaEventRecord(events[0], stream));
  for (int r = 0; r < reps; ++r) {
    launch();
    WEFT_CUDA_CHECK(cudaEventRecord(events[r + 1], stream));
  }
  WEFT_CUDA_CHECK(cudaEventSynchronize(events[reps]));
  std::vector<double> times(reps);
  for (int r = 0; r < reps; ++r) {
    float ms = 0;
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, events[r], events[r + 1]));
    times[r] = ms;
  }
  for (auto& event : events) WEFT_CUDA_CHECK(cudaEventDestroy(event));
  std::sort(times.begin(), times.end());
  return times[reps / 2];
}

// One row of a ladder's timing table: its median time, its rate in the table's unit, that
// rate as a share of the table's limit (cuBLAS, the copy bandwidth) and the elements out of
// tolerance in the same run.
struct TimingRow {
  std::string variant;
  double ms = 0;
  double rate = 0;
  double percent_of_limit = 0;
  int64_t wrong = 0;
};

// Writes a ladder's run as JSON for `--json FILE`, shaped like bench/kernels' file (a header,
// then one object per row) so that one reader takes both. `size` says what was timed;
// `validation_wrong` counts the wrong results of the validation pass before the timing.
inline bool write_timing_json(const std::string& path, const std::string& benchmark, const std::string& device,
                              const std::string& size, const std::string& unit, const std::string& limit, int reps,
                              int64_t validation_wrong, const std::vector<TimingRow>& rows) {
  auto quoted = [](const std::string& text) {
    std::string out = "\"";
    for (char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  };
  std::ofstream out(path);
  out.precision(12);
  out << "{\n  \"benchmark\": " << quoted(benchmark) << ",\n  \"device\": " << quoted(device)
      << ",\n  \"size\": " << quoted(size) << ",\n  \"unit\": " << quoted(unit) << ",\n  \"limit\": " << quoted(limit)
      << ",\n  \"reps\": " << reps << ",\n  \"validation_wrong\": " << validation_wrong << ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const TimingRow& r = rows[i];
    out << "    {\"variant\": " << quoted(r.variant) << ", \"ms\": " << r.ms << ", \"rate\": " << r.rate
        << ", \"percent_of_limit\": " << r.percent_of_limit << ", \"wrong\": " << r.wrong << "}"
        << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  out << "  ]\n}\n";
  return static_cast<bool>(out);
}

}  // namespace weft::dev
