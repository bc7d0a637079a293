// Printing a tensor the way PyTorch users expect to read one: nested brackets, aligned
// columns, "..." past 1000 elements, then dtype, device and autograd state.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "core/autograd.h"

namespace weft {

namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  DType dtype;
  bool scientific = false;
  int width = 1;

  std::string format(double v) const {
    std::ostringstream out;
    if (dtype == DType::Bool) {
      out << (v != 0 ? "true" : "false");
    } else if (!is_floating(dtype) && !is_half_precision(dtype)) {
      out << static_cast<int64_t>(v);
    } else if (std::isnan(v)) {
      out << "nan";  // as PyTorch prints any NaN; 0.0 / 0.0 (an empty mean) is -nan on x86
    } else if (std::isinf(v)) {
      out << v;
    } else if (scientific) {
      out << std::scientific << std::setprecision(4) << v;
    } else {
      out << std::fixed << std::setprecision(4) << v;
    }
    return out.str();
  }
};

// Ends a row: `lines` newlines (one per dim closed), then the indent of the next row.
void break_row(std::ostream& out, int64_t lines, int indent) {
  for (int64_t i = 0; i < lines; ++i) out.put('\n');
  for (int i = 0; i < indent; ++i) out.put(' ');
}

void print_values(std::ostream& out, const Tensor& t, const Formatter& f, bool summarize, int indent) {
  if (t.dim() == 0) {
    std::string s = f.format(t.item());
    out << std::string(f.width - std::min<int>(f.width, static_cast<int>(s.size())), ' ') << s;
    return;
  }
  int64_t n = t.size(0);
  out << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      out << "...,";
      i = n - kEdgeItems - 1;
      if (t.dim() == 1) out << ' ';
      else break_row(out, 1, indent + 1);
      continue;
    }
    print_values(out, t.select(0, i), f, summarize, indent + 1);
    if (i + 1 == n) continue;
    out << ',';
    if (t.dim() == 1) out << ' ';
    else break_row(out, t.dim() - 1, indent + 1);
  }
  out << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  if (!tensor.defined()) return out << "tensor(undefined)";
  NoGradGuard no_grad;
  Tensor host = tensor.detach().to(kCPU);
  Formatter f{host.dtype()};
  bool summarize = host.numel() > kSummarizeAbove;
  if (host.numel() > 0) {
    Tensor values = host.to(DType::Float64).contiguous();
    const double* p = values.data_ptr<double>();
    double max_abs = 0, min_abs = INFINITY;
    for (int64_t i = 0; i < values.numel(); ++i) {
      double a = std::fabs(p[i]);
      if (!std::isfinite(a)) continue;
      max_abs = std::max(max_abs, a);
      if (a > 0) min_abs = std::min(min_abs, a);
    }
    f.scientific = (is_floating(f.dtype) || is_half_precision(f.dtype)) && (max_abs >= 1e8 || min_abs < 1e-4);
    for (int64_t i = 0; i < values.numel(); ++i) f.width = std::max<int>(f.width, f.format(p[i]).size());
  }
  out << "tensor(";
  if (host.numel() == 0)
    out << "[]";
  else
    print_values(out, host, f, summarize, 7);
  if (host.dim() != 1 || host.numel() == 0) out << ", shape=" << tensor.shape();
  out << ", dtype=" << tensor.dtype() << ", device=" << tensor.device();
  if (auto fn = tensor.grad_fn())
    out << ", grad_fn=<" << fn->name() << ">";
  else if (tensor.requires_grad())
    out << ", requires_grad=true";
  return out << ')';
}

}  // namespace weft
