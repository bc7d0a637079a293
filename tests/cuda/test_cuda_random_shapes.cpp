// Seeded random configurations per op family, CUDA against the CPU: 50 per family, each a
// fresh draw of shapes (sizes 0 and 1 included), dtypes, op arguments and memory layouts
// (transposed, step-sliced, misaligned, stride-0 expanded), run on both devices with the same
// values, outputs and gradients (through autograd) compared. The draws come from a
// std::mt19937_64 with a fixed seed per family, mapped to ranges by modulo (the
// distributions of <random> differ between standard libraries), so every run draws the same
// configurations; each is printed with a failure. Where an argument is invalid (a window
// larger than its input, an empty reduction with no identity) both devices must refuse it.
//
// Tolerances: the family suites' tables (cuda_tolerances.h). Exact: elementwise ops that
// round once, index ops, pooling, copies, extrema and integer reductions. A gradient that is
// also summed over an expanded (stride-0) input takes the reduction table too.
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "cuda_tolerances.h"
#include "kernels/cuda/runtime.h"
#include "kernels/index_ops_kernels.h"

using namespace weft;
using test::gpu;
using test::on_gpu;
namespace tolerance = test::tolerance;

namespace {

constexpr int kConfigs = 50;

// --- draws ------------------------------------------------------------------------------

class Draw {
 public:
  explicit Draw(uint64_t seed) : engine_(seed) {}
  // Uniform in [lo, hi].
  int64_t in(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(engine_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(int percent) { return in(0, 99) < percent; }
  uint64_t seed() { return engine_() >> 1; }
  template <class T>
  T one_of(std::initializer_list<T> options) {
    return options.begin()[in(0, static_cast<int64_t>(options.size()) - 1)];
  }

 private:
  std::mt19937_64 engine_;
};

// One dim: 0 now and then, 1 often, mostly small, sometimes larger.
int64_t dim_size(Draw& d) {
  const int64_t r = d.in(0, 99);
  if (r < 4) return 0;
  if (r < 24) return 1;
  if (r < 88) return d.in(2, 9);
  return d.in(10, 70);
}

Shape random_shape(Draw& d, int64_t rank, int64_t max_numel = 20000) {
  Shape s;
  for (int64_t i = 0; i < rank; ++i) s.push_back(dim_size(d));
  while (s.numel() > max_numel) {
    int64_t largest = 0;
    for (int64_t i = 1; i < rank; ++i)
      if (s[i] > s[largest]) largest = i;
    s[largest] = (s[largest] + 1) / 2;
  }
  return s;
}

std::string str(const Shape& s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

// How an input's values lie in memory. Each layout is a differentiable function of the leaf,
// the same on both devices, so gradients flow back to the leaf.
struct Layout {
  enum Kind { kContiguous, kPermuted, kStepped, kMisaligned, kKinds };
  Kind kind = kContiguous;
  std::vector<int64_t> perm;  // kPermuted: the order of the dims in memory
  int64_t dim = 0, pick = 0;  // kStepped: every third element along dim, from pick

  Tensor apply(const Tensor& t) const {
    switch (kind) {
      case kContiguous: break;
      case kPermuted: {
        if (t.dim() < 2) break;
        std::vector<int64_t> inverse(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
        return t.permute(perm).contiguous().permute(inverse);
      }
      case kStepped: {
        if (t.dim() == 0) break;
        Shape wide = t.shape();
        wide.insert(dim + 1, 3);
        return t.unsqueeze(dim + 1).expand(wide).contiguous().select(dim + 1, pick);
      }
      case kMisaligned: {
        if (t.dim() == 0 || t.numel() == 0) break;
        const int64_t n = t.numel();
        const Tensor pad = zeros({1}, TensorOptions(t.dtype(), t.device()));
        return cat({pad, t.reshape({n})}, 0).slice(0, 1, n + 1).view(t.shape());
      }
      case kKinds: break;
    }
    return t;
  }

  std::string str() const {
    std::ostringstream out;
    switch (kind) {
      case kContiguous: out << "contiguous"; break;
      case kPermuted:
        out << "permuted(";
        for (size_t i = 0; i < perm.size(); ++i) out << (i ? "," : "") << perm[i];
        out << ")";
        break;
      case kStepped: out << "stepped(dim " << dim << ", from " << pick << ")"; break;
      case kMisaligned: out << "misaligned"; break;
      case kKinds: break;
    }
    return out.str();
  }
};

Layout random_layout(Draw& d, int64_t rank) {
  Layout l;
  l.kind = static_cast<Layout::Kind>(d.in(0, Layout::kKinds - 1));
  l.perm.resize(rank);
  std::iota(l.perm.begin(), l.perm.end(), 0);
  for (int64_t i = rank - 1; i > 0; --i) std::swap(l.perm[i], l.perm[d.in(0, i)]);
  l.dim = rank > 0 ? d.in(0, rank - 1) : 0;
  l.pick = d.in(0, 2);
  return l;
}

// An input of a given shape: a leaf whose dims are 1 where the input is expanded (stride
// 0), laid out by `layout`, then expanded to `shape`.
struct Input {
  Shape shape, leaf;
  Layout layout;

  Tensor apply(const Tensor& leaf_values) const {
    const Tensor laid = layout.apply(leaf_values);
    return leaf == shape ? laid : laid.expand(shape);
  }
  // Elements of the input per element of the leaf (the sum a gradient goes through).
  int64_t expansion() const { return leaf.numel() > 0 ? shape.numel() / leaf.numel() : 1; }
  std::string str() const {
    std::ostringstream out;
    out << shape;
    if (!(leaf == shape)) out << " expanded from " << leaf;
    out << " " << layout.str();
    return out.str();
  }
};

Input random_input(Draw& d, const Shape& shape, int expand_percent = 20) {
  Input in;
  in.shape = shape;
  in.leaf = shape;
  if (d.chance(expand_percent))
    for (int64_t i = 0; i < shape.size(); ++i)
      if (shape[i] > 1 && d.chance(40)) in.leaf[i] = 1;
  in.layout = random_layout(d, shape.size());
  return in;
}

// Fresh values of `dtype`: normals (uniform in [lo, hi) when lo < hi) for floats, uniform
// integers in [lo, hi) otherwise (the dtype's small range when lo == hi), random bools.
Tensor values(const Shape& shape, DType dtype, uint64_t seed, double lo = 0, double hi = 0) {
  if (is_floating(dtype)) return test::random(shape, dtype, seed, lo, hi);
  if (dtype == DType::Bool) return gt(test::random(shape, DType::Float64, seed), 0.0);
  if (lo >= hi) {
    lo = dtype == DType::UInt8 ? 0 : -100;
    hi = dtype == DType::UInt8 ? 256 : 100;
  }
  return test::random(shape, DType::Float64, seed, lo, hi).to(DType::Int64).to(dtype);
}

// Class indices (int64) in [0, bound).
Tensor indices(const Shape& shape, int64_t bound, uint64_t seed) {
  if (shape.numel() == 0 || bound == 0) return zeros(shape, DType::Int64);
  return test::random(shape, DType::Float64, seed, 0, static_cast<double>(bound)).to(DType::Int64);
}

const char* name(DType dtype) { return dtype_name(dtype).data(); }

// --- running an op on both devices -----------------------------------------------------------

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct Run {
  std::vector<Tensor> outputs;  // on the host
  std::vector<Tensor> grads;    // of each leaf that requires grad, on the host
  std::string error;            // what the op threw, "" if nothing
};

// fn on copies of the leaves on `device` (those marked in `grad` require grad), then, when an
// output requires grad, backward of sum_k sum(out_k * w_k) with fresh w_k (the same on both
// devices). Everything is read back inside the try: a device-side error raised at that
// synchronisation counts as the op's.
Run run_on(Device device, const std::vector<Tensor>& leaves, const std::vector<bool>& grad, const Fn& fn,
           uint64_t weight_seed) {
  Run r;
  try {
    std::vector<Tensor> on;
    for (size_t i = 0; i < leaves.size(); ++i) {
      Tensor t = leaves[i].defined() ? leaves[i].detach().to(device).clone() : Tensor();
      if (grad[i]) t.requires_grad_();
      on.push_back(t);
    }
    const std::vector<Tensor> out = fn(on);
    Tensor total;
    for (size_t k = 0; k < out.size(); ++k) {
      if (!out[k].defined() || !out[k].requires_grad()) continue;
      const Tensor w = test::random(out[k].shape(), out[k].dtype(), weight_seed + k).to(device);
      const Tensor term = sum(mul(out[k], w));
      total = total.defined() ? add(total, term) : term;
    }
    if (total.defined()) total.backward();
    for (const Tensor& t : out) r.outputs.push_back(t.defined() ? t.detach().to(kCPU) : Tensor());
    for (size_t i = 0; i < on.size(); ++i)
      r.grads.push_back(grad[i] && on[i].grad().defined() ? on[i].grad().to(kCPU) : Tensor());
  } catch (const weft::Error& e) {
    r.error = e.what();
  }
  return r;
}

// How a CUDA result must match the CPU's.
struct Expect {
  enum Mode { kExact, kWithin, kNormalised };
  Mode mode = kExact;
  tolerance::Tol tol{0, 0};
  double normalised = 0;

  static Expect exact() { return {}; }
  static Expect within(tolerance::Tol t) { return {kWithin, t, 0}; }
  static Expect relative_to_max(double tol) { return {kNormalised, {0, 0}, tol}; }
};

void check_match(const Tensor& actual, const Tensor& expected, const Expect& e) {
  switch (e.mode) {
    case Expect::kExact: CHECK_IDENTICAL(actual, expected); break;
    case Expect::kWithin: CHECK_WITHIN(actual, expected, e.tol); break;
    case Expect::kNormalised: CHECK_NORMALISED_WITHIN(actual, expected, e.normalised); break;
  }
}

// The op on both devices: both refuse it or neither does; outputs and gradients match.
void check_both(const std::vector<Tensor>& leaves, const std::vector<bool>& grad, const Fn& fn, const Expect& out,
                const Expect& grads, uint64_t weight_seed) {
  const Run cpu = run_on(kCPU, leaves, grad, fn, weight_seed);
  const Run dev = run_on(gpu(), leaves, grad, fn, weight_seed);
  const std::string errors = "CPU: '" + cpu.error + "', CUDA: '" + dev.error + "'";
  CHECK_MESSAGE(cpu.error.empty() == dev.error.empty(), errors);
  if (!cpu.error.empty() || !dev.error.empty()) return;
  REQUIRE(cpu.outputs.size() == dev.outputs.size());
  for (size_t k = 0; k < cpu.outputs.size(); ++k) {
    CAPTURE(k);
    REQUIRE(cpu.outputs[k].defined() == dev.outputs[k].defined());
    if (cpu.outputs[k].defined()) check_match(dev.outputs[k], cpu.outputs[k], out);
  }
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    const size_t leaf = i;
    CAPTURE(leaf);
    REQUIRE(cpu.grads[i].defined() == dev.grads[i].defined());
    if (cpu.grads[i].defined()) check_match(dev.grads[i], cpu.grads[i], grads);
  }
}

// A gradient summed over `expansion` elements of an expanded input on top of `pointwise`.
Expect gradient(DType dtype, tolerance::Tol pointwise, int64_t expansion) {
  return Expect::within(tolerance::combined(pointwise, tolerance::sums(dtype, expansion)));
}

}  // namespace

// --- elementwise ----------------------------------------------------------------------------

TEST_CASE("random shapes: elementwise unary ops") {
  struct Op {
    const char* name;
    bool floating_only, positive, exact, differentiable;
    std::function<Tensor(const Tensor&)> fn;
  };
  const std::vector<Op> ops = {
      {"neg", false, false, true, true, [](const Tensor& x) { return neg(x); }},
      {"abs", false, false, true, true, [](const Tensor& x) { return abs(x); }},
      {"sign", false, false, true, false, [](const Tensor& x) { return sign(x); }},
      {"relu", false, false, true, true, [](const Tensor& x) { return relu(x); }},
      {"clamp", false, false, true, true, [](const Tensor& x) { return clamp(x, 2.0, 60.0); }},
      {"add 3", false, false, true, true, [](const Tensor& x) { return add(x, 3.0); }},
      {"mul 3", false, false, true, true, [](const Tensor& x) { return mul(x, 3.0); }},
      {"mul -3", true, false, true, true, [](const Tensor& x) { return mul(x, -3.0); }},
      {"div 3", true, false, true, true, [](const Tensor& x) { return div(x, 3.0); }},
      {"sqrt", true, true, true, true, [](const Tensor& x) { return sqrt(x); }},
      {"exp", true, false, false, true, [](const Tensor& x) { return exp(x); }},
      {"log", true, true, false, true, [](const Tensor& x) { return log(x); }},
      {"tanh", true, false, false, true, [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", true, false, false, true, [](const Tensor& x) { return sigmoid(x); }},
      {"gelu", true, false, false, true, [](const Tensor& x) { return gelu(x); }},
      {"pow 2.5", true, true, false, true, [](const Tensor& x) { return pow(x, 2.5); }},
      {"pow -1.5", true, true, false, true, [](const Tensor& x) { return pow(x, -1.5); }},
      {"pow 3", true, false, false, true, [](const Tensor& x) { return pow(x, 3.0); }},
  };
  Draw d(0x5eed0001);
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64, DType::Float32, DType::Float64, DType::Int32,
                                  DType::Int64, DType::UInt8});
    const Op* op = &ops[d.in(0, static_cast<int64_t>(ops.size()) - 1)];
    while (op->floating_only && !is_floating(dtype)) op = &ops[d.in(0, static_cast<int64_t>(ops.size()) - 1)];
    const Input in = random_input(d, random_shape(d, d.in(0, 4)));
    const uint64_t seed = d.seed();
    const std::string config = std::string(op->name) + " " + name(dtype) + " " + in.str();
    CAPTURE(i);
    CAPTURE(config);
    const Tensor x = op->positive         ? values(in.leaf, dtype, seed, 0.01, 10.0)
                     : is_floating(dtype) ? mul(values(in.leaf, dtype, seed), 3.0)
                                          : values(in.leaf, dtype, seed);
    const bool grad = is_floating(dtype) && op->differentiable;
    const std::function<Tensor(const Tensor&)> fn = op->fn;
    const Input input = in;
    check_both({x}, {grad},
               [fn, input](const std::vector<Tensor>& v) { return std::vector<Tensor>{fn(input.apply(v[0]))}; },
               op->exact ? Expect::exact() : Expect::within(tolerance::transcendental(dtype)),
               gradient(dtype, tolerance::transcendental(dtype), in.expansion()), seed + 1);
  }
}

TEST_CASE("random shapes: elementwise binary ops with broadcasting, and where") {
  struct Op {
    const char* name;
    bool floating_only, positive_a, exact, differentiable;
    std::function<Tensor(const Tensor&, const Tensor&)> fn;
  };
  const std::vector<Op> ops = {
      {"add", false, false, true, true, [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"sub", false, false, true, true, [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", false, false, true, true, [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", true, false, true, true, [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      {"maximum", false, false, true, true, [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", false, false, true, true, [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
      {"pow", true, true, false, true, [](const Tensor& a, const Tensor& b) { return pow(a, b); }},
      {"eq", false, false, true, false, [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
      {"ne", false, false, true, false, [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
      {"lt", false, false, true, false, [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
      {"ge", false, false, true, false, [](const Tensor& a, const Tensor& b) { return ge(a, b); }},
      {"where a > b", false, false, true, true,
       [](const Tensor& a, const Tensor& b) { return where(gt(a, b), a, b); }},
  };
  Draw d(0x5eed0002);
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64, DType::Float32, DType::Float64, DType::Int32,
                                  DType::Int64, DType::UInt8});
    const Op* op = &ops[d.in(0, static_cast<int64_t>(ops.size()) - 1)];
    while (op->floating_only && !is_floating(dtype)) op = &ops[d.in(0, static_cast<int64_t>(ops.size()) - 1)];
    // Each operand: the output's shape without some leading dims, some dims 1 (broadcast).
    const Shape out = random_shape(d, d.in(0, 4));
    Shape sa, sb;
    for (Shape* s : {&sa, &sb}) {
      for (int64_t k = d.in(0, out.size()); k < out.size(); ++k) s->push_back(d.chance(30) ? 1 : out[k]);
    }
    if (d.chance(50)) sa = out;  // at least one full operand, usually
    const Input ia = random_input(d, sa), ib = random_input(d, sb);
    const bool ties = d.chance(30);  // few distinct values: equal elements for eq, maximum, ...
    const uint64_t seed = d.seed();
    const std::string config = std::string(op->name) + " " + name(dtype) + " a " + ia.str() + ", b " + ib.str() +
                               (ties ? ", ties" : "");
    CAPTURE(i);
    CAPTURE(config);
    Tensor a = op->positive_a ? values(ia.leaf, dtype, seed, 0.5, 2.0) : values(ia.leaf, dtype, seed);
    Tensor b = values(ib.leaf, dtype, seed + 1);
    if (ties && is_floating(dtype)) {
      a = div(clamp(test::random(ia.leaf, DType::Float64, seed, 0, 4).to(DType::Int64).to(dtype), 0.0, 3.0), 2.0);
      b = div(clamp(test::random(ib.leaf, DType::Float64, seed + 1, 0, 4).to(DType::Int64).to(dtype), 0.0, 3.0), 2.0);
      if (op->positive_a) a = add(a, 0.5);
    } else if (ties) {
      a = values(ia.leaf, dtype, seed, 0, 3);
      b = values(ib.leaf, dtype, seed + 1, 0, 3);
    }
    const bool grad = is_floating(dtype) && op->differentiable;
    const std::function<Tensor(const Tensor&, const Tensor&)> fn = op->fn;
    // Output elements per leaf element, at most: what a gradient sums over.
    const int64_t expansion =
        std::max<int64_t>(1, out.numel()) / std::max<int64_t>(1, std::min(ia.leaf.numel(), ib.leaf.numel()));
    check_both({a, b}, {grad, grad},
               [fn, ia, ib](const std::vector<Tensor>& v) {
                 return std::vector<Tensor>{fn(ia.apply(v[0]), ib.apply(v[1]))};
               },
               op->exact ? Expect::exact() : Expect::within(tolerance::transcendental(dtype)),
               gradient(dtype, tolerance::transcendental(dtype), expansion), seed + 2);
  }
}

// --- reductions and softmax -----------------------------------------------------------------

TEST_CASE("random shapes: reductions over random dim sets, with and without keepdim") {
  Draw d(0x5eed0003);
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64, DType::Float64, DType::Int32, DType::Int64,
                                  DType::UInt8});
    const int64_t rank = d.in(1, 4);
    const Input in = random_input(d, random_shape(d, rank));
    std::vector<int64_t> dims;
    for (int64_t k = 0; k < rank; ++k)
      if (d.chance(50)) dims.push_back(d.chance(30) ? k - rank : k);  // none: every dim
    const int64_t one_dim = d.in(-rank, rank - 1);
    const bool keepdim = d.chance(50), flat = d.chance(20);
    const int64_t correction = d.in(0, 2);
    const bool floating = is_floating(dtype);
    const int op = d.in(0, floating ? 8 : 5);
    const uint64_t seed = d.seed();
    static const char* const kNames[] = {"sum", "amax", "amin", "argmax", "argmin", "max", "mean", "var", "min"};
    std::ostringstream dim_list;
    for (int64_t k : dims) dim_list << k << " ";
    const std::string config = std::string(kNames[op]) + " " + name(dtype) + " " + in.str() + " dims {" +
                               dim_list.str() + "} dim " + std::to_string(one_dim) + (keepdim ? " keepdim" : "") +
                               (flat ? " flat" : "") + " correction " + std::to_string(correction);
    CAPTURE(i);
    CAPTURE(config);
    const Tensor x = floating ? values(in.leaf, dtype, seed) : values(in.leaf, dtype, seed, 0, 7);  // ties
    const Input input = in;
    const Fn fn = [=](const std::vector<Tensor>& v) -> std::vector<Tensor> {
      const Tensor t = input.apply(v[0]);
      const std::optional<int64_t> arg_dim = flat ? std::nullopt : std::optional<int64_t>(one_dim);
      switch (op) {
        case 0: return {sum(t, dims, keepdim)};
        case 1: return {amax(t, dims, keepdim)};
        case 2: return {amin(t, dims, keepdim)};
        case 3: return {argmax(t, arg_dim, keepdim)};
        case 4: return {argmin(t, arg_dim, keepdim)};
        case 5: {
          const std::pair<Tensor, Tensor> m = max(t, one_dim, keepdim);
          return {m.first, m.second};
        }
        case 6: return {mean(t, dims, keepdim)};
        case 7: return {var(t, dims, correction, keepdim)};
        default: {
          const std::pair<Tensor, Tensor> m = min(t, one_dim, keepdim);
          return {m.first, m.second};
        }
      }
    };
    // Elements per output: all of them when no dim is named.
    int64_t per_output = 1;
    for (int64_t k = 0; k < rank; ++k) {
      bool reduced = dims.empty();
      for (int64_t r : dims) reduced = reduced || (r + rank) % rank == k;
      if (reduced) per_output *= std::max<int64_t>(1, in.shape[k]);
    }
    const bool summed = floating && (op == 0 || op == 6 || op == 7);
    check_both({x}, {floating}, fn, summed ? Expect::within(tolerance::sums(dtype, per_output)) : Expect::exact(),
               gradient(dtype, tolerance::math(dtype), per_output * in.expansion()), seed + 1);
  }
}

TEST_CASE("random shapes: softmax and log_softmax, rows and columns, long rows") {
  Draw d(0x5eed0004);
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64});
    const int64_t rank = d.in(1, 4);
    const int64_t dim = d.in(0, rank - 1);
    Shape shape = random_shape(d, rank);
    if (d.chance(15)) {  // a long softmax dim: the block-per-row or long-column kernels
      shape[dim] = d.in(1025, 3000);
      for (int64_t k = 0; k < rank; ++k)
        if (k != dim) shape[k] = std::min<int64_t>(shape[k], 3);
    }
    const Input in = random_input(d, shape);
    const bool log = d.chance(50);
    const int64_t arg = d.chance(30) ? dim - rank : dim;
    const uint64_t seed = d.seed();
    const std::string config =
        std::string(log ? "log_softmax " : "softmax ") + name(dtype) + " " + in.str() + " dim " + std::to_string(arg);
    CAPTURE(i);
    CAPTURE(config);
    const Tensor x = mul(values(in.leaf, dtype, seed), 3.0);
    const Input input = in;
    check_both({x}, {true},
               [input, log, arg](const std::vector<Tensor>& v) {
                 const Tensor t = input.apply(v[0]);
                 return std::vector<Tensor>{log ? log_softmax(t, arg) : softmax(t, arg)};
               },
               Expect::within(tolerance::math(dtype)), gradient(dtype, tolerance::math(dtype), in.expansion()),
               seed + 1);
  }
}

// --- index ops ---------------------------------------------------------------------------------

TEST_CASE("random shapes: index_select, gather, scatter_add and index_add") {
  Draw d(0x5eed0005);
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64, DType::Float64, DType::Int64, DType::Int32,
                                  DType::UInt8, DType::Bool});
    const int64_t rank = d.in(1, 3);
    const Input in = random_input(d, random_shape(d, rank, 5000));
    const int64_t dim = d.in(0, rank - 1), size = in.shape[dim];
    const uint64_t seed = d.seed();
    // index_select: 0-d or 1-d, repeats allowed.
    const bool scalar_index = size > 0 && d.chance(10);
    const Shape select_shape = scalar_index ? Shape{} : Shape{size > 0 ? d.in(0, 12) : 0};
    // gather: index.size(k) <= x.size(k) off dim, any length along it.
    Shape gather_shape = in.shape;
    for (int64_t k = 0; k < rank; ++k) gather_shape[k] = k == dim ? (size > 0 ? d.in(0, 6) : 0) : d.in(0, in.shape[k]);
    // scatter_add: src at least index's shape.
    Shape scatter_shape = in.shape, src_shape = in.shape;
    for (int64_t k = 0; k < rank; ++k) {
      src_shape[k] = k == dim ? d.in(0, 6) : in.shape[k];
      scatter_shape[k] = size > 0 ? d.in(0, src_shape[k]) : 0;
    }
    const Input src_in = random_input(d, src_shape);
    const bool numeric = dtype != DType::Bool, floating = is_floating(dtype);
    const std::string config = std::string(name(dtype)) + " x " + in.str() + " dim " + std::to_string(dim) +
                               " select " + str(select_shape) + " gather " + str(gather_shape) + " scatter " +
                               str(scatter_shape) + " src " + src_in.str();
    CAPTURE(i);
    CAPTURE(config);
    const Tensor x = values(in.leaf, dtype, seed);
    const Tensor select_index = indices(select_shape, size, seed + 1);
    const Tensor gather_index = indices(gather_shape, size, seed + 2);
    const Tensor scatter_index = indices(scatter_shape, size, seed + 3);
    const Tensor src = values(src_in.leaf, dtype, seed + 4);
    const Expect grads = in.expansion() > 1 || src_in.expansion() > 1
                             ? gradient(dtype, tolerance::Tol{0, 0}, in.expansion() * src_in.expansion())
                             : Expect::exact();
    const Input input = in, src_input = src_in;
    check_both({x, select_index, gather_index}, {floating, false, false},
               [input, dim](const std::vector<Tensor>& v) {
                 const Tensor t = input.apply(v[0]);
                 return std::vector<Tensor>{index_select(t, dim, v[1]), gather(t, dim, v[2])};
               },
               Expect::exact(), grads, seed + 5);
    if (!numeric) continue;
    check_both({x, scatter_index, src}, {floating, false, floating},
               [input, src_input, dim](const std::vector<Tensor>& v) {
                 return std::vector<Tensor>{scatter_add(input.apply(v[0]), dim, v[1], src_input.apply(v[2]))};
               },
               Expect::exact(), grads, seed + 6);
    // index_add (the backward of index_select and embedding), with a skipped row.
    // The stub's contract (kernels/index_ops_kernels.h): called with a non-empty src only.
    const int64_t outer = d.in(1, 4), n = d.in(1, 9), k = d.in(1, 12), inner = d.in(1, 40);
    const int64_t skip = d.chance(30) ? d.in(0, n - 1) : -1;
    const std::string add_config = "index_add outer " + std::to_string(outer) + " n " + std::to_string(n) + " k " +
                                   std::to_string(k) + " inner " + std::to_string(inner) + " skip " +
                                   std::to_string(skip);
    CAPTURE(add_config);
    const Tensor add_src = values({outer, k, inner}, dtype, seed + 7);
    const Tensor add_out = values({outer, n, inner}, dtype, seed + 8);
    const Tensor add_index = indices({k}, n, seed + 9);
    check_both({add_src, add_index, add_out}, {false, false, false},
               [outer, n, inner, skip](const std::vector<Tensor>& v) {
                 index_add_stub(v[2].device(), v[0], v[1], v[2], outer, n, inner, skip);
                 return std::vector<Tensor>{v[2]};
               },
               Expect::exact(), Expect::exact(), seed + 10);
  }
}

// --- convolution, pooling, batch norm, matmul -------------------------------------------------

TEST_CASE("random shapes: conv2d with random stride, padding, dilation and groups") {
  Draw d(0x5eed0006);
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64});
    const int64_t groups = d.one_of<int64_t>({1, 1, 2, 3});
    const int64_t in_per_group = d.in(1, 3), out_per_group = d.in(1, 3);
    const int64_t n = d.chance(5) ? 0 : d.in(1, 3);
    const std::array<int64_t, 2> kernel{d.in(1, 4), d.in(1, 4)};
    const std::array<int64_t, 2> stride{d.in(1, 3), d.in(1, 3)};
    const std::array<int64_t, 2> padding{d.in(0, 3), d.in(0, 3)};
    const std::array<int64_t, 2> dilation{d.in(1, 3), d.in(1, 3)};
    // Large enough for one output: dilation * (k - 1) + 1 <= size + 2 * padding.
    std::array<int64_t, 2> size{};
    for (int k = 0; k < 2; ++k)
      size[k] = std::max<int64_t>(1, dilation[k] * (kernel[k] - 1) + 1 - 2 * padding[k]) + d.in(0, 8);
    const bool unbatched = n == 1 && d.chance(30), bias = d.chance(70);
    Shape input_shape{n, groups * in_per_group, size[0], size[1]};
    if (unbatched) input_shape = {groups * in_per_group, size[0], size[1]};
    const Shape weight_shape{groups * out_per_group, in_per_group, kernel[0], kernel[1]};
    const Input in = random_input(d, input_shape), w_in = random_input(d, weight_shape, 0);
    const uint64_t seed = d.seed();
    std::ostringstream config;
    config << name(dtype) << " input " << in.str() << " weight " << w_in.str() << " stride " << stride[0] << "x"
           << stride[1] << " padding " << padding[0] << "x" << padding[1] << " dilation " << dilation[0] << "x"
           << dilation[1] << " groups " << groups << (bias ? " bias" : "");
    const std::string config_str = config.str();
    CAPTURE(i);
    CAPTURE(config_str);
    const Tensor x = values(in.leaf, dtype, seed), w = values(w_in.leaf, dtype, seed + 1);
    const Tensor b = bias ? values({weight_shape[0]}, dtype, seed + 2) : Tensor();
    const Input input = in, w_input = w_in;
    const double tol = tolerance::conv_normalised(dtype);
    check_both({x, w, b}, {true, true, bias},
               [=](const std::vector<Tensor>& v) {
                 return std::vector<Tensor>{
                     conv2d(input.apply(v[0]), w_input.apply(v[1]), v[2], stride, padding, dilation, groups)};
               },
               Expect::relative_to_max(tol), Expect::relative_to_max(tol), seed + 3);
  }
}

