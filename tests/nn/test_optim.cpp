// weft::optim: SGD / Adam / AdamW against their update rules written out here in
// double (independent of the kernels), state_dict round trips that continue
// bit-identically, learning-rate schedules against their closed forms, clip_grad_norm_
// against a naive norm, and the error texts.
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <string>
#include <tuple>
#include <vector>

#include "nn/optim/adam.h"
#include "nn/optim/clip_grad.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/sgd.h"
#include "test_util.h"

using namespace weft;
using namespace weft::optim;
using Vec = std::vector<double>;

namespace {

Vec values(const Tensor& t) { return t.detach().to_vector<double>(); }

// Bit-level equality (to_vector<double> is exact for float32 and float64).
bool same_bits(const Tensor& a, const Tensor& b) { return a.dtype() == b.dtype() && values(a) == values(b); }

Tensor from_values(const Vec& v, const Shape& shape, DType dtype) { return tensor(v, shape).to(dtype); }

Tensor make_param(const Shape& shape, DType dtype, uint64_t seed) {
  return test::random(shape, dtype, seed).requires_grad_();
}

// --- the update rules, written out from torch/optim/{sgd,adam}.py (single tensor) ----

struct SgdRef {
  SGDOptions o;
  Vec buf;  // empty until the first step with momentum
  void step(Vec& p, const Vec& grad) {
    bool first = buf.empty();
    if (first) buf.resize(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      double g = o.maximize ? -grad[i] : grad[i];
      if (o.weight_decay != 0) g = g + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = first ? g : o.momentum * buf[i] + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      p[i] = p[i] - o.lr * g;
    }
  }
};

struct AdamRef {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize, decoupled;
  Vec m, v, v_max;
  int64_t t = 0;
  void step(Vec& p, const Vec& grad) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0), v_max.assign(p.size(), 0);
    ++t;
    double bc1 = 1 - std::pow(beta1, static_cast<double>(t));
    double bc2 = 1 - std::pow(beta2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      double g = maximize ? -grad[i] : grad[i];
      if (weight_decay != 0) {
        if (decoupled)
          p[i] *= 1 - lr * weight_decay;
        else
          g += weight_decay * p[i];
      }
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      double v_hat = v[i];
      if (amsgrad) v_hat = v_max[i] = std::max(v_max[i], v[i]);
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v_hat) / std::sqrt(bc2) + eps);
    }
  }
};

AdamRef adam_ref(const AdamOptions& o, bool decoupled) {
  return {o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay, o.amsgrad, o.maximize, decoupled, {}, {}, {}};
}

double atol_for(DType dtype) { return dtype == DType::Float32 ? 2e-6 : 1e-13; }
double rtol_for(DType dtype) { return dtype == DType::Float32 ? 2e-5 : 1e-12; }

// Three steps over three parameters; parameter 1 has no grad at the second step (it is
// skipped and, for Adam, its step count does not advance); parameter 2 never has one.
// The gradients shrink from step to step, so that AMSGrad's maximum matters.
template <class Ref>
void check_three_steps(Optimizer& opt, std::vector<Ref> refs, DType dtype) {
  const std::vector<Tensor>& params = opt.params();
  std::vector<Vec> expected;
  for (const Tensor& p : params) expected.push_back(values(p));
  const Vec untouched = values(params[2]);
  const double scale[3] = {1.0, 0.3, 0.05};
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < 2; ++i) {
      if (i == 1 && step == 1) continue;
      Tensor g = mul(test::random(params[i].shape(), DType::Float64, 100 + 10 * step + i), scale[step]).to(dtype);
      Tensor(params[i]).set_grad(g);
      refs[i].step(expected[i], values(g));
    }
    opt.step();
    opt.zero_grad();
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(step);
      CAPTURE(i);
      CHECK_CLOSE(params[i], from_values(expected[i], params[i].shape(), DType::Float64), atol_for(dtype),
                  rtol_for(dtype));
    }
    CHECK(values(params[2]) == untouched);
  }
  for (const auto& [name, t] : opt.state_dict().tensors) CHECK(name.rfind("2.", 0) != 0);
}

std::vector<Tensor> three_params(DType dtype) {
  return {make_param({3, 4}, dtype, 1), make_param({5}, dtype, 2), make_param({2, 2}, dtype, 3)};
}

}  // namespace

TEST_CASE("SGD: three steps against the update rule, every variant, float32 and float64") {
  std::vector<SGDOptions> variants = {
      {0.1, 0, 0, 0, false, false},     {0.1, 0.9, 0, 0, false, false}, {0.05, 0.9, 0.3, 0, false, false},
      {0.1, 0.9, 0, 0, true, false},    {0.1, 0, 0, 0.1, false, false}, {0.1, 0.8, 0.1, 0.05, false, true},
      {0.07, 0.9, 0, 0.01, true, true}, {0.1, 0, 0, 0, false, true},
  };
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const SGDOptions& o : variants) {
      CAPTURE(dtype);
      CAPTURE(o.momentum);
      CAPTURE(o.dampening);
      CAPTURE(o.weight_decay);
      CAPTURE(o.nesterov);
      CAPTURE(o.maximize);
      SGD opt(three_params(dtype), o);
      check_three_steps(opt, std::vector<SgdRef>(3, SgdRef{o, {}}), dtype);
    }
  }
}

TEST_CASE("Adam and AdamW: three steps against the update rule, float32 and float64") {
  std::vector<AdamOptions> variants = {
      {0.01, {0.9, 0.999}, 1e-8, 0, false, false}, {0.01, {0.9, 0.999}, 1e-8, 0.1, false, false},
      {0.01, {0.9, 0.999}, 1e-8, 0, true, false},  {0.02, {0.8, 0.99}, 1e-6, 0.05, true, true},
      {0.005, {0.0, 0.5}, 1e-3, 0, false, true},
  };
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (const AdamOptions& o : variants) {
      CAPTURE(dtype);
      CAPTURE(o.weight_decay);
      CAPTURE(o.amsgrad);
      CAPTURE(o.maximize);
      Adam adam(three_params(dtype), o);
      check_three_steps(adam, std::vector<AdamRef>(3, adam_ref(o, false)), dtype);
      AdamW adamw(three_params(dtype), {o.lr, o.betas, o.eps, o.weight_decay, o.amsgrad, o.maximize});
      check_three_steps(adamw, std::vector<AdamRef>(3, adam_ref(o, true)), dtype);
    }
    AdamW defaults(three_params(dtype), AdamWOptions{});
    CHECK(defaults.options().weight_decay == 1e-2);
    AdamOptions as_adam{1e-3, {0.9, 0.999}, 1e-8, 1e-2, false, false};
    check_three_steps(defaults, std::vector<AdamRef>(3, adam_ref(as_adam, true)), dtype);
  }
}

