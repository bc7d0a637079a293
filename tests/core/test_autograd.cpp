// Autograd: the engine, accumulation, retain_graph, hooks, in-place rules, saved-tensor
// versions, determinism, and gradcheck itself.
#include "test_util.h"

using namespace weft;
using doctest::Contains;

TEST_CASE("chain rule, shared inputs and accumulation") {
  Tensor x = test::leaf({3}, 1);
  Tensor y = sum(mul(mul(x, x), x));  // sum x^3, x used three times
  y.backward();
  CHECK_CLOSE(x.grad(), mul(mul(x.detach(), x.detach()), 3.0), 1e-12, 1e-12);
  // A second graph accumulates into .grad.
  sum(mul(x, 2.0)).backward();
  CHECK_CLOSE(x.grad(), add(mul(mul(x.detach(), x.detach()), 3.0), 2.0), 1e-12, 1e-12);
  x.set_grad(Tensor());
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("backward needs a gradient for a tensor with several elements") {
  Tensor x = test::leaf({2, 2}, 2);
  Tensor y = mul(x, 3.0);
  CHECK_THROWS_WITH_AS(y.backward(), Contains("implicitly created only for one-element outputs"), Error);
  Tensor g = test::random({2, 2}, DType::Float64, 3);
  y.backward(g);
  CHECK_CLOSE(x.grad(), mul(g, 3.0), 1e-12, 0);
  CHECK_THROWS_WITH_AS(y.backward(ones({3})), Contains("returned a gradient of shape [3]"), Error);
  CHECK_THROWS_WITH_AS(zeros({1}).backward(), Contains("does not require grad"), Error);
}

TEST_CASE("retain_graph") {
  Tensor x = test::leaf({4}, 4);
  Tensor y = sum(exp(x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  CHECK_CLOSE(x.grad(), mul(exp(x.detach()), 2.0), 1e-12, 1e-12);
  CHECK_THROWS_WITH_AS(y.backward(), Contains("backward through the graph a second time"), Error);
}

TEST_CASE("detach, NoGradGuard, requires_grad rules") {
  Tensor x = test::leaf({3}, 5);
  Tensor d = mul(x, 2.0).detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  {
    NoGradGuard no_grad;
    Tensor y = mul(x, 2.0);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  CHECK(GradMode::is_enabled());
  Tensor y = mul(x, 2.0);
  CHECK_THROWS_WITH_AS(y.requires_grad_(false), Contains("only leaf tensors can change requires_grad"), Error);
  CHECK_THROWS_WITH_AS(zeros({2}, DType::Int64).requires_grad_(), Contains("only floating-point tensors"), Error);
  // A gradient stops at a detached tensor.
  Tensor z = sum(add(mul(x, 2.0).detach(), x));
  z.backward();
  CHECK_CLOSE(x.grad(), ones({3}, DType::Float64), 0, 0);
}

TEST_CASE("tensor hooks see and may replace gradients") {
  Tensor x = test::leaf({3}, 6);
  Tensor h = mul(x, 2.0);
  Tensor seen;
  h.register_hook([&](const Tensor& g) {
    seen = g.clone();
    return mul(g, 10.0);
  });
  sum(mul(h, 3.0)).backward();
  CHECK_CLOSE(seen, full({3}, 3.0, DType::Float64), 0, 0);
  CHECK_CLOSE(x.grad(), full({3}, 60.0, DType::Float64), 0, 0);

  Tensor w = test::leaf({2}, 7);
  HookHandle handle = w.register_hook([](const Tensor& g) { return neg(g); });
  sum(w).backward();
  CHECK_CLOSE(w.grad(), full({2}, -1.0, DType::Float64), 0, 0);
  w.remove_hook(handle);
  w.set_grad(Tensor());
  sum(w).backward();
  CHECK_CLOSE(w.grad(), full({2}, 1.0, DType::Float64), 0, 0);

  Tensor bad = test::leaf({2}, 8);
  bad.register_hook([](const Tensor&) { return zeros({5}, DType::Float64); });
  CHECK_THROWS_WITH_AS(sum(bad).backward(), Contains("returned a gradient [5]"), Error);
}

TEST_CASE("post-accumulate-grad hooks run after .grad is complete") {
  Tensor w = test::leaf({3}, 9);
  std::vector<double> observed;
  HookHandle handle = w.register_post_accumulate_grad_hook([&](const Tensor& p) {
    observed.push_back(p.grad().to_vector<double>()[0]);
  });
  // w feeds two branches; the hook must fire once, with both contributions summed.
  Tensor y = add(sum(mul(w, 2.0)), sum(mul(w, 5.0)));
  y.backward();
  REQUIRE(observed.size() == 1);
  CHECK(observed[0] == 7.0);
  y = sum(w);
  y.backward();
  REQUIRE(observed.size() == 2);
  CHECK(observed[1] == 8.0);  // accumulated
  w.remove_hook(handle);
  sum(w).backward();
  CHECK(observed.size() == 2);
  CHECK_THROWS_WITH_AS(mul(w, 2.0).register_post_accumulate_grad_hook([](const Tensor&) {}),
                       Contains("only leaf tensors that require grad"), Error);
}

TEST_CASE("execution order is reverse creation order, the same every run") {
  // Three layers created in order; their gradients must be ready last layer first, as
  // DDP's bucket order assumes.
  std::vector<Tensor> params = {test::leaf({4}, 11), test::leaf({4}, 12), test::leaf({4}, 13)};
  auto run = [&] {
    std::vector<int> order;
    std::vector<HookHandle> handles;
    for (int i = 0; i < 3; ++i)
      handles.push_back(params[i].register_post_accumulate_grad_hook([&order, i](const Tensor&) { order.push_back(i); }));
    Tensor h = test::random({4}, DType::Float64, 14);
    for (const Tensor& p : params) h = tanh(mul(h, p));
    sum(h).backward();
    for (int i = 0; i < 3; ++i) params[i].remove_hook(handles[i]);
    return order;
  };
  CHECK(run() == std::vector<int>{2, 1, 0});
  CHECK(run() == std::vector<int>{2, 1, 0});
}

TEST_CASE("retain_grad keeps a non-leaf's gradient") {
  Tensor x = test::leaf({3}, 15);
  Tensor h = mul(x, 4.0);
  h.retain_grad();
  CHECK(h.retains_grad());
  sum(mul(h, h)).backward();
  CHECK_CLOSE(h.grad(), mul(h.detach(), 2.0), 1e-12, 1e-12);
  CHECK_CLOSE(x.grad(), mul(h.detach(), 8.0), 1e-12, 1e-12);
}

TEST_CASE("in-place ops under autograd") {
  Tensor w = test::leaf({3}, 16);
  CHECK_THROWS_WITH_AS(add_(w, 1.0), Contains("a leaf tensor that requires grad"), Error);
  {
    NoGradGuard no_grad;
    add_(w, 1.0);  // allowed: this is how an optimizer updates parameters
  }

  // A non-leaf may be modified in place; the gradient accounts for it.
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor h = mul(in[0], in[1]);
    mul_(h, in[1]);  // h = a * b * b
    add_(h, in[0]);  // h = a * b^2 + a
    relu_(h);
    return h;
  };
  CHECK_GRADCHECK(fn, (std::vector<Tensor>{test::leaf({5}, 17), test::leaf({5}, 18)}));

  // In-place on a view while recording is refused rather than silently wrong.
  Tensor base = mul(test::leaf({4}, 19), 1.0);
  Tensor view = base.narrow(0, 0, 2);
  CHECK_THROWS_WITH_AS(mul_(view, 2.0), Contains("in-place operation on a view"), Error);
}

TEST_CASE("a saved tensor changed in place is detected") {
  Tensor x = test::leaf({3}, 20);
  Tensor h = add(x, 0.0);
  Tensor y = sum(mul(h, x));  // saves h
  {
    NoGradGuard no_grad;
    mul_(h, 2.0);
  }
  CHECK_THROWS_WITH_AS(y.backward(), Contains("modified by an in-place operation"), Error);
}

TEST_CASE("unused outputs of a multi-output node get zero gradients") {
  // select() of one part of x: the gradient for the other parts is zero.
  Tensor x = test::leaf({2, 3}, 21);
  Tensor y = sum(x.select(0, 1));
  y.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 1, 1, 1});
}

TEST_CASE("the engine checks what a backward function returns") {
  Tensor x = test::leaf({3}, 22);
  Tensor out = x.detach().clone();
  set_history(out, make_node("BrokenBackward", [](const GradList&) -> GradList { return {zeros({4}, DType::Float64)}; }, x));
  CHECK_THROWS_WITH_AS(sum(out).backward(), Contains("BrokenBackward returned a gradient of shape [4]"), Error);
}

TEST_CASE("gradcheck catches a wrong gradient") {
  auto wrong = [](const std::vector<Tensor>& in) {
    Tensor out = mul(in[0].detach(), in[0].detach());
    if (any_requires_grad(in[0]))
      set_history(out, make_node("WrongSquareBackward",
                                 [x = in[0]](const GradList& g) -> GradList { return {mul(g[0], x)}; },  // misses a 2
                                 in[0]));
    return out;
  };
  GradcheckResult r = gradcheck(wrong, {test::leaf({3}, 23)});
  CHECK_FALSE(r.ok);
  CHECK(r.message.find("analytic") != std::string::npos);
  CHECK_THROWS_WITH_AS(gradcheck(wrong, {test::leaf({3}, 23).to(DType::Float32)}),
                       Contains("must be a float64 CPU leaf tensor, got float32"), Error);
  CHECK_THROWS_WITH_AS(gradcheck(wrong, {test::random({3})}), Contains("no input requires grad"), Error);
}

TEST_CASE("views are differentiable") {
  auto views = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];  // [2, 3, 4]
    Tensor a = x.permute({2, 0, 1}).reshape({4, 6});
    Tensor b = x.narrow(2, 1, 2).transpose(0, 1).flatten();
    Tensor c = x.select(1, 2).unsqueeze(0).expand({3, 2, 4}).squeeze();
    Tensor d = x.slice(2, 0, 4, 3);
    return add(add(sum(mul(a, a)), sum(mul(b, exp(b)))), add(sum(mul(c, c)), sum(tanh(d))));
  };
  CHECK_GRADCHECK(views, {test::leaf({2, 3, 4}, 24)});
  CHECK_GRADCHECK(views, {test::noncontiguous(test::random({2, 3, 4}, DType::Float64, 25)).requires_grad_()});
}

TEST_CASE("clone, copy_ and device moves are differentiable") {
  auto moves = [](const std::vector<Tensor>& in) {
    Tensor on1 = mul(in[0].to(Device("cpu:1")), 3.0);
    Tensor back = on1.to(kCPU).clone();
    Tensor dst = zeros({2, 3}, DType::Float64);
    dst = mul(dst, 1.0);  // a non-leaf, so copy_ may record
    dst.copy_(in[1]);     // broadcast [3] -> [2, 3]
    return add(mul(back, back), dst);
  };
  CHECK_GRADCHECK(moves, (std::vector<Tensor>{test::leaf({2, 3}, 26), test::leaf({3}, 27)}));
}