TEST_CASE("random shapes: max and average pooling with ceil_mode, adaptive average pooling") {
  Draw d(0x5eed0007);
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64});
    const int op = static_cast<int>(d.in(0, 2));  // max, avg, adaptive
    const std::array<int64_t, 2> kernel{d.in(1, 4), d.in(1, 4)};
    const std::array<int64_t, 2> stride =
        d.chance(30) ? std::array<int64_t, 2>{0, 0} : std::array<int64_t, 2>{d.in(1, 3), d.in(1, 3)};
    const std::array<int64_t, 2> padding{d.in(0, kernel[0] / 2), d.in(0, kernel[1] / 2)};
    const std::array<int64_t, 2> dilation =
        op == 0 ? std::array<int64_t, 2>{d.in(1, 3), d.in(1, 3)} : std::array<int64_t, 2>{1, 1};
    const bool ceil_mode = d.chance(50), count_include_pad = d.chance(50);
    Shape shape{d.chance(5) ? 0 : d.in(1, 3), d.in(1, 3), d.in(1, 14), d.in(1, 14)};
    if (d.chance(20)) shape = {shape[1], shape[2], shape[3]};
    const std::array<int64_t, 2> adaptive_size{d.in(1, shape[shape.size() - 2] + 1), d.in(1, shape.back() + 1)};
    const Input in = random_input(d, shape);
    const uint64_t seed = d.seed();
    std::ostringstream config;
    config << (op == 0 ? "max_pool2d " : op == 1 ? "avg_pool2d " : "adaptive_avg_pool2d ") << name(dtype) << " "
           << in.str() << " kernel " << kernel[0] << "x" << kernel[1] << " stride " << stride[0] << "x" << stride[1]
           << " padding " << padding[0] << "x" << padding[1] << " dilation " << dilation[0] << "x" << dilation[1]
           << (ceil_mode ? " ceil_mode" : "") << (count_include_pad ? " count_include_pad" : "") << " adaptive "
           << adaptive_size[0] << "x" << adaptive_size[1];
    const std::string config_str = config.str();
    CAPTURE(i);
    CAPTURE(config_str);
    const Tensor x = values(in.leaf, dtype, seed);
    const Input input = in;
    check_both({x}, {true},
               [=](const std::vector<Tensor>& v) -> std::vector<Tensor> {
                 const Tensor t = input.apply(v[0]);
                 if (op == 0) {
                   const std::pair<Tensor, Tensor> r =
                       max_pool2d_with_indices(t, kernel, stride, padding, dilation, ceil_mode);
                   return {r.first, r.second};
                 }
                 if (op == 1) return {avg_pool2d(t, kernel, stride, padding, ceil_mode, count_include_pad)};
                 return {adaptive_avg_pool2d(t, adaptive_size)};
               },
               Expect::exact(),
               in.expansion() > 1 ? gradient(dtype, tolerance::Tol{0, 0}, in.expansion()) : Expect::exact(),
               seed + 1);
  }
}

