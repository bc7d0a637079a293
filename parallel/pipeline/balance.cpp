// Stages balanced by measured layer times; see balance.h.
#include "parallel/pipeline/balance.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/stream.h"
#include "nn/activation.h"

namespace weft::parallel::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start, Device device) {
  synchronize(device);  // a GPU's kernels are done, not only queued
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace

std::vector<double> layer_times(const nn::Sequential& model, const Tensor& sample, Device device, int rounds) {
  WEFT_CHECK(rounds >= 1, "layer_times: at least one round, got ", rounds);
  WEFT_CHECK(sample.defined(), "layer_times: no sample (give one micro-batch's input)");
  WEFT_CHECK(!model.empty(), "layer_times: the Sequential has no layers");
  WEFT_CHECK(GradMode::is_enabled(), "layer_times: gradients are off (a NoGradGuard); it times backward too");
  // What the layers draw (dropout) goes back to their generators afterwards, also on an error.
  struct Rewind {
    std::vector<Generator*> generators;
    std::vector<uint64_t> offsets = {};
    ~Rewind() {
      for (size_t i = 0; i < offsets.size(); ++i) generators[i]->set_offset(offsets[i]);
    }
  } rewind{nn::forward_generators(model, device)};
  for (Generator* g : rewind.generators) rewind.offsets.push_back(g->offset());
  std::vector<double> medians;
  Tensor x = sample.to(device);
  for (const auto& [name, original] : model.named_children()) {
    const auto layer = original->clone(device);  // its gradients and statistics are its own
    Tensor in = x.detach();
    if (!medians.empty() && is_floating(in.dtype())) in.requires_grad_();
    std::vector<double> times;
    Tensor out;
    for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
      in.set_grad(Tensor());  // every round's backward writes its gradients, as a step after zero_grad does
      for (Tensor p : layer->parameters()) p.set_grad(Tensor());
      synchronize(device);
      const Clock::time_point start = Clock::now();
      out = layer->forward(in);
      if (out.requires_grad()) out.backward(ones_like(out));
      if (round > 0) times.push_back(seconds_since(start, device));
    }
    medians.push_back(median(times));
    x = out.detach();
  }
  return medians;
}

std::vector<size_t> balance_by_cost(const std::vector<double>& costs, int stages) {
  const size_t n = costs.size();
  WEFT_CHECK(stages >= 1, "balance_by_cost: at least one stage, got ", stages);
  WEFT_CHECK(n >= static_cast<size_t>(stages), "balance_by_cost: ", stages, " stages need at least as many layers; ",
             "got the costs of ", n);
  for (size_t i = 0; i < n; ++i)
    WEFT_CHECK(std::isfinite(costs[i]) && costs[i] >= 0, "balance_by_cost: layer ", i, "'s cost is ", costs[i],
               "; costs must be finite and not negative");
  std::vector<double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const auto cost = [&](size_t begin, size_t end) { return prefix[end] - prefix[begin]; };
  const double inf = std::numeric_limits<double>::infinity();
  const size_t k_stages = static_cast<size_t>(stages);
  // First the least largest stage: worst[k][i], of the first i layers in k + 1 stages.
  std::vector<std::vector<double>> worst(k_stages, std::vector<double>(n + 1, inf));
  for (size_t i = 1; i <= n; ++i) worst[0][i] = cost(0, i);
  for (size_t k = 1; k < k_stages; ++k)
    for (size_t i = k + 1; i <= n; ++i)
      for (size_t m = k; m < i; ++m) worst[k][i] = std::min(worst[k][i], std::max(worst[k - 1][m], cost(m, i)));
  const double bound = worst[k_stages - 1][n];
  // Then, of the splits whose stages all stay within it, the most even: the least sum of
  // squared stage costs (squares[k][i]), the last stage starting at cut[k][i], the latest
  // among equals.
  std::vector<std::vector<double>> squares(k_stages, std::vector<double>(n + 1, inf));
  std::vector<std::vector<size_t>> cut(k_stages, std::vector<size_t>(n + 1, 0));
  for (size_t i = 1; i <= n; ++i)
    if (cost(0, i) <= bound) squares[0][i] = cost(0, i) * cost(0, i);
  for (size_t k = 1; k < k_stages; ++k)
    for (size_t i = k + 1; i <= n; ++i)
      for (size_t m = k; m < i; ++m) {
        const double last = cost(m, i);
        if (last > bound || squares[k - 1][m] == inf) continue;
        if (squares[k - 1][m] + last * last <= squares[k][i]) {
          squares[k][i] = squares[k - 1][m] + last * last;
          cut[k][i] = m;
        }
      }
  std::vector<size_t> balance(k_stages);
  size_t end = n;
  for (size_t k = k_stages - 1; k > 0; --k) {
    balance[k] = end - cut[k][end];
    end = cut[k][end];
  }
  balance[0] = end;
  return balance;
}

std::vector<size_t> balance_by_time(const nn::Sequential& model, const Tensor& sample, int stages, Device device,
                                    int rounds) {
  return balance_by_cost(layer_times(model, sample, device, rounds), stages);
}

Balancer by_time(Tensor sample, int rounds) {
  return [sample = std::move(sample), rounds](const nn::Sequential& model, int stages, Device device) {
    return balance_by_time(model, sample, stages, device, rounds);
  };
}

}  // namespace weft::parallel::pipeline
