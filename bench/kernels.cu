// kernels: speed and correctness of weft's CUDA kernels and of the teaching ladders, each
// against the limit measured in the same run.
//
// Memory-bound ops (elementwise, reductions, softmax, cross-entropy) are reported in GB/s
// of bytes read + written (each input read once, each output written once: the least
// traffic the op needs) as a fraction of device-to-device copy bandwidth (cudaMemcpyAsync
// D2D, also read + written) at the same size. Matrix products and the convolution are
// reported in TFLOP/s as a fraction of raw cublasSgemm (float32, no TF32) at the matmul
// size. weft ops are called through the public Tensor API on cuda:0, so what is timed
// includes dispatch and allocation from the caching allocator, hidden behind the GPU
// work when the host runs ahead (kernels/dev/harness.cuh). Each result is checked in the
// same run against a CPU computation (weft's CPU ops, or float64) and the count of
// elements out of tolerance is printed as #wrong, as nccl-tests does.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <string>
#include <utility>
#include <vector>

#include <weft.h>

#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"
#include "kernels/dev/harness.cuh"
#include "kernels/dev/reduce_sum.cuh"
#include "kernels/dev/sgemm.cuh"

using namespace weft;

namespace {

constexpr int kWarmup = 3;

struct Row {
  Row(std::string op_, std::string impl_, std::string shape_, double bytes_, double flops_ = 0)
      : op(std::move(op_)), impl(std::move(impl_)), shape(std::move(shape_)), bytes(bytes_), flops(flops_) {}

  std::string op, impl, shape;
  double bytes = 0;  // read + written per call (memory-bound rows)
  double flops = 0;  // per call (compute-bound rows)
  double ms = 0;
  double limit_rate = 0;  // GB/s or TFLOP/s of the limit this row is compared with
  std::string limit;
  int64_t wrong = 0;  // elements out of tolerance; -1 when the op failed
  std::string error;

  bool compute() const { return flops > 0; }
  double rate() const { return compute() ? flops / (ms * 1e-3) / 1e12 : bytes / (ms * 1e-3) / 1e9; }
  const char* unit() const { return compute() ? "TFLOP/s" : "GB/s"; }
};

// |got - ref| <= atol + rtol * scale element by element, where scale is |ref| or, when
// given, a tensor of ref's shape (a sum of absolute values for sums and products, whose
// rounding error grows with it). NaN is always wrong; a shape mismatch makes every
// element wrong.
int64_t count_wrong(const Tensor& got, const Tensor& ref, double atol, double rtol, const Tensor& scale = Tensor()) {
  Tensor g = got.to(kCPU).to(DType::Float64).contiguous();
  Tensor r = ref.to(kCPU).to(DType::Float64).contiguous();
  if (!(g.shape() == r.shape())) return std::max<int64_t>({g.numel(), r.numel(), 1});
  Tensor s = scale.defined() ? scale.to(kCPU).to(DType::Float64).contiguous() : abs(r);
  const double* gp = g.data_ptr<double>();
  const double* rp = r.data_ptr<double>();
  const double* sp = s.data_ptr<double>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < g.numel(); ++i)
    if (!(std::fabs(gp[i] - rp[i]) <= atol + rtol * sp[i])) ++wrong;
  return wrong;
}

// "16384x1024": compact enough for the table's shape column.
std::string shape_str(const Shape& shape) {
  std::string out;
  for (int64_t d : shape) {
    if (!out.empty()) out += 'x';
    out += std::to_string(d);  // not "x" + to_string(d): GCC 12 warns about its own inlined copy (-Wrestrict)
  }
  return out;
}

// NaN bits in every float, so that an output a kernel fails to write is counted wrong.
void poison(const Tensor& t, cudaStream_t stream) {
  WEFT_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0xff, t.nbytes(), stream));
}

class Bench {
 public:
  Bench(Device device, int reps) : device_(device), stream_(cuda::current_native_stream(device)), reps_(reps) {}

  cudaStream_t stream() const { return stream_; }

