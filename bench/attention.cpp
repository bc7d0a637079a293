// attention: weft's scaled_dot_product_attention (the fused path) beside its composed reference
// path (scaled_dot_product_attention_math: matmul, mask, softmax, matmul), forward and forward +
// backward, on the CPU always and on CUDA when a GPU is visible; on CUDA also the forward of
// the teaching ladder's rungs and its cuBLAS reference (kernels/dev/attention.cu). PyTorch runs
// the same shapes side by side (bench/reference/attention.py: matmul / softmax / matmul, and
// F.scaled_dot_product_attention where torch >= 2 has it).
//
// float32 q, k, v of shape [B, H, T, E] (self-attention: L = S = T), scale 1 / sqrt(E), no
// dropout. Reported: the median time, tokens/s (B * T per second) and GFLOP/s by
// FlashAttention's count (forward 4 B H T^2 E, halved when causal; the backward 2.5 times the
// forward). Every result is checked in the same run against the reference path in float64 on
// the same device (the forward's output; forward + backward: dq, dk and dv), and #wrong counts
// the elements out of tolerance.
//
//   attention [--device cpu|cuda|all] [--cpu-shape B H T E] [--cuda-shape B H T E]
//             [--causal no|yes|both] [--reps N] [--threads N] [--no-reference] [--json FILE]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <weft.h>

#include "bench_util.h"

#if WEFT_WITH_CUDA
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"
#include "kernels/dev/attention.cuh"
#include "kernels/dev/harness.cuh"
#include "kernels/dev/sgemm.cuh"
#endif

using namespace weft;

namespace {

struct Shape4 {
  int64_t batch, heads, seq, head_dim;
  std::string str() const {
    return std::to_string(batch) + "x" + std::to_string(heads) + "x" + std::to_string(seq) + "x" +
           std::to_string(head_dim);
  }
};

// Median milliseconds of one call of a body, after warm-up: wall clock on the CPU, CUDA events
// on the GPU (kernels/dev/harness.cuh).
using Timer = std::function<double(const std::function<void()>&)>;

// |got - ref| <= 1e-5 * max|ref| + 1e-4 * |ref| element by element, ref in float64. float32
// sums over T = 1024 keys or queries err by ~1e-6 of the largest terms, and the backward's
// differences of products (dS = P (dP - rowsum(dO O))) cancel, so the absolute part scales with
// the tensor's largest value; an indexing or masking bug errs by O(1) of it. NaN is always
// wrong; a shape mismatch makes every element wrong.
int64_t count_wrong(const Tensor& got, const Tensor& ref) {
  if (!got.defined() || !(got.shape() == ref.shape())) return std::max<int64_t>(ref.numel(), 1);
  const std::vector<double> g = got.to(kCPU).to(DType::Float64).contiguous().to_vector<double>();
  const std::vector<double> r = ref.to(kCPU).to(DType::Float64).contiguous().to_vector<double>();
  double max_ref = 0;
  for (double x : r) max_ref = std::max(max_ref, std::fabs(x));
  int64_t wrong = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - r[i]) <= 1e-5 * max_ref + 1e-4 * std::fabs(r[i]))) ++wrong;
  return wrong;
}

class Table {
 public:
  explicit Table(std::map<std::string, double> torch) : torch_(std::move(torch)) {}

  void header() const {
    std::printf("# %-6s %-7s %-20s %-8s %12s %10s %14s %10s %7s\n", "device", "mask", "impl", "pass", "shape",
                "time", "rate", "rate", "#wrong");
    std::printf("# %-6s %-7s %-20s %-8s %12s %10s %14s %10s %7s\n", "", "", "", "", "BxHxTxE", "(ms)", "(tokens/s)",
                "(GFLOP/s)", "");
  }