TEST_CASE("random shapes: batch_norm in training and evaluation") {
  Draw d(0x5eed0008);
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64});
    Shape shape{d.in(1, 6), d.in(1, 5)};
    for (int64_t k = d.in(0, 2); k > 0; --k) shape.push_back(d.in(1, 6));
    const int64_t c = shape[1];
    const bool can_train = shape.numel() / c > 1;
    const bool training = can_train && d.chance(60);
    const bool affine_weight = d.chance(70), affine_bias = d.chance(70);
    const bool running = !training || d.chance(60);
    const double momentum = d.one_of({0.1, 0.5, 1.0}), eps = d.one_of({1e-5, 1e-3});
    const Input in = random_input(d, shape);
    const uint64_t seed = d.seed();
    std::ostringstream config;
    config << name(dtype) << " " << in.str() << (training ? " training" : " eval") << (affine_weight ? " weight" : "")
           << (affine_bias ? " bias" : "") << (running ? " running stats" : "") << " momentum " << momentum << " eps "
           << eps;
    const std::string config_str = config.str();
    CAPTURE(i);
    CAPTURE(config_str);
    const Tensor x = mul(values(in.leaf, dtype, seed), 2.0);
    const Tensor w = affine_weight ? values({c}, dtype, seed + 1) : Tensor();
    const Tensor b = affine_bias ? values({c}, dtype, seed + 2) : Tensor();
    const Tensor rm = running ? values({c}, dtype, seed + 3) : Tensor();
    const Tensor rv = running ? values({c}, dtype, seed + 4, 0.5, 2.0) : Tensor();
    const Input input = in;
    const double tol = tolerance::batch_norm_normalised(dtype);
    check_both({x, w, b, rm, rv}, {true, affine_weight, affine_bias, false, false},
               [input, training, momentum, eps](const std::vector<Tensor>& v) {
                 const Tensor out = batch_norm(input.apply(v[0]), v[3], v[4], v[1], v[2], training, momentum, eps);
                 return std::vector<Tensor>{out, v[3], v[4]};  // the running stats, updated in place
               },
               Expect::relative_to_max(tol), Expect::relative_to_max(tol), seed + 5);
  }
}