  // Median GPU time of `call` on weft's stream of the device.
  double time(const std::function<void()>& call) { return dev::median_ms(stream_, kWarmup, reps_, call); }

  void header() const {
    std::printf("# %-14s %-13s %-30s %9s %9s %10s %10s %-8s %8s %-13s %7s\n", "op", "impl", "shape", "MiB", "GFLOP",
                "time", "rate", "unit", "of limit", "limit", "#wrong");
    std::printf("# %-14s %-13s %-30s %9s %9s %10s %10s %-8s %8s %-13s %7s\n", "", "", "", "(r+w)", "", "(ms)", "", "",
                "(%)", "", "");
  }

  // Times, then checks, one row; an exception from either is reported in the row and the
  // run goes on (exit status 1 at the end).
  void add(Row row, const std::function<double()>& time_it, const std::function<int64_t()>& check) {
    try {
      row.ms = time_it();
      row.wrong = check();
    } catch (const std::exception& e) {
      row.wrong = -1;
      row.error = e.what();
    }
    print(row);
    rows_.push_back(row);
  }

  bool all_correct() const {
    for (const Row& row : rows_)
      if (row.wrong != 0) return false;
    return true;
  }

  bool write_json(const std::string& path, const std::string& device_name, bool quick) const {
    std::ofstream out(path);
    out << std::setprecision(12);
    out << "{\n  \"benchmark\": \"kernels\",\n  \"device\": \"" << escape(device_name) << "\",\n  \"quick\": "
        << (quick ? "true" : "false") << ",\n  \"reps\": " << reps_ << ",\n  \"rows\": [\n";
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      const bool ok = r.wrong >= 0;
      out << "    {\"op\": \"" << escape(r.op) << "\", \"impl\": \"" << escape(r.impl) << "\", \"shape\": \""
          << escape(r.shape) << "\", \"bytes\": " << r.bytes << ", \"flops\": " << r.flops
          << ", \"ms\": " << (ok ? r.ms : 0) << ", \"rate\": " << (ok ? r.rate() : 0) << ", \"unit\": \"" << r.unit()
          << "\", \"limit\": \"" << escape(r.limit) << "\", \"limit_rate\": " << r.limit_rate
          << ", \"percent_of_limit\": " << (ok && r.limit_rate > 0 ? 100 * r.rate() / r.limit_rate : 0)
          << ", \"wrong\": " << r.wrong;
      if (!ok) out << ", \"error\": \"" << escape(r.error) << "\"";
      out << "}" << (i + 1 < rows_.size() ? ",\n" : "\n");
    }
    out << "  ]\n}\n";
    return static_cast<bool>(out);
  }

 private:
  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    return out;
  }

  void print(const Row& r) const {
    char mib[32] = "-", gflop[32] = "-";
    if (r.bytes > 0) std::snprintf(mib, sizeof mib, "%.1f", r.bytes / (1 << 20));
    if (r.flops > 0) std::snprintf(gflop, sizeof gflop, "%.1f", r.flops / 1e9);
    if (r.wrong < 0) {
      std::printf("  %-14s %-13s %-30s %9s %9s  FAILED: %s\n", r.op.c_str(), r.impl.c_str(), r.shape.c_str(), mib,
                  gflop, r.error.c_str());
    } else {
      char percent[32] = "-";
      if (r.limit_rate > 0) std::snprintf(percent, sizeof percent, "%.1f", 100 * r.rate() / r.limit_rate);
      std::printf("  %-14s %-13s %-30s %9s %9s %10.4f %10.2f %-8s %8s %-13s %7lld\n", r.op.c_str(), r.impl.c_str(),
                  r.shape.c_str(), mib, gflop, r.ms, r.rate(), r.unit(), percent, r.limit.c_str(),
                  static_cast<long long>(r.wrong));
    }
    std::fflush(stdout);
  }

  Device device_;
  cudaStream_t stream_;
  int reps_;
  std::vector<Row> rows_;
};