TEST_CASE("AMSGrad changes the result when the second moment shrinks") {
  auto run = [](bool amsgrad) {
    Adam opt(three_params(DType::Float64), AdamOptions{0.01, {0.9, 0.999}, 1e-8, 0, amsgrad, false});
    for (int step = 0; step < 3; ++step) {
      Tensor(opt.params()[0]).set_grad(mul(test::random({3, 4}, DType::Float64, 7 + step), step == 0 ? 1.0 : 0.01));
      opt.step();
    }
    return values(opt.params()[0]);
  };
  CHECK(run(true) != run(false));
}

TEST_CASE("step: mixed dtypes, strided parameters and gradients, empty and large tensors") {
  SUBCASE("float32 and float64 parameters in one optimizer") {
    Tensor a = make_param({4}, DType::Float32, 11), b = make_param({3}, DType::Float64, 12);
    SGD opt({a, b}, {0.1, 0.5, 0, 0, false, false});
    Vec ea = values(a), eb = values(b);
    SgdRef ra{opt.options(), {}}, rb{opt.options(), {}};
    for (int step = 0; step < 2; ++step) {
      Tensor ga = test::random({4}, DType::Float32, 20 + step), gb = test::random({3}, DType::Float64, 30 + step);
      a.set_grad(ga);
      b.set_grad(gb);
      ra.step(ea, values(ga));
      rb.step(eb, values(gb));
      opt.step();
    }
    CHECK_CLOSE(a, from_values(ea, {4}, DType::Float64), 1e-6, 1e-5);
    CHECK_CLOSE(b, from_values(eb, {3}, DType::Float64), 1e-14, 1e-13);
  }
  SUBCASE("a strided leaf and a strided gradient") {
    Tensor base = test::random({4, 3}, DType::Float64, 13);
    Tensor w = base.t().detach().requires_grad_();
    REQUIRE(!w.is_contiguous());
    Adam opt({w}, AdamOptions{0.1});
    AdamRef ref = adam_ref(opt.options(), false);
    Vec expected = values(w);
    for (int step = 0; step < 2; ++step) {
      Tensor g = test::noncontiguous(test::random({3, 4}, DType::Float64, 40 + step));
      w.set_grad(g);
      ref.step(expected, values(g));
      opt.step();
    }
    CHECK_CLOSE(w, from_values(expected, {3, 4}, DType::Float64), 1e-13, 1e-12);
    // The update went through the view into the base's storage.
    CHECK(values(base.t()) == values(w));
  }
  SUBCASE("empty and large parameters, the same bits on 1 and 2 threads") {
    auto run = [](int threads) {
      set_num_threads(threads);
      std::vector<Tensor> params = {make_param({50001}, DType::Float32, 14), make_param({0}, DType::Float32, 15),
                                    make_param({1}, DType::Float32, 16), make_param({70, 500}, DType::Float32, 17)};
      AdamW opt(params, AdamWOptions{0.01, {0.9, 0.999}, 1e-8, 0.1, true, false});
      for (int step = 0; step < 2; ++step) {
        for (size_t i = 0; i < params.size(); ++i)
          params[i].set_grad(test::random(params[i].shape(), DType::Float32, 50 + 10 * step + i));
        opt.step();
      }
      return params;
    };
    auto one = run(1);
    auto two = run(2);
    set_num_threads(2);
    for (size_t i = 0; i < one.size(); ++i) CHECK(same_bits(one[i], two[i]));
    // Spot-check the large one against the rule (first element of each tensor piece).
    Tensor p0 = make_param({50001}, DType::Float32, 14);
    AdamRef ref = adam_ref({0.01, {0.9, 0.999}, 1e-8, 0.1, true, false}, true);
    Vec expected = values(p0);
    for (int step = 0; step < 2; ++step)
      ref.step(expected, values(test::random({50001}, DType::Float32, 50 + 10 * step)));
    CHECK_CLOSE(one[0], from_values(expected, {50001}, DType::Float64), 2e-6, 2e-5);
  }
}

TEST_CASE("step runs under no-grad and trains through autograd") {
  Tensor w = make_param({6}, DType::Float64, 60);
  Tensor target = test::random({6}, DType::Float64, 61);
  SGD opt({w}, {0.1, 0.9, 0, 0, true, false});
  double first_loss = 0, loss_value = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor diff = sub(w, target);
    Tensor loss = sum(mul(diff, diff));
    loss.backward();
    loss_value = loss.item();
    if (step == 0) first_loss = loss_value;
    opt.step();
    CHECK(w.is_leaf());
    CHECK(w.requires_grad());
  }
  CHECK(loss_value < 1e-3 * first_loss);
  opt.zero_grad();
  CHECK(!w.grad().defined());
}

TEST_CASE("lr() and set_lr() change the next step") {
  Tensor w = make_param({3}, DType::Float64, 70);
  SGD opt({w}, {0.5});
  CHECK(opt.lr() == 0.5);
  opt.set_lr(0.25);
  CHECK(opt.options().lr == 0.25);
  Vec before = values(w);
  Tensor g = test::random({3}, DType::Float64, 71);
  w.set_grad(g);
  opt.step();
  Vec gv = values(g), after = values(w);
  for (size_t i = 0; i < 3; ++i) CHECK(after[i] == doctest::Approx(before[i] - 0.25 * gv[i]).epsilon(1e-14));
  CHECK_THROWS_WITH_AS(opt.set_lr(-1), doctest::Contains("SGD: invalid learning rate: -1 (must be >= 0)"), Error);
}