TEST_CASE("random shapes: matmul (1-d, 2-d, batched with broadcasting) and linear") {
  Draw d(0x5eed0009);
  auto size = [&d]() { return d.chance(5) ? int64_t{0} : d.in(1, 40); };
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64});
    const int kind = static_cast<int>(d.in(0, 5));
    const int64_t m = size(), k = size(), n = size();
    Shape sa, sb;
    switch (kind) {
      case 0: sa = {k}; sb = {k}; break;
      case 1: sa = {k}; sb = {k, n}; break;
      case 2: sa = {m, k}; sb = {k}; break;
      case 3: sa = {m, k}; sb = {k, n}; break;
      case 4: {  // batch dims that broadcast
        const int64_t b1 = d.in(1, 3), b2 = d.in(1, 3);
        sa = {d.chance(50) ? b1 : 1, b2, m, k};
        sb = {d.chance(50) ? b2 : 1, k, n};
        break;
      }
      default: {  // linear: input [..., in], weight [out, in]
        sa = {k};
        for (int64_t r = d.in(0, 2); r > 0; --r) sa.insert(0, d.in(1, 4));
        sb = {n, k};
        break;
      }
    }
    const bool bias = kind == 5 && d.chance(60);
    const Input ia = random_input(d, sa), ib = random_input(d, sb, 0);
    const uint64_t seed = d.seed();
    const std::string config = std::string(kind == 5 ? "linear " : "matmul ") + name(dtype) + " a " + ia.str() +
                               ", b " + ib.str() + (bias ? ", bias" : "");
    CAPTURE(i);
    CAPTURE(config);
    const Tensor a = values(ia.leaf, dtype, seed), b = values(ib.leaf, dtype, seed + 1);
    const Tensor c = bias ? values({n}, dtype, seed + 2) : Tensor();
    const double tol = tolerance::matmul_normalised(dtype);
    check_both({a, b, c}, {true, true, bias},
               [ia, ib, kind](const std::vector<Tensor>& v) {
                 const Tensor x = ia.apply(v[0]), y = ib.apply(v[1]);
                 return std::vector<Tensor>{kind == 5 ? linear(x, y, v[2]) : matmul(x, y)};
               },
               Expect::relative_to_max(tol), Expect::relative_to_max(tol), seed + 3);
  }
}