  // Times one row, then checks it; an exception from either is reported in the row and the
  // run goes on (exit status 1 at the end).
  void row(const std::string& device, const std::string& mask, const std::string& impl, const std::string& pass,
           const Shape4& shape, double flops, const std::function<double()>& time_it,
           const std::function<int64_t()>& check) {
    const std::string key = device + "_" + mask + "_" + impl + "_" + pass;
    double ms = 0;
    int64_t wrong = -1;
    try {
      ms = time_it();
      wrong = check();
    } catch (const std::exception& e) {
      std::printf("  %-6s %-7s %-20s %-8s %12s  FAILED: %s\n", device.c_str(), mask.c_str(), impl.c_str(),
                  pass.c_str(), shape.str().c_str(), e.what());
      json_.add(key + "_wrong", -1);
      all_correct_ = false;
      return;
    }
    const double tokens = static_cast<double>(shape.batch * shape.seq) / (ms * 1e-3);
    const double gflops = flops / (ms * 1e-3) / 1e9;
    std::printf("  %-6s %-7s %-20s %-8s %12s %10.3f %14.0f %10.1f %7lld\n", device.c_str(), mask.c_str(),
                impl.c_str(), pass.c_str(), shape.str().c_str(), ms, tokens, gflops, static_cast<long long>(wrong));
    std::fflush(stdout);
    json_.add(key + "_ms", ms);
    json_.add(key + "_tokens_per_s", tokens);
    json_.add(key + "_gflop_per_s", gflops);
    json_.add(key + "_wrong", static_cast<double>(wrong));
    all_correct_ = all_correct_ && wrong == 0;
  }

  // PyTorch's rows for this device and mask, as bench/reference/attention.py measured them.
  void torch_rows(const std::string& device, const std::string& mask, const Shape4& shape, double forward_flops) {
    for (const char* impl : {"math", "sdpa"})
      for (const char* pass : {"forward", "fwdbwd"}) {
        const std::string key = device + "_" + mask + "_" + impl + "_" + pass;
        const auto it = torch_.find(key + "_ms");
        if (it == torch_.end()) continue;
        const double ms = it->second;
        const double flops = forward_flops * (std::strcmp(pass, "forward") ? 3.5 : 1.0);
        std::printf("  %-6s %-7s %-20s %-8s %12s %10.3f %14.0f %10.1f %7s\n", device.c_str(), mask.c_str(),
                    (std::string("torch_") + impl).c_str(), pass, shape.str().c_str(), ms,
                    static_cast<double>(shape.batch * shape.seq) / (ms * 1e-3), flops / (ms * 1e-3) / 1e9, "-");
        json_.add("torch_" + key + "_ms", ms);
        json_.add("torch_" + key + "_tokens_per_s", static_cast<double>(shape.batch * shape.seq) / (ms * 1e-3));
      }
    std::fflush(stdout);
  }

  bench::JsonWriter& json() { return json_; }
  bool all_correct() const { return all_correct_; }

 private:
  std::map<std::string, double> torch_;
  bench::JsonWriter json_;
  bool all_correct_ = true;
};

using AttentionFn = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, bool, double, std::optional<double>,
                               Generator*);

// The forward's flops by FlashAttention's count: two products of 2 T^2 E per head, half when causal.
double forward_flops(const Shape4& s, bool causal) {
  return 4.0 * s.batch * s.heads * static_cast<double>(s.seq) * s.seq * s.head_dim / (causal ? 2 : 1);
}

// Inputs drawn on the CPU (the same values on either device), and the float64 reference.
struct Problem {
  Tensor q, k, v, grad_out;
  Tensor ref_out, ref_dq, ref_dk, ref_dv;

  Problem(const Shape4& s, bool causal, Device device, uint64_t seed) {
    Generator gen(seed);
    const weft::Shape shape{s.batch, s.heads, s.seq, s.head_dim};
    q = randn(shape, DType::Float32, &gen).to(device);
    k = randn(shape, DType::Float32, &gen).to(device);
    v = randn(shape, DType::Float32, &gen).to(device);
    grad_out = randn(shape, DType::Float32, &gen).to(device);
    Tensor q64 = q.to(DType::Float64).requires_grad_(), k64 = k.to(DType::Float64).requires_grad_();
    Tensor v64 = v.to(DType::Float64).requires_grad_();
    Tensor out = scaled_dot_product_attention_math(q64, k64, v64, causal);
    out.backward(grad_out.to(DType::Float64));
    ref_out = out.detach();
    ref_dq = q64.grad(), ref_dk = k64.grad(), ref_dv = v64.grad();
  }
};