namespace {

// Steps `opt` with the gradients of "iteration" k (parameter 1 skips iteration 1;
// parameter 2 first gets a gradient at iteration 3, after a resume at 2).
void step_iteration(Optimizer& opt, int k) {
  const auto& params = opt.params();
  for (size_t i = 0; i < params.size(); ++i) {
    bool has_grad = !(i == 1 && k == 1) && !(i == 2 && k < 3);
    Tensor(params[i]).set_grad(has_grad ? test::random(params[i].shape(), params[i].dtype(), 200 + 10 * k + i)
                                        : Tensor());
  }
  opt.step();
}

std::vector<Tensor> clone_params(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

OptimizerState snapshot(const OptimizerState& state) {
  OptimizerState out{{}, state.scalars};
  for (const auto& [name, t] : state.tensors) out.tensors.emplace_back(name, t.clone());
  return out;
}

// Five iterations straight, against two, save, load into a fresh optimizer (made with
// other hyperparameters, which the state overrides), three more: the same bits.
template <class Make>
void check_resume(Make make, DType dtype) {
  std::vector<Tensor> straight = three_params(dtype);
  std::vector<Tensor> resumed = clone_params(straight);
  auto a = make(straight, false);
  for (int k = 0; k < 5; ++k) step_iteration(*a, k);

  auto b = make(resumed, false);
  for (int k = 0; k < 2; ++k) step_iteration(*b, k);
  OptimizerState saved = snapshot(b->state_dict());
  b.reset();
  std::vector<Tensor> fresh = clone_params(resumed);
  auto c = make(fresh, true);
  c->load_state_dict(saved);
  for (int k = 2; k < 5; ++k) step_iteration(*c, k);
  for (size_t i = 0; i < straight.size(); ++i) {
    CAPTURE(i);
    CHECK(same_bits(straight[i], fresh[i]));
  }
  // The continued optimizer's state matches too.
  auto sa = a->state_dict(), sc = c->state_dict();
  CHECK(sa.scalars == sc.scalars);
  REQUIRE(sa.tensors.size() == sc.tensors.size());
  for (size_t i = 0; i < sa.tensors.size(); ++i) {
    CHECK(sa.tensors[i].first == sc.tensors[i].first);
    CHECK(same_bits(sa.tensors[i].second, sc.tensors[i].second));
  }
}

}  // namespace

TEST_CASE("state_dict round trip continues bit-identically") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    check_resume(
        [](std::vector<Tensor> p, bool other) {
          return std::make_unique<SGD>(p, other ? SGDOptions{0.5} : SGDOptions{0.1, 0.9, 0.1, 0.01, false, true});
        },
        dtype);
    check_resume(
        [](std::vector<Tensor> p, bool other) {
          return std::make_unique<Adam>(p,
                                        other ? AdamOptions{} : AdamOptions{0.01, {0.8, 0.99}, 1e-6, 0.1, true, false});
        },
        dtype);
    check_resume(
        [](std::vector<Tensor> p, bool other) {
          return std::make_unique<AdamW>(
              p, other ? AdamWOptions{} : AdamWOptions{0.02, {0.9, 0.95}, 1e-8, 0.05, false, true});
        },
        dtype);
  }
}

TEST_CASE("state_dict names and scalars") {
  std::vector<Tensor> params = three_params(DType::Float64);
  Adam opt(params, AdamOptions{0.01, {0.9, 0.999}, 1e-8, 0, true, false});
  step_iteration(opt, 0);
  step_iteration(opt, 1);
  OptimizerState s = opt.state_dict();
  std::vector<std::string> names;
  for (const auto& [name, t] : s.tensors) names.push_back(name);
  CHECK(names == std::vector<std::string>{"0.exp_avg", "0.exp_avg_sq", "0.max_exp_avg_sq", "1.exp_avg", "1.exp_avg_sq",
                                          "1.max_exp_avg_sq"});
  CHECK(s.scalars.at("0.step") == 2);
  CHECK(s.scalars.at("1.step") == 1);
  CHECK(!s.scalars.count("2.step"));
  CHECK(s.scalars.at("lr") == 0.01);
  CHECK(s.scalars.at("beta2") == 0.999);
  CHECK(s.scalars.at("amsgrad") == 1);
  CHECK(s.scalars.at("decoupled_weight_decay") == 0);
  CHECK(s.scalars.at("num_params") == 3);

  SGD sgd(three_params(DType::Float64), {0.1, 0.9});
  step_iteration(sgd, 0);
  OptimizerState t = sgd.state_dict();
  REQUIRE(t.tensors.size() == 2);
  CHECK(t.tensors[1].first == "1.momentum_buffer");
  CHECK(t.scalars.at("momentum") == 0.9);
  CHECK(!t.scalars.count("0.step"));
}

TEST_CASE("load_state_dict converts to the parameters' device and dtype") {
  std::vector<Tensor> params = {make_param({4}, DType::Float32, 80)};
  SGD a(params, {0.1, 0.9});
  params[0].set_grad(test::random({4}, DType::Float32, 81));
  a.step();
  OptimizerState s = a.state_dict();
  s.tensors[0].second = s.tensors[0].second.to(DType::Float64).to(Device("cpu:1"));
  SGD b({make_param({4}, DType::Float32, 80)}, {0.1, 0.9});
  b.load_state_dict(s);
  Tensor buffer = b.state_dict().tensors[0].second;
  CHECK(buffer.dtype() == DType::Float32);
  CHECK(buffer.device() == Device("cpu:0"));
  CHECK(same_bits(buffer, a.state_dict().tensors[0].second));
}

namespace {

// Five parameters interleaved over cpu:0 / cpu:1 and float32 / float64, so that every
// (device, dtype) group is scattered through the list. One optimizer over all of them
// against one optimizer per device (each over its parameters, in list order): four
// steps with fresh gradients (parameter 2 skips step 1), a state_dict round trip after
// step 2 through a checkpoint whose tensors all sit on cpu:0 (loaded into a fresh
// optimizer made with other hyperparameters), and every parameter and state tensor must
// end with the same bits. Updates are elementwise, so anything short of bitwise
// equality is a grouping bug.
template <class Make>
void check_several_devices(Make make) {
  const Device d0("cpu:0"), d1("cpu:1");
  const std::vector<std::tuple<Shape, DType, Device>> layout = {{{3, 4}, DType::Float32, d0},
                                                                {{5}, DType::Float64, d1},
                                                                {{2, 3}, DType::Float32, d1},
                                                                {{7}, DType::Float64, d0},
                                                                {{4}, DType::Float32, d0}};
  std::vector<Tensor> together;
  std::vector<Tensor> by_device[2];
  std::vector<std::pair<int, size_t>> where;  // parameter i is by_device[where[i].first][where[i].second]
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto& [shape, dtype, device] = layout[i];
    Tensor value = test::random(shape, dtype, 500 + i).to(device);
    together.push_back(value.clone().requires_grad_());
    const int d = device == d0 ? 0 : 1;
    where.emplace_back(d, by_device[d].size());
    by_device[d].push_back(value.clone().requires_grad_());
  }
  auto opt = make(together, false);
  auto opt0 = make(by_device[0], false), opt1 = make(by_device[1], false);