// --- losses ------------------------------------------------------------------------------------

TEST_CASE("random shapes: cross_entropy and nll_loss with weights, ignore_index and label smoothing") {
  Draw d(0x5eed000a);
  for (int i = 0; i < kConfigs; ++i) {
    const DType dtype = d.one_of({DType::Float32, DType::Float64});
    const bool ce = d.chance(60);
    const int kind = static_cast<int>(d.in(0, 3));  // [C]; [N, C]; [N, C, d1]; [N, C, d1, d2]
    const int64_t width = d.in(0, 99);
    const int64_t c = width < 10 ? d.in(2049, 2100) : width < 25 ? d.in(17, 64) : d.in(1, 16);
    const int64_t n = d.chance(5) ? 0 : d.in(1, c > 2048 ? 3 : 6);
    Shape shape = kind == 0 ? Shape{c} : Shape{n, c};
    for (int k = 1; k < kind && c <= 2048; ++k) shape.push_back(d.in(1, 5));
    Shape target_shape = shape;
    target_shape.erase(shape.size() == 1 ? 0 : 1);
    const int64_t ignore_index = d.chance(50) ? -100 : d.in(0, c - 1);
    const bool weighted = d.chance(50);
    const double smoothing = ce ? d.one_of({0.0, 0.05, 0.3}) : 0.0;
    const Reduction reduction = d.one_of({Reduction::None, Reduction::Mean, Reduction::Sum});
    const Input in = random_input(d, shape, 10);
    const uint64_t seed = d.seed();
    std::ostringstream config;
    config << (ce ? "cross_entropy " : "nll_loss ") << name(dtype) << " " << in.str() << " ignore_index "
           << ignore_index << (weighted ? " weighted" : "") << " smoothing " << smoothing << " reduction "
           << static_cast<int>(reduction);
    const std::string config_str = config.str();
    CAPTURE(i);
    CAPTURE(config_str);
    Tensor x = mul(values(in.leaf, dtype, seed), 2.0);
    if (!ce && in.leaf.size() > 1) x = log_softmax(x, 1);
    else if (!ce) x = log_softmax(x, 0);
    // Targets in range, every fifth one ignore_index.
    std::vector<int64_t> t = indices(target_shape, c, seed + 1).reshape({-1}).to_vector<int64_t>();
    for (size_t k = 0; k < t.size(); k += 5) t[k] = ignore_index;
    const Tensor target = tensor(t, target_shape);
    const Tensor weight = weighted ? values({c}, dtype, seed + 2, 0.5, 2.0) : Tensor();
    const Input input = in;
    check_both({x, target, weight}, {true, false, false},
               [input, ce, reduction, ignore_index, smoothing](const std::vector<Tensor>& v) {
                 const Tensor logits = input.apply(v[0]);
                 return std::vector<Tensor>{ce ? cross_entropy(logits, v[1], reduction, ignore_index, v[2], smoothing)
                                               : nll_loss(logits, v[1], reduction, ignore_index, v[2])};
               },
               // Mean and Sum add the positions' losses up, in another order on the GPU.
               Expect::within(tolerance::combined(tolerance::math(dtype), tolerance::sums(dtype, shape.numel()))),
               gradient(dtype, tolerance::math(dtype), std::max<int64_t>(1, shape.numel()) * in.expansion()), seed + 3);
  }
}