// Memory-bound rows at one size: n float32 elements, also viewed as [n / 1024, 1024].
void bench_memory_bound(Bench& bench, Device gpu, int64_t n) {
  constexpr int64_t kCols = 1024;
  const int64_t rows = n / kCols;
  const double f = sizeof(float);
  const Shape flat{n}, mat{rows, kCols};
  const std::string flat_s = shape_str(flat), mat_s = shape_str(mat);

  Tensor xc = randn(flat), yc = randn(flat), bias_c = randn({kCols});
  Tensor target_c = randint(0, kCols, {rows});
  Tensor x = xc.to(gpu), y = yc.to(gpu), bias = bias_c.to(gpu), target = target_c.to(gpu);
  Tensor x2 = x.view(mat), x2c = xc.view(mat);
  Tensor out;

  // The limit: a device-to-device copy of the same bytes, counted read + written.
  Row copy{"copy", "cudaMemcpy", flat_s, 2 * n * f};
  Tensor dst = empty(flat, TensorOptions(DType::Float32, gpu));
  double copy_ms = 0;
  bench.add(
      copy,
      [&] {
        poison(dst, bench.stream());
        copy_ms = bench.time([&] {
          WEFT_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), x.raw_data(), n * sizeof(float), cudaMemcpyDeviceToDevice,
                                          bench.stream()));
        });
        return copy_ms;
      },
      [&] { return count_wrong(dst, xc, 0, 0); });
  const double copy_gbs = copy_ms > 0 ? 2 * n * f / (copy_ms * 1e-3) / 1e9 : 0;

  auto weft_row = [&](const char* op, const std::string& shape, double bytes, const std::function<Tensor()>& call,
                      const std::function<int64_t(const Tensor&)>& check) {
    Row row{op, "weft", shape, bytes};
    row.limit = "d2d copy";
    row.limit_rate = copy_gbs;
    bench.add(
        row, [&] { return bench.time([&] { out = call(); }); }, [&] { return check(out); });
    out = Tensor();
  };

  // Elementwise: float32 add, scalar multiply and relu are correctly rounded on both
  // devices, so they must agree exactly (a 1e-7 relative slack for a contracted op).
  weft_row("add", flat_s, 3 * n * f, [&] { return add(x, y); },
           [&](const Tensor& o) { return count_wrong(o, add(xc, yc), 0, 1e-7); });
  weft_row("mul_scalar", flat_s, 2 * n * f, [&] { return mul(x, 2.5); },
           [&](const Tensor& o) { return count_wrong(o, mul(xc, 2.5), 0, 1e-7); });
  weft_row("relu", flat_s, 2 * n * f, [&] { return relu(x); },
           [&](const Tensor& o) { return count_wrong(o, relu(xc), 0, 0); });
  weft_row("add_bcast", mat_s + "+1024", (2 * n + kCols) * f, [&] { return add(x2, bias); },
           [&](const Tensor& o) { return count_wrong(o, add(x2c, bias_c), 0, 1e-7); });

  // Reductions: float32 sums carry rounding error relative to the sum of |x|, not to the
  // result (which may cancel to ~0); 1e-5 of it is far above a float32 tree's error.
  const Tensor abs_x = abs(xc);
  weft_row("sum_all", flat_s, n * f + f, [&] { return sum(x); },
           [&](const Tensor& o) { return count_wrong(o, sum(xc), 0, 1e-5, sum(abs_x)); });
  weft_row("sum_rows", mat_s + " dim1", (n + rows) * f, [&] { return sum(x2, {1}); },
           [&](const Tensor& o) { return count_wrong(o, sum(x2c, {1}), 0, 1e-5, sum(abs_x.view(mat), {1})); });
  weft_row("sum_cols", mat_s + " dim0", (n + kCols) * f, [&] { return sum(x2, {0}); },
           [&](const Tensor& o) { return count_wrong(o, sum(x2c, {0}), 0, 1e-5, sum(abs_x.view(mat), {0})); });

  // Softmax values are ~1e-3 here; exp may differ by a few ulp between devices.
  weft_row("softmax_rows", mat_s, 2 * n * f, [&] { return softmax(x2, 1); },
           [&](const Tensor& o) { return count_wrong(o, softmax(x2c, 1), 1e-9, 1e-5); });
  weft_row("cross_entropy", mat_s, n * f + rows * 8 + f, [&] { return cross_entropy(x2, target); },
           [&](const Tensor& o) { return count_wrong(o, cross_entropy(x2c, target_c), 1e-6, 1e-5); });

  // The teaching reductions on the same vector, against a float64 sum.
  double ref = 0, ref_abs = 0;
  {
    const float* p = xc.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      ref += p[i];
      ref_abs += std::fabs(p[i]);
    }
  }
  Tensor workspace = empty({std::max<int64_t>(dev::reduce_sum_workspace_floats(n), 1)}, TensorOptions(DType::Float32, gpu));
  Tensor result = empty({1}, TensorOptions(DType::Float32, gpu));
  for (const auto& v : dev::kReduceSumVariants) {
    Row row{"sum_all", std::string("dev") + std::to_string(v.number) + "_" + v.name, flat_s, n * f + f};
    row.limit = "d2d copy";
    row.limit_rate = copy_gbs;
    bench.add(
        row,
        [&] {
          poison(result, bench.stream());
          return bench.time([&] {
            v.launch(x.data_ptr<float>(), n, result.data_ptr<float>(), workspace.data_ptr<float>(), bench.stream());
          });
        },
        [&] {
          const double got = result.item();
          return std::fabs(got - ref) <= 1e-5 * ref_abs ? int64_t{0} : int64_t{1};
        });
  }
}