  auto compare_state = [&](const Optimizer& one) {
    std::map<std::string, Tensor> split_state;
    for (int d = 0; d < 2; ++d)
      for (const auto& [name, t] : (d == 0 ? *opt0 : *opt1).state_dict().tensors) split_state[std::to_string(d) + ":" + name] = t;
    size_t count = 0;
    // Named elements, not structured bindings: CAPTURE is a lambda, and Clang 14 cannot capture those.
    for (const auto& named : one.state_dict().tensors) {
      const std::string& name = named.first;
      const Tensor& t = named.second;
      size_t dot = name.find('.');
      size_t i = std::stoul(name.substr(0, dot));
      auto [d, j] = where[i];
      CAPTURE(name);
      CHECK(t.device() == together[i].device());
      auto other = split_state.find(std::to_string(d) + ":" + std::to_string(j) + name.substr(dot));
      REQUIRE(other != split_state.end());
      CHECK(same_bits(t, other->second));
      ++count;
    }
    CHECK(count == split_state.size());
  };

  for (int k = 0; k < 4; ++k) {
    CAPTURE(k);
    if (k == 2) {
      OptimizerState saved{{}, opt->state_dict().scalars};
      for (const auto& [name, t] : opt->state_dict().tensors) saved.tensors.emplace_back(name, t.to(d0).clone());
      opt = make(together, true);
      opt->load_state_dict(saved);
      compare_state(*opt);
    }
    for (size_t i = 0; i < layout.size(); ++i) {
      auto [d, j] = where[i];
      Tensor grad;
      if (!(i == 2 && k == 1))
        grad = test::random(together[i].shape(), together[i].dtype(), 600 + 10 * k + i).to(together[i].device());
      together[i].set_grad(grad);
      by_device[d][j].set_grad(grad.defined() ? grad.clone() : Tensor());
    }
    opt->step();
    opt0->step();
    opt1->step();
    for (size_t i = 0; i < layout.size(); ++i) {
      CAPTURE(i);
      auto [d, j] = where[i];
      CHECK(together[i].device() == std::get<2>(layout[i]));
      CHECK(same_bits(together[i], by_device[d][j]));
    }
  }
  compare_state(*opt);
}

}  // namespace

TEST_CASE("step: parameters on several devices and dtypes equal one optimizer per device, bitwise") {
  SUBCASE("SGD with momentum") {
    check_several_devices([](std::vector<Tensor> p, bool other) {
      return std::make_unique<SGD>(p, other ? SGDOptions{0.5} : SGDOptions{0.1, 0.9, 0.1, 0.01, false, false});
    });
    check_several_devices([](std::vector<Tensor> p, bool other) {
      return std::make_unique<SGD>(p, other ? SGDOptions{0.5} : SGDOptions{0.05, 0.8, 0, 0, true, true});
    });
  }
  SUBCASE("Adam") {
    check_several_devices([](std::vector<Tensor> p, bool other) {
      return std::make_unique<Adam>(p, other ? AdamOptions{} : AdamOptions{0.01, {0.8, 0.99}, 1e-6, 0.1, true, false});
    });
  }
  SUBCASE("AdamW") {
    check_several_devices([](std::vector<Tensor> p, bool other) {
      return std::make_unique<AdamW>(p,
                                     other ? AdamWOptions{} : AdamWOptions{0.02, {0.9, 0.95}, 1e-8, 0.05, false, true});
    });
  }
}

namespace {

// Records the groups step() hands to the kernel: one device per call is what the CUDA
// kernels depend on, and the CPU kernels alone cannot show it.
struct RecordingSGD : SGD {
  using SGD::SGD;
  std::vector<std::tuple<Device, DType, std::vector<size_t>>> calls;
  void update(const StepGroup& group) override {
    for (size_t k = 0; k < group.index.size(); ++k) {
      CHECK(group.params[k].device() == group.device);
      CHECK(group.grads[k].device() == group.device);
      CHECK(group.params[k].dtype() == group.params[0].dtype());
    }
    calls.emplace_back(group.device, group.params[0].dtype(), group.index);
    SGD::update(group);
  }
};

}  // namespace

TEST_CASE("step: one kernel call per (device, dtype), in the order the pairs first appear") {
  const Device d0("cpu:0"), d1("cpu:1");
  std::vector<Tensor> params = {make_param({2}, DType::Float32, 700).to(d0),
                                make_param({3}, DType::Float64, 701).to(d1).detach().requires_grad_(),
                                make_param({4}, DType::Float32, 702).to(d1).detach().requires_grad_(),
                                make_param({5}, DType::Float64, 703), make_param({6}, DType::Float32, 704)};
  RecordingSGD opt(params, {0.1, 0.9});
  using Calls = std::vector<std::tuple<Device, DType, std::vector<size_t>>>;
  for (size_t i = 0; i < params.size(); ++i)
    if (i != 2) params[i].set_grad(test::random(params[i].shape(), params[i].dtype(), 710 + i).to(params[i].device()));
  opt.step();
  CHECK(opt.calls == Calls{{d0, DType::Float32, {0, 4}}, {d1, DType::Float64, {1}}, {d0, DType::Float64, {3}}});
  params[2].set_grad(test::random({4}, DType::Float32, 720).to(d1));
  opt.calls.clear();
  opt.step();
  CHECK(opt.calls == Calls{{d0, DType::Float32, {0, 4}},
                           {d1, DType::Float64, {1}},
                           {d1, DType::Float32, {2}},
                           {d0, DType::Float64, {3}}});
  for (const auto& [name, t] : opt.state_dict().tensors)
    CHECK(t.device() == params[std::stoul(name.substr(0, name.find('.')))].device());
}

