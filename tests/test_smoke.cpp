#include <doctest/doctest.h>

#include <weft.h>

using namespace weft;

TEST_CASE("smoke: add and backward") {
  Tensor a = tensor({1, 2, 3}).requires_grad_();
  Tensor b = tensor({4, 5, 6}).requires_grad_();
  Tensor c = sum(mul(add(a, b), b));
  c.backward();
  CHECK(c.item() == doctest::Approx(5 * 4 + 7 * 5 + 9 * 6));
  CHECK(a.grad().to_vector<float>() == std::vector<float>{4, 5, 6});
  CHECK(b.grad().to_vector<float>() == std::vector<float>{9, 12, 15});
}