// Matrix products at S x S x S and the convolution, against raw cublasSgemm.
void bench_compute_bound(Bench& bench, Device gpu, int64_t S, const Shape& conv_input, const Shape& conv_weight) {
  const int s = static_cast<int>(S);
  const double flops = 2.0 * S * S * S;
  const std::string shape = std::to_string(S) + "^3";
  Tensor ac = randn({S, S}), bc = randn({S, S});
  Tensor a = ac.to(gpu), b = bc.to(gpu);
  Tensor c = empty({S, S}, TensorOptions(DType::Float32, gpu));

  // Reference for the first 16 rows, in float64; the tolerance scales with
  // sum_k |a_ik b_kj| (see kernels/dev/sgemm.cu).
  const int64_t check_rows = std::min<int64_t>(16, S);
  Tensor a_head = ac.narrow(0, 0, check_rows).to(DType::Float64), b64 = bc.to(DType::Float64);
  Tensor ref = matmul(a_head, b64), scale = matmul(abs(a_head), abs(b64));
  auto check_product = [&](const Tensor& product) { return count_wrong(product.narrow(0, 0, check_rows), ref, 0, 1e-5, scale); };

  dev::RawCublasHandle cublas(bench.stream());
  Row raw{"matmul", "cublasSgemm", shape, 0, flops};
  double cublas_ms = 0;
  bench.add(
      raw,
      [&] {
        poison(c, bench.stream());
        cublas_ms = bench.time([&] {
          dev::sgemm_cublas(cublas.get(), s, s, s, a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>());
        });
        return cublas_ms;
      },
      [&] { return check_product(c); });
  const double cublas_tflops = cublas_ms > 0 ? flops / (cublas_ms * 1e-3) / 1e12 : 0;

  Row weft_mm{"matmul", "weft", shape, 0, flops};
  weft_mm.limit = "cublas sgemm";
  weft_mm.limit_rate = cublas_tflops;
  Tensor out;
  bench.add(
      weft_mm, [&] { return bench.time([&] { out = matmul(a, b); }); }, [&] { return check_product(out); });
  out = Tensor();

  for (const auto& v : dev::kSgemmVariants) {
    Row row{"matmul", std::string("dev") + std::to_string(v.number) + "_" + v.name, shape, 0, flops};
    row.limit = "cublas sgemm";
    row.limit_rate = cublas_tflops;
    bench.add(
        row,
        [&] {
          poison(c, bench.stream());
          return bench.time(
              [&] { v.launch(s, s, s, a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), bench.stream()); });
        },
        [&] { return check_product(c); });
  }

  // A ResNet-style 3x3 convolution, stride 1, padding 1, no bias (batch norm follows).
  // The check runs the first two images through the CPU convolution; cuDNN may pick
  // Winograd or FFT algorithms, whose float32 error is larger than a direct sum's.
  const int64_t N = conv_input[0], C = conv_input[1], H = conv_input[2], W = conv_input[3];
  const int64_t O = conv_weight[0], KH = conv_weight[2], KW = conv_weight[3];
  Tensor in_c = randn(conv_input), w_c = mul(randn(conv_weight), 1.0 / std::sqrt(double(C * KH * KW)));
  Tensor in = in_c.to(gpu), w = w_c.to(gpu);
  Row conv{"conv2d", "weft", shape_str(conv_input) + " w" + shape_str(conv_weight), 0,
           2.0 * N * O * H * W * C * KH * KW};
  conv.limit = "cublas sgemm";
  conv.limit_rate = cublas_tflops;
  bench.add(
      conv, [&] { return bench.time([&] { out = conv2d(in, w, Tensor(), {1, 1}, {1, 1}); }); },
      [&] {
        const int64_t images = std::min<int64_t>(2, N);
        Tensor expect = conv2d(in_c.narrow(0, 0, images), w_c, Tensor(), {1, 1}, {1, 1});
        return count_wrong(out.narrow(0, 0, images), expect, 2e-3, 2e-3);
      });
}