TEST_CASE("optimizer errors") {
  Tensor w = make_param({2, 3}, DType::Float64, 90);
  SUBCASE("hyperparameters") {
    CHECK_THROWS_WITH_AS(SGD({w}, {-0.1}), doctest::Contains("SGD: invalid learning rate: -0.1 (must be >= 0)"), Error);
    CHECK_THROWS_WITH_AS(SGD({w}, {0.1, 0, 0, 0, true}),
                         doctest::Contains("Nesterov momentum requires a momentum > 0 and zero dampening"), Error);
    CHECK_THROWS_WITH_AS(SGD({w}, {0.1, 0.9, 0.1, 0, true}),
                         doctest::Contains("Nesterov momentum requires a momentum > 0 and zero dampening"), Error);
    CHECK_THROWS_WITH_AS(SGD({w}, {0.1, -0.9}), doctest::Contains("SGD: invalid momentum value: -0.9"), Error);
    CHECK_THROWS_WITH_AS(SGD({w}, {0.1, 0.9, -1}), doctest::Contains("SGD: invalid dampening value: -1"), Error);
    CHECK_THROWS_WITH_AS(SGD({w}, {0.1, 0, 0, -0.01}), doctest::Contains("SGD: invalid weight_decay value: -0.01"),
                         Error);
    CHECK_THROWS_WITH_AS(Adam({w}, AdamOptions{-1e-3}), doctest::Contains("Adam: invalid learning rate: -0.001"),
                         Error);
    CHECK_THROWS_WITH_AS(Adam({w}, AdamOptions{1e-3, {1.0, 0.999}}),
                         doctest::Contains("Adam: invalid beta parameter at index 0: 1 (must be in [0, 1))"), Error);
    CHECK_THROWS_WITH_AS(AdamW({w}, AdamWOptions{1e-3, {0.9, -0.1}}),
                         doctest::Contains("AdamW: invalid beta parameter at index 1: -0.1"), Error);
    CHECK_THROWS_WITH_AS(Adam({w}, AdamOptions{1e-3, {0.9, 0.999}, -1e-8}),
                         doctest::Contains("Adam: invalid epsilon value"), Error);
    CHECK_THROWS_WITH_AS(AdamW({w}, AdamWOptions{1e-3, {0.9, 0.999}, 1e-8, -0.1}),
                         doctest::Contains("AdamW: invalid weight_decay value: -0.1"), Error);
  }
  SUBCASE("parameters") {
    Tensor non_leaf = mul(w, w);
    CHECK_THROWS_WITH_AS(SGD({w, non_leaf}, {0.1}),
                         doctest::Contains("SGD: parameter 1 is not a leaf (it was made by MulBackward)"), Error);
    CHECK_THROWS_WITH_AS(Adam({test::random({2}, DType::Float64, 91)}, AdamOptions{}),
                         doctest::Contains("Adam: parameter 0 does not require grad"), Error);
    CHECK_THROWS_WITH_AS(SGD(std::vector<Tensor>{}, {0.1}), doctest::Contains("SGD: got an empty parameter list"),
                         Error);
    CHECK_THROWS_WITH_AS(SGD({Tensor()}, {0.1}), doctest::Contains("SGD: parameter 0 is an undefined tensor"), Error);
    CHECK_THROWS_WITH_AS(SGD({w, w}, {0.1}), doctest::Contains("SGD: parameter 1 is the same tensor as parameter 0"),
                         Error);
  }
  SUBCASE("state that no longer matches a moved parameter") {
    Tensor p = make_param({3}, DType::Float64, 93);
    Adam opt({p}, AdamOptions{});
    p.set_grad(ones({3}, DType::Float64));
    opt.step();
    p.set_data(p.detach().to(Device("cpu:1")));
    p.set_grad(ones({3}, TensorOptions(DType::Float64, Device("cpu:1"))));
    CHECK_THROWS_WITH_AS(opt.step(),
                         doctest::Contains("Adam.step: state 'exp_avg' of parameter 0 is float64 [3] on cpu:0 but the "
                                           "parameter is now float64 [3] on cpu:1"),
                         Error);
  }
}

TEST_CASE("load_state_dict errors, and a failed load changes nothing") {
  std::vector<Tensor> params = {make_param({2, 3}, DType::Float64, 94), make_param({4}, DType::Float64, 95)};
  Adam adam(params, AdamOptions{0.01});
  for (const Tensor& p : params) Tensor(p).set_grad(test::random(p.shape(), DType::Float64, 96));
  adam.step();
  OptimizerState good = adam.state_dict();

  SGD sgd({make_param({2, 3}, DType::Float64, 97), make_param({4}, DType::Float64, 98)}, {0.1, 0.9});
  Tensor(sgd.params()[0]).set_grad(ones({2, 3}, DType::Float64));
  sgd.step();
  OptimizerState sgd_state = sgd.state_dict();

  Adam target({make_param({2, 3}, DType::Float64, 99), make_param({4}, DType::Float64, 100)}, AdamOptions{0.5});
  auto check_unchanged = [&] {
    CHECK(target.lr() == 0.5);
    CHECK(target.state_dict().tensors.empty());
  };
  CHECK_THROWS_WITH_AS(target.load_state_dict(sgd_state),
                       doctest::Contains("Adam.load_state_dict: the state was not saved by Adam (scalars: missing "
                                         "amsgrad, beta1, beta2, decoupled_weight_decay, eps; unexpected dampening, "
                                         "momentum, nesterov)"),
                       Error);
  check_unchanged();
  AdamW adamw({make_param({2, 3}, DType::Float64, 99), make_param({4}, DType::Float64, 100)}, AdamWOptions{});
  CHECK_THROWS_WITH_AS(adamw.load_state_dict(good),
                       doctest::Contains("AdamW.load_state_dict: the state was saved by Adam (decoupled_weight_decay = "
                                         "0), not by AdamW"),
                       Error);
  Adam one({make_param({2, 3}, DType::Float64, 101)}, AdamOptions{});
  CHECK_THROWS_WITH_AS(one.load_state_dict(good),
                       doctest::Contains("the state holds 2 parameters but this optimizer has 1"), Error);

  OptimizerState bad = good;
  bad.tensors[0].second = zeros({3, 2}, DType::Float64);
  CHECK_THROWS_WITH_AS(target.load_state_dict(bad),
                       doctest::Contains("Adam.load_state_dict: tensor '0.exp_avg' has shape [3, 2] but parameter 0 "
                                         "has shape [2, 3]"),
                       Error);
  check_unchanged();
  bad = good;
  bad.tensors.emplace_back("0.momentum_buffer", zeros({2, 3}, DType::Float64));
  CHECK_THROWS_WITH_AS(target.load_state_dict(bad), doctest::Contains("unexpected tensor '0.momentum_buffer'"), Error);
  bad = good;
  bad.tensors.emplace_back("7.exp_avg", zeros({2, 3}, DType::Float64));
  CHECK_THROWS_WITH_AS(target.load_state_dict(bad),
                       doctest::Contains("tensor '7.exp_avg' names parameter 7 but this optimizer has 2 parameters"),
                       Error);
  bad = good;
  bad.tensors.erase(bad.tensors.begin() + 1);  // 0.exp_avg_sq
  CHECK_THROWS_WITH_AS(target.load_state_dict(bad),
                       doctest::Contains("parameter 0 has taken 1 steps but the state lacks '0.exp_avg_sq'"), Error);
  bad = good;
  bad.scalars["amsgrad"] = 1;
  CHECK_THROWS_WITH_AS(target.load_state_dict(bad),
                       doctest::Contains("amsgrad is on and parameter 0 has taken 1 steps but the state lacks "
                                         "'0.max_exp_avg_sq'"),
                       Error);
  bad = good;
  bad.scalars["beta1"] = 1.5;
  CHECK_THROWS_WITH_AS(target.load_state_dict(bad), doctest::Contains("invalid beta parameter at index 0: 1.5"), Error);
  bad = good;
  bad.scalars["0.step"] = 1.5;
  CHECK_THROWS_WITH_AS(target.load_state_dict(bad), doctest::Contains("scalar '0.step' must be a non-negative whole"),
                       Error);
  check_unchanged();
  target.load_state_dict(good);
  CHECK(target.lr() == 0.01);
  CHECK(target.state_dict().tensors.size() == 4);
}