void bench_weft(Table& table, const std::string& device_name, const Shape4& shape, bool causal, const Problem& p,
                const Timer& time) {
  const std::string mask = causal ? "causal" : "full";
  const double flops = forward_flops(shape, causal);
  const std::pair<const char*, AttentionFn> impls[] = {{"fused", &scaled_dot_product_attention},
                                                       {"math", &scaled_dot_product_attention_math}};
  for (const auto& impl : impls) {
    const AttentionFn fn = impl.second;
    Tensor out;
    table.row(
        device_name, mask, impl.first, "forward", shape, flops,
        [&] {
          return time([&] {
            NoGradGuard no_grad;
            out = fn(p.q, p.k, p.v, causal, 0.0, std::nullopt, nullptr);
          });
        },
        [&] { return count_wrong(out, p.ref_out); });
    out = Tensor();

    Tensor qg = p.q.detach().requires_grad_(), kg = p.k.detach().requires_grad_();
    Tensor vg = p.v.detach().requires_grad_();
    table.row(
        device_name, mask, impl.first, "fwdbwd", shape, 3.5 * flops,
        [&] {
          return time([&] {
            qg.set_grad(Tensor()), kg.set_grad(Tensor()), vg.set_grad(Tensor());
            fn(qg, kg, vg, causal, 0.0, std::nullopt, nullptr).backward(p.grad_out);
          });
        },
        [&] {
          return count_wrong(qg.grad(), p.ref_dq) + count_wrong(kg.grad(), p.ref_dk) +
                 count_wrong(vg.grad(), p.ref_dv);
        });
  }
}

#if WEFT_WITH_CUDA
// The ladder's rungs and its cuBLAS reference on the same device tensors (contiguous
// [B, H, T, E] is the ladder's [BH, T, E]), on weft's stream.
void bench_ladder(Table& table, Device gpu, const Shape4& shape, bool causal, const Problem& p, const Timer& time) {
  dev::AttentionShape s;
  s.bh = static_cast<int>(shape.batch * shape.heads), s.L = static_cast<int>(shape.seq);
  s.S = static_cast<int>(shape.seq), s.E = static_cast<int>(shape.head_dim), s.causal = causal;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
  const cudaStream_t stream = cuda::current_native_stream(gpu);
  const TensorOptions options(DType::Float32, gpu);
  Tensor workspace = empty({std::max<int64_t>(dev::attention_workspace_floats(s), 1)}, options);
  Tensor out = empty(p.q.shape(), options);
  const float *q = p.q.data_ptr<float>(), *k = p.k.data_ptr<float>(), *v = p.v.data_ptr<float>();
  float *o = out.data_ptr<float>(), *ws = workspace.data_ptr<float>();
  const std::string mask = causal ? "causal" : "full";
  const double flops = forward_flops(shape, causal);
  auto poison = [&] { WEFT_CUDA_CHECK(cudaMemsetAsync(o, 0xff, out.nbytes(), stream)); };  // NaN bits
  for (const auto& rung : dev::kAttentionVariants) {
    const std::string impl = std::string("dev") + std::to_string(rung.number) + "_" + rung.name;
    const char* reason = "";
    if (rung.launch == &dev::attention_flash && !dev::attention_flash_supports(s, &reason)) {
      std::printf("  %-6s %-7s %-20s %-8s %12s  skipped: %s\n", "cuda", mask.c_str(), impl.c_str(), "forward",
                  shape.str().c_str(), reason);
      continue;
    }
    table.row(
        "cuda", mask, impl, "forward", shape, flops,
        [&] {
          poison();
          return time([&] { rung.launch(s, q, k, v, o, ws, stream); });
        },
        [&] { return count_wrong(out, p.ref_out); });
  }
  dev::RawCublasHandle cublas(stream);
  table.row(
      "cuda", mask, "dev_cublas_math", "forward", shape, flops,
      [&] {
        poison();
        return time([&] { dev::attention_cublas_math(cublas.get(), s, q, k, v, o, ws, stream); });
      },
      [&] { return count_wrong(out, p.ref_out); });
}
#endif