// --- copies ------------------------------------------------------------------------------------

TEST_CASE("random shapes: copies between non-contiguous views and dtypes") {
  const DType kDTypes[] = {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool};
  const bool two_devices = cuda::device_count() >= 2;
  if (!two_devices) MESSAGE("one logical device: cross-device copies need WEFT_VIRTUAL_DEVICES=4");
  Draw d(0x5eed000b);
  for (int i = 0; i < kConfigs; ++i) {
    const DType from = kDTypes[d.in(0, 5)], to = kDTypes[d.in(0, 5)];
    const Shape shape = random_shape(d, d.in(0, 4));
    const Input src_in = random_input(d, shape, 30);
    const Layout dst = random_layout(d, shape.size());
    const double scale = d.one_of({1.0, 300.0, 1e6, 1e12});
    const bool specials = is_floating(from) && d.chance(30);
    const bool cross = two_devices && d.chance(40);
    const uint64_t seed = d.seed();
    const std::string config = std::string(name(from)) + " -> " + name(to) + " src " + src_in.str() + " dst " +
                               dst.str() + " scale " + std::to_string(scale) + (specials ? " NaN/inf" : "") +
                               (cross ? " to cuda:1" : "");
    CAPTURE(i);
    CAPTURE(config);
    Tensor x = mul(test::random(src_in.leaf, DType::Float64, seed), scale);
    if (specials && x.numel() > 0) {
      std::vector<double> v = x.reshape({-1}).to_vector<double>();
      const double inf = std::numeric_limits<double>::infinity();
      const double nan = std::numeric_limits<double>::quiet_NaN();
      for (size_t k = 0; k < v.size(); k += 3) v[k] = k % 2 ? nan : k % 4 ? inf : -inf;
      x = tensor(v, src_in.leaf);
    }
    x = from == DType::Bool ? gt(x, 0.0) : x.to(from);
    const Input input = src_in;
    check_both({x}, {false},
               [input, dst, to, cross](const std::vector<Tensor>& v) {
                 const Tensor src = input.apply(v[0]);
                 const Device where = cross && v[0].device().is_cuda() ? gpu(1) : v[0].device();
                 // The destination: a view of a poisoned buffer laid out as `dst` says.
                 Shape buffer_shape = src.shape();
                 Tensor view;
                 Tensor buffer;
                 if (dst.kind == Layout::kPermuted && src.dim() >= 2) {
                   for (int64_t k = 0; k < src.dim(); ++k) buffer_shape[k] = src.shape()[dst.perm[k]];
                   buffer = test::poisoned(buffer_shape, to, where);
                   std::vector<int64_t> inverse(dst.perm.size());
                   for (size_t k = 0; k < dst.perm.size(); ++k) inverse[dst.perm[k]] = static_cast<int64_t>(k);
                   view = buffer.permute(inverse);
                 } else if (dst.kind == Layout::kStepped && src.dim() > 0) {
                   buffer_shape.insert(dst.dim + 1, 3);
                   buffer = test::poisoned(buffer_shape, to, where);
                   view = buffer.select(dst.dim + 1, dst.pick);
                 } else if (dst.kind == Layout::kMisaligned && src.dim() > 0) {
                   buffer = test::poisoned({src.numel() + 1}, to, where);
                   view = buffer.slice(0, 1, src.numel() + 1).view(src.shape());
                 } else {
                   buffer = test::poisoned(src.shape(), to, where);
                   view = buffer;
                 }
                 view.copy_(src);
                 return std::vector<Tensor>{buffer, view.contiguous(), src.to(to), src.contiguous()};
               },
               Expect::exact(), Expect::exact(), seed + 1);
  }
}