// --- learning-rate schedulers ------------------------------------------------------------

namespace {

std::unique_ptr<SGD> sgd_with_lr(double lr) {
  return std::make_unique<SGD>(std::vector<Tensor>{make_param({2}, DType::Float64, 300)}, SGDOptions{lr});
}

// The scheduler's lr after construction and after each of `epochs` steps, checked
// against `expected(epoch)` and against what the optimizer holds.
template <class F>
void check_schedule(LRScheduler& s, int epochs, F expected) {
  for (int epoch = 0; epoch <= epochs; ++epoch) {
    if (epoch > 0) s.step();
    CAPTURE(epoch);
    CHECK(s.last_epoch() == epoch);
    CHECK(s.get_last_lr() == doctest::Approx(expected(epoch)).epsilon(1e-14));
    CHECK(s.optimizer().lr() == s.get_last_lr());
  }
}

}  // namespace

TEST_CASE("StepLR, CosineAnnealingLR and LinearLR follow their closed forms") {
  SUBCASE("StepLR") {
    auto opt = sgd_with_lr(0.4);
    StepLR s(*opt, 3, 0.5);
    check_schedule(s, 10, [](int e) { return 0.4 * std::pow(0.5, e / 3); });
  }
  SUBCASE("CosineAnnealingLR, past T_max too") {
    auto opt = sgd_with_lr(0.1);
    CosineAnnealingLR s(*opt, 10, 0.001);
    check_schedule(s, 25, [](int e) { return 0.001 + (0.1 - 0.001) * (1 + std::cos(std::numbers::pi * e / 10)) / 2; });
    CHECK(s.lr_at(10) == doctest::Approx(0.001));
  }
  SUBCASE("LinearLR warm-up") {
    auto opt = sgd_with_lr(0.2);
    LinearLR s(*opt, 0.1, 1.0, 4);
    CHECK(opt->lr() == doctest::Approx(0.02));
    check_schedule(s, 8, [](int e) { return 0.2 * (0.1 + 0.9 * std::min(e, 4) / 4.0); });
  }
}

TEST_CASE("SequentialLR: linear warm-up then cosine") {
  auto opt = sgd_with_lr(0.1);
  auto warmup = std::make_shared<LinearLR>(*opt, 0.01, 1.0, 5);
  auto cosine = std::make_shared<CosineAnnealingLR>(*opt, 20);
  CHECK(cosine->base_lr() == 0.1);  // initial_lr, not the warm-up's lr
  SequentialLR s(*opt, {warmup, cosine}, {5});
  CHECK(opt->lr() == doctest::Approx(0.001));
  check_schedule(s, 30, [](int e) {
    if (e < 5) return 0.1 * (0.01 + 0.99 * e / 5.0);
    return 0.1 * (1 + std::cos(std::numbers::pi * (e - 5) / 20)) / 2;
  });
}

TEST_CASE("WarmupCosineLR: nanoGPT's get_lr, value for value") {
  // train.py's get_lr, written out as Python evaluates it.
  auto get_lr = [](double learning_rate, int it, int warmup_iters, int lr_decay_iters, double min_lr) {
    if (it < warmup_iters) return learning_rate * (it + 1) / (warmup_iters + 1);
    if (it > lr_decay_iters) return min_lr;
    double decay_ratio = static_cast<double>(it - warmup_iters) / (lr_decay_iters - warmup_iters);
    double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * decay_ratio));
    volatile double product = coeff * (learning_rate - min_lr);  // rounded, as Python rounds it
    return min_lr + product;
  };
  auto opt = sgd_with_lr(6e-4);
  WarmupCosineLR s(*opt, 10, 50, 6e-5);
  CHECK(opt->lr() == 6e-4 / 11);  // the rate of the first step
  for (int step = 0; step <= 60; ++step) {
    if (step > 0) s.step();
    CAPTURE(step);
    CHECK(s.last_epoch() == step);
    CHECK(s.get_last_lr() == get_lr(6e-4, step, 10, 50, 6e-5));
    CHECK(opt->lr() == s.get_last_lr());
  }
  // Python's values for the same arguments (float.hex() of nanoGPT's get_lr).
  const std::map<int, double> python = {{0, 0x1.c98f78c1ed4eap-15},  {5, 0x1.572b9a9171fb0p-12},
                                        {12, 0x1.38d47a29f38fep-11}, {13, 0x1.36a95b32b7fb3p-11},
                                        {21, 0x1.08f30f37cdbbdp-11}, {31, 0x1.43d12cf63fa6cp-12},
                                        {44, 0x1.7716d70318166p-14}, {49, 0x1.fe4c69886f8cdp-15}};
  for (const auto& [step, lr] : python) CHECK(s.lr_at(step) == lr);
  CHECK(s.lr_at(9) == 6e-4 * 10 / 11);                                      // the end of the warm-up
  CHECK(s.lr_at(10) == 6e-4);                                               // the peak
  CHECK(s.lr_at(30) == doctest::Approx((6e-4 + 6e-5) / 2).epsilon(1e-15));  // half way down
  CHECK(s.lr_at(50) == 6e-5);                                               // the bottom
  CHECK(s.lr_at(1000) == 6e-5);
  // No warm-up: the schedule starts at the peak.
  auto plain = sgd_with_lr(0.1);
  WarmupCosineLR cosine(*plain, 0, 4);
  CHECK(plain->lr() == 0.1);
  CHECK(cosine.lr_at(2) == doctest::Approx(0.05).epsilon(1e-15));
  CHECK(cosine.lr_at(4) == 0);
}

TEST_CASE("WarmupCosineLR: resumed from its state, the rates go on as in one run") {
  auto run = [](int stop_at, const std::map<std::string, double>* sched_state, const OptimizerState* opt_state) {
    auto opt = sgd_with_lr(0.1);
    WarmupCosineLR s(*opt, 3, 10, 0.01);
    if (opt_state) opt->load_state_dict(*opt_state);
    if (sched_state) s.load_state_dict(*sched_state);
    std::vector<double> lrs;
    for (int e = s.last_epoch(); e < stop_at; ++e) {
      s.step();
      lrs.push_back(opt->lr());
    }
    return std::make_tuple(lrs, s.state_dict(), opt->state_dict());
  };
  auto [all, s_all, o_all] = run(14, nullptr, nullptr);
  auto [first, s_mid, o_mid] = run(2, nullptr, nullptr);  // stopped in the warm-up
  CHECK(s_mid == std::map<std::string, double>{
                     {"base_lr", 0.1}, {"decay_steps", 10}, {"last_epoch", 2}, {"min_lr", 0.01}, {"warmup_steps", 3}});
  CHECK(o_mid.scalars.at("initial_lr") == 0.1);
  auto [rest, s_end, o_end] = run(14, &s_mid, &o_mid);
  first.insert(first.end(), rest.begin(), rest.end());
  CHECK(first == all);
  CHECK(s_end == s_all);
}