int usage(int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: kernels [--quick] [--reps N] [--json FILE]\n"
               "  Times weft's CUDA ops (through the Tensor API on cuda:0), raw cuBLAS and the teaching\n"
               "  ladders of kernels/dev/, each with a correctness check in the same run (#wrong: elements\n"
               "  out of tolerance, 0 when correct). Memory-bound rows: float32 tensors of 64 and 256 MiB\n"
               "  (--quick: 1 and 4 MiB), GB/s read + written as %% of D2D copy bandwidth. Matrix products\n"
               "  4096^3 (--quick: 512^3) and a 3x3 convolution: TFLOP/s as %% of raw cublasSgemm.\n"
               "  --reps N     timed repetitions per row after %d warm-up calls (default 20); median reported\n"
               "  --json FILE  also write the rows as JSON\n"
               "  Exit status: 0 every row correct, 1 a wrong result or a failed op, 2 bad arguments,\n"
               "  77 no CUDA GPU visible (nothing is measured).\n",
               kWarmup);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return usage(0);
    else return usage(2);
  }
  if (reps <= 0) return usage(2);
  if (!cuda_available()) {
    std::printf("kernels: no CUDA GPU (%s)\n", cuda::unavailable_reason().c_str());
    return 77;
  }

  try {
    const Device gpu = Device::cuda(0);
    cuda::DeviceGuard guard(gpu);
    cudaDeviceProp prop;
    WEFT_CUDA_CHECK(cudaGetDeviceProperties(&prop, cuda::physical_device(gpu)));
    std::printf("# kernels on %s: float32, median of %d runs after %d warm-up (CUDA events), TF32 %s\n", prop.name,
                reps, kWarmup, cuda::allow_tf32() ? "on" : "off");
    Bench bench(gpu, reps);
    bench.header();
    const int64_t mib = int64_t{1} << 20;
    for (int64_t bytes : quick ? std::vector<int64_t>{1 * mib, 4 * mib} : std::vector<int64_t>{64 * mib, 256 * mib})
      bench_memory_bound(bench, gpu, bytes / static_cast<int64_t>(sizeof(float)));
    if (quick) bench_compute_bound(bench, gpu, 512, {4, 64, 14, 14}, {64, 64, 3, 3});
    else bench_compute_bound(bench, gpu, 4096, {32, 256, 14, 14}, {256, 256, 3, 3});

    if (!json_path.empty() && !bench.write_json(json_path, prop.name, quick)) {
      std::fprintf(stderr, "kernels: cannot write %s\n", json_path.c_str());
      return 1;
    }
    return bench.all_correct() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernels: %s\n", e.what());
    return 1;
  }
}
