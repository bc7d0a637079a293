// Trains y = 3x - 1 with two parameters and plain gradient descent; exits 0 when the
// fit is right. Uses only the installed headers and library.
#include <cmath>
#include <iostream>

#include <weft.h>

int main() {
  using namespace weft;
  Generator gen(0);
  Tensor x = randn({64}, DType::Float64, &gen);
  Tensor y = sub(mul(x, 3.0), 1.0);
  Tensor w = zeros({1}, DType::Float64).requires_grad_();
  Tensor b = zeros({1}, DType::Float64).requires_grad_();
  for (int step = 0; step < 200; ++step) {
    Tensor err = sub(add(mul(x, w), b), y);
    Tensor loss = mean(mul(err, err));
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    loss.backward();
    NoGradGuard no_grad;
    sub_(w, mul(w.grad(), 0.1));
    sub_(b, mul(b.grad(), 0.1));
  }
  std::cout << "w = " << w.item() << ", b = " << b.item() << "\n";
  return std::fabs(w.item() - 3.0) < 1e-3 && std::fabs(b.item() + 1.0) < 1e-3 ? 0 : 1;
}