TEST_CASE("scheduler state round trip, with the optimizer's") {
  auto run = [](int stop_at, const std::map<std::string, double>* sched_state, const OptimizerState* opt_state) {
    auto opt = sgd_with_lr(0.1);
    auto warmup = std::make_shared<LinearLR>(*opt, 0.1, 1.0, 3);
    auto step = std::make_shared<StepLR>(*opt, 2, 0.5);
    SequentialLR s(*opt, {warmup, step}, {3});
    if (opt_state) opt->load_state_dict(*opt_state);
    if (sched_state) s.load_state_dict(*sched_state);
    std::vector<double> lrs;
    for (int e = s.last_epoch(); e < stop_at; ++e) {
      s.step();
      lrs.push_back(opt->lr());
    }
    return std::make_tuple(lrs, s.state_dict(), opt->state_dict());
  };
  auto [all, s_all, o_all] = run(9, nullptr, nullptr);
  auto [first, s_mid, o_mid] = run(4, nullptr, nullptr);
  CHECK(s_mid.at("last_epoch") == 4);
  auto [rest, s_end, o_end] = run(9, &s_mid, &o_mid);
  first.insert(first.end(), rest.begin(), rest.end());
  CHECK(first == all);
  CHECK(s_end == s_all);
}

TEST_CASE("scheduler errors") {
  auto opt = sgd_with_lr(0.1);
  CHECK_THROWS_WITH_AS(StepLR(*opt, 0), doctest::Contains("StepLR: step_size must be a whole number >= 1, got 0"),
                       Error);
  CHECK_THROWS_WITH_AS(CosineAnnealingLR(*opt, 0), doctest::Contains("CosineAnnealingLR: T_max must be"), Error);
  CHECK_THROWS_WITH_AS(LinearLR(*opt, 0.0), doctest::Contains("LinearLR: start_factor must be in (0, 1], got 0"),
                       Error);
  CHECK_THROWS_WITH_AS(LinearLR(*opt, 0.5, 1.5), doctest::Contains("LinearLR: end_factor must be in [0, 1]"), Error);
  auto a = std::make_shared<StepLR>(*opt, 2);
  auto b = std::make_shared<StepLR>(*opt, 3);
  CHECK_THROWS_WITH_AS(SequentialLR(*opt, {a, b}, {}),
                       doctest::Contains("SequentialLR: expects one milestone fewer than schedulers, got 2 schedulers "
                                         "and 0 milestones"),
                       Error);
  auto other = sgd_with_lr(0.1);
  auto c = std::make_shared<StepLR>(*other, 3);
  CHECK_THROWS_WITH_AS(SequentialLR(*opt, {a, c}, {4}),
                       doctest::Contains("SequentialLR: scheduler 1 (StepLR) acts on another optimizer"), Error);
  CHECK_THROWS_WITH_AS(SequentialLR(*opt, {a, b, a}, {4, 4}),
                       doctest::Contains("milestones must be positive and strictly increasing, got 4 at index 1"),
                       Error);
  CHECK_THROWS_WITH_AS(WarmupCosineLR(*opt, -1, 10),
                       doctest::Contains("WarmupCosineLR: warmup_steps must be a whole number >= 0, got -1"), Error);
  CHECK_THROWS_WITH_AS(WarmupCosineLR(*opt, 10, 10),
                       doctest::Contains("decay_steps must be a whole number > warmup_steps (10), got 10"), Error);
  CHECK_THROWS_WITH_AS(WarmupCosineLR(*opt, 0, 10, -1e-5),
                       doctest::Contains("WarmupCosineLR: min_lr must be finite and >= 0, got -1e-05"), Error);
  WarmupCosineLR warmup_cosine(*opt, 2, 10);
  std::map<std::string, double> shorter = warmup_cosine.state_dict();
  shorter["decay_steps"] = 1;
  CHECK_THROWS_WITH_AS(warmup_cosine.load_state_dict(shorter),
                       doctest::Contains("decay_steps must be a whole number > warmup_steps (2), got 1"), Error);
  CosineAnnealingLR cosine(*opt, 10);
  CHECK_THROWS_WITH_AS(cosine.load_state_dict(warmup_cosine.state_dict()),
                       doctest::Contains("the state was not saved by CosineAnnealingLR (missing T_max, eta_min; "
                                         "unexpected decay_steps, min_lr, warmup_steps)"),
                       Error);
  CHECK_THROWS_WITH_AS(cosine.load_state_dict(a->state_dict()),
                       doctest::Contains("CosineAnnealingLR.load_state_dict: the state was not saved by "
                                         "CosineAnnealingLR (missing T_max, eta_min; unexpected gamma, step_size)"),
                       Error);
}

// --- clip_grad_norm_ ---------------------------------------------------------------------

namespace {

double naive_norm(const std::vector<Vec>& grads, double p) {
  double acc = 0;
  for (const Vec& g : grads)
    for (double x : g) acc = std::isinf(p) ? std::max(acc, std::fabs(x)) : acc + std::pow(std::fabs(x), p);
  return std::isinf(p) ? acc : std::pow(acc, 1 / p);
}

}  // namespace