int usage(std::FILE* to, int status) {
  std::fprintf(to,
               "usage: attention [--device cpu|cuda|all] [--cpu-shape B H T E] [--cuda-shape B H T E]\n"
               "                 [--causal no|yes|both] [--reps N] [--threads N] [--no-reference] [--json FILE]\n"
               "  weft's scaled_dot_product_attention (fused) beside scaled_dot_product_attention_math, forward\n"
               "  and forward + backward, float32, with PyTorch's numbers from bench/reference/attention.py;\n"
               "  on CUDA also the forward of the teaching ladder (kernels/dev/attention.cu). Each result is\n"
               "  checked against the math path in float64 (#wrong: elements out of tolerance).\n"
               "  --device       cpu, cuda or all (default: all, CUDA when a GPU is visible)\n"
               "  --cpu-shape    batch, heads, sequence length, head dim on the CPU (default 4 4 256 64)\n"
               "  --cuda-shape   the same on CUDA (default 8 12 1024 64)\n"
               "  --causal       no, yes or both (default both)\n"
               "  --reps N       timed repetitions per row (default 10 on the CPU, 20 on CUDA); median reported\n"
               "  --threads N    CPU threads, for weft and PyTorch (default: weft's, from OMP_NUM_THREADS or\n"
               "                 the cores)\n"
               "  --no-reference do not run PyTorch\n"
               "  --json FILE    also write every figure as flat JSON (PyTorch's under torch_*)\n"
               "  Exit status: 0 every row correct, 1 a wrong result or a failed op, 2 bad arguments, 77\n"
               "  --device cuda without a CUDA GPU.\n");
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_arg = "all", causal_arg = "both", json_path;
  Shape4 cpu_shape{4, 4, 256, 64}, cuda_shape{8, 12, 1024, 64};
  int reps = 0, threads = 0;  // 0: the defaults
  bool reference = true;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "attention: %s needs a value\n", argv[i]);
        std::exit(usage(stderr, 2));
      }
      return argv[++i];
    };
    auto shape4 = [&](Shape4& s) {
      s.batch = std::atoll(next().c_str()), s.heads = std::atoll(next().c_str());
      s.seq = std::atoll(next().c_str()), s.head_dim = std::atoll(next().c_str());
    };
    const std::string a = argv[i];
    if (a == "--device") device_arg = next();
    else if (a == "--cpu-shape") shape4(cpu_shape);
    else if (a == "--cuda-shape") shape4(cuda_shape);
    else if (a == "--causal") causal_arg = next();
    else if (a == "--reps") reps = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--no-reference") reference = false;
    else if (a == "--json") json_path = next();
    else if (a == "--help" || a == "-h") return usage(stdout, 0);
    else return usage(stderr, 2);
  }
  auto positive = [](const Shape4& s) { return s.batch > 0 && s.heads > 0 && s.seq > 0 && s.head_dim > 0; };
  if ((device_arg != "cpu" && device_arg != "cuda" && device_arg != "all") ||
      (causal_arg != "no" && causal_arg != "yes" && causal_arg != "both") || !positive(cpu_shape) ||
      !positive(cuda_shape) || reps < 0 || threads < 0)
    return usage(stderr, 2);
  if (threads > 0) set_num_threads(threads);
  threads = num_threads();

  bool run_cuda = device_arg != "cpu" && cuda_available();
  if (device_arg == "cuda" && !run_cuda) {
    std::printf("attention: no CUDA GPU\n");
    return 77;
  }
  const bool run_cpu = device_arg != "cuda";
  if (device_arg == "all" && !run_cuda) std::printf("# no CUDA GPU visible: CPU rows only\n");
  std::vector<bool> masks;
  if (causal_arg != "yes") masks.push_back(false);
  if (causal_arg != "no") masks.push_back(true);

  std::map<std::string, double> torch;
  if (reference) {
    std::string args = std::string("--device ") + (run_cpu && run_cuda ? "all" : run_cuda ? "cuda" : "cpu") +
                       " --causal " + causal_arg + " --threads " + std::to_string(threads);
    for (const auto& [flag, s] : {std::pair{" --cpu-shape ", cpu_shape}, std::pair{" --cuda-shape ", cuda_shape}})
      args += flag + std::to_string(s.batch) + " " + std::to_string(s.heads) + " " + std::to_string(s.seq) + " " +
              std::to_string(s.head_dim);
    if (reps > 0) args += " --reps " + std::to_string(reps);
    torch = bench::run_reference("attention.py", args);
  }
  Table table(torch);
  std::printf("# attention: float32 [B, H, T, E], scale 1/sqrt(E), no dropout; CPU threads %d; rate in GFLOP/s by\n"
              "# FlashAttention's count (forward 4 B H T^2 E, half when causal; backward 2.5x the forward)\n",
              threads);
  if (!reference) std::printf("# PyTorch not run (--no-reference)\n");
  else if (torch.empty()) std::printf("# PyTorch reference not run (no python3 with torch, or it failed)\n");
  else
    std::printf("# torch_* rows: PyTorch %d.%d (bench/reference/attention.py), math = matmul / softmax / matmul, "
                "sdpa = F.scaled_dot_product_attention\n",
                static_cast<int>(torch["torch_major"]), static_cast<int>(torch["torch_minor"]));
  table.header();
  table.json().add("cpu_shape", cpu_shape.str());
  table.json().add("cpu_threads", threads);

  try {
    if (run_cpu) {
      const int cpu_reps = reps > 0 ? reps : 10;
      const Timer cpu_time = [&](const std::function<void()>& body) {
        return bench::median_ns_per_call(cpu_reps, 1, body) / 1e6;
      };
      for (bool causal : masks) {
        const Problem p(cpu_shape, causal, kCPU, 7);
        bench_weft(table, "cpu", cpu_shape, causal, p, cpu_time);
        table.torch_rows("cpu", causal ? "causal" : "full", cpu_shape, forward_flops(cpu_shape, causal));
      }
    }
#if WEFT_WITH_CUDA
    if (run_cuda) {
      const Device gpu = Device::cuda(0);
      cuda::DeviceGuard guard(gpu);
      cudaDeviceProp prop;
      WEFT_CUDA_CHECK(cudaGetDeviceProperties(&prop, cuda::physical_device(gpu)));
      std::printf("# cuda: %s, TF32 %s, median of CUDA-event times after 2 warm-up calls\n", prop.name,
                  cuda::allow_tf32() ? "on" : "off");
      table.json().add("cuda_device", prop.name);
      table.json().add("cuda_shape", cuda_shape.str());
      const int cuda_reps = reps > 0 ? reps : 20;
      const cudaStream_t stream = cuda::current_native_stream(gpu);
      const Timer gpu_time = [&](const std::function<void()>& body) {
        return dev::median_ms(stream, 2, cuda_reps, body);
      };
      for (bool causal : masks) {
        const Problem p(cuda_shape, causal, gpu, 11);
        bench_weft(table, "cuda", cuda_shape, causal, p, gpu_time);
        bench_ladder(table, gpu, cuda_shape, causal, p, gpu_time);
        table.torch_rows("cuda", causal ? "causal" : "full", cuda_shape, forward_flops(cuda_shape, causal));
      }
    }
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention: %s\n", e.what());
    return 1;
  }
  if (!json_path.empty() && !table.json().write(json_path)) {
    std::fprintf(stderr, "attention: cannot write %s\n", json_path.c_str());
    return 1;
  }
  return table.all_correct() ? 0 : 1;
}