TEST_CASE("clip_grad_norm_: norms, clipping, parameters without grad") {
  const double kInf = std::numeric_limits<double>::infinity();
  for (DType dtype : {DType::Float32, DType::Float64}) {
    for (double p : {2.0, 1.0, 3.0, kInf}) {
      CAPTURE(dtype);
      CAPTURE(p);
      std::vector<Tensor> params = {make_param({3, 5}, dtype, 400), make_param({7}, dtype, 401),
                                    make_param({2}, dtype, 402)};
      params[0].set_grad(test::random({3, 5}, dtype, 403));
      params[1].set_grad(test::noncontiguous(test::random({7}, dtype, 404)));
      std::vector<Vec> grads = {values(params[0].grad()), values(params[1].grad())};
      double expected = naive_norm(grads, p);
      double tol = dtype == DType::Float32 ? 1e-6 : 1e-13;

      // A large max_norm leaves the gradients exactly as they were.
      Tensor norm = clip_grad_norm_(params, 10 * expected, p);
      CHECK(norm.dim() == 0);
      CHECK(norm.dtype() == DType::Float64);
      double total = norm.item();
      CHECK(total == doctest::Approx(expected).epsilon(tol));
      CHECK(values(params[0].grad()) == grads[0]);
      CHECK(values(params[1].grad()) == grads[1]);
      CHECK(!params[2].grad().defined());

      // A small one scales every gradient by max_norm / (total + 1e-6).
      double max_norm = 0.25 * expected;
      total = clip_grad_norm_(params, max_norm, p).item();
      double coef = max_norm / (total + 1e-6);
      for (size_t i = 0; i < 2; ++i) {
        Vec scaled = grads[i];
        for (double& x : scaled) x *= coef;
        CHECK_CLOSE(params[i].grad(), from_values(scaled, params[i].shape(), DType::Float64), tol, 10 * tol);
      }
      double after = naive_norm({values(params[0].grad()), values(params[1].grad())}, p);
      CHECK(after == doctest::Approx(max_norm).epsilon(1e-5));
    }
  }
}

// Gradients spread over cpu:0 and cpu:1 (float32 and float64, tensors larger than the
// kernels' summation blocks) against the same gradients all on cpu:0. Tolerances: the
// norm is combined from per-(device, dtype) float64 partial sums, so it differs from the
// one-device norm only by float64 reassociation: rtol 1e-13. The clipped gradients then
// differ by the coefficient's rounding: rtol 1e-13 for float64, 5e-7 (a couple of ulp)
// for float32. The inf-norm (a max) is exact: bitwise.
TEST_CASE("clip_grad_norm_: gradients on two devices give the one-device norm and clipping") {
  const double kInf = std::numeric_limits<double>::infinity();
  const std::vector<std::tuple<Shape, DType, Device>> layout = {{{20001}, DType::Float32, Device("cpu:1")},
                                                                {{3, 5}, DType::Float64, Device("cpu:0")},
                                                                {{9000}, DType::Float64, Device("cpu:1")},
                                                                {{12345}, DType::Float32, Device("cpu:0")},
                                                                {{7}, DType::Float32, Device("cpu:1")}};
  for (double p : {2.0, 1.0, 3.0, kInf}) {
    CAPTURE(p);
    std::vector<Tensor> spread, one;
    for (size_t i = 0; i < layout.size(); ++i) {
      const auto& [shape, dtype, device] = layout[i];
      Tensor grad = test::random(shape, dtype, 420 + i);
      spread.push_back(make_param(shape, dtype, 430 + i).to(device).detach().requires_grad_());
      spread.back().set_grad(grad.to(device));
      one.push_back(make_param(shape, dtype, 430 + i));
      one.back().set_grad(grad.clone());
    }
    // No clipping: the norms alone.
    const double expected = clip_grad_norm_(one, 1e30, p).item();
    const Tensor spread_norm = clip_grad_norm_(spread, 1e30, p);
    CHECK(spread_norm.device() == Device("cpu:1"));  // the first gradient's device
    const double total = spread_norm.item();
    if (std::isinf(p))
      CHECK(total == expected);
    else
      CHECK(total == doctest::Approx(expected).epsilon(1e-13));
    // Clipping to a tenth of the norm.
    clip_grad_norm_(one, 0.1 * expected, p);
    clip_grad_norm_(spread, 0.1 * expected, p);
    for (size_t i = 0; i < layout.size(); ++i) {
      CAPTURE(i);
      CHECK(spread[i].grad().device() == std::get<2>(layout[i]));
      if (std::isinf(p))
        CHECK(same_bits(spread[i].grad(), one[i].grad()));
      else
        CHECK_CLOSE(spread[i].grad(), one[i].grad(), 0, one[i].dtype() == DType::Float32 ? 5e-7 : 1e-13);
    }
  }
}

TEST_CASE("clip_grad_norm_: several devices, large tensors, no grads, non-finite") {
  std::vector<Tensor> none = {make_param({3}, DType::Float64, 410)};
  CHECK(clip_grad_norm_(none, 1.0).item() == 0.0);

  Tensor a = make_param({4}, DType::Float64, 411);
  Tensor b = make_param({3}, DType::Float64, 412).to(Device("cpu:1")).detach().requires_grad_();
  a.set_grad(test::random({4}, DType::Float64, 413));
  b.set_grad(test::random({3}, DType::Float64, 414).to(Device("cpu:1")));
  double expected = naive_norm({values(a.grad()), values(b.grad())}, 2);
  CHECK(clip_grad_norm_({a, b}, 1e9).item() == doctest::Approx(expected).epsilon(1e-14));

  auto norm_on = [](int threads) {
    set_num_threads(threads);
    Tensor big = make_param({100003}, DType::Float32, 415);
    big.set_grad(test::random({100003}, DType::Float32, 416));
    return clip_grad_norm_({big}, 1e9, 3.0).item();
  };
  double one = norm_on(1), two = norm_on(2);
  set_num_threads(2);
  CHECK(one == two);

  Tensor c = make_param({3}, DType::Float64, 417);
  c.set_grad(tensor(Vec{1.0, std::numeric_limits<double>::infinity(), 2.0}));
  CHECK_THROWS_WITH_AS(clip_grad_norm_({c}, 1.0, 2.0, true),
                       doctest::Contains("clip_grad_norm_: the total norm of order 2 of the gradients is inf"), Error);
  CHECK(values(c.grad()) == Vec{1.0, std::numeric_limits<double>::infinity(), 2.0});  // nothing was scaled
  // Without the flag, as PyTorch: an infinite norm scales by 0 (inf times 0 is NaN), a NaN
  // norm makes every gradient NaN.
  clip_grad_norm_({c}, 1.0);
  for (double v : values(c.grad())) CHECK(std::isnan(v) == (v != 0.0));
  CHECK(values(c.grad())[0] == 0.0);
  Tensor d = make_param({2}, DType::Float64, 418);
  d.set_grad(tensor(Vec{1.0, std::numeric_limits<double>::quiet_NaN()}));
  CHECK(std::isnan(clip_grad_norm_({d}, 1.0).item()));
  for (double v : values(d.grad())) CHECK(std::isnan(v));
  CHECK_THROWS_WITH_AS(clip_grad_norm_({c}, -1.0), doctest::Contains("max_norm must be >= 0, got -1"), Error);
  CHECK_THROWS_WITH_AS(clip_grad_norm_({c}, 1.0, 0.0), doctest::Contains("norm_type must be > 0 or INFINITY"), Error);
}
