// float16 and bfloat16: every 16-bit value converts to float and back unchanged; rounding
// to 16 bits is checked against a search of each format's whole table of values (nearest,
// ties to even, once); and tensors of both are created, copied, converted, printed and
// refused by the ops that compute.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "kernels/host_device_math.h"
#include "test_util.h"

using namespace weft;
using doctest::Contains;

namespace {

// One 16-bit format, and the reference rounding: a binary search of its finite values.
struct Format {
  const char* name;
  int exponent_bits, mantissa_bits;
  uint16_t (*round)(double);
  float (*widen)(uint16_t);

  uint16_t infinity() const { return static_cast<uint16_t>(((1u << exponent_bits) - 1) << mantissa_bits); }
  uint16_t sign_bit() const { return static_cast<uint16_t>(1u << (exponent_bits + mantissa_bits)); }
  bool is_nan(uint16_t b) const { return (b & ~sign_bit() & 0xffff) > infinity(); }

  // (value, bits) of every finite non-negative value, ascending, and then 2^(bias + 1) as
  // the infinity's bits: the value a tie above the largest finite value rounds to (the
  // largest has an odd mantissa, so ties go up, as IEEE 754 says).
  std::vector<std::pair<double, uint16_t>> grid() const {
    std::vector<std::pair<double, uint16_t>> out;
    for (uint32_t b = 0; b < infinity(); ++b) {
      const auto bits = static_cast<uint16_t>(b);
      out.emplace_back(widen(bits), bits);
    }
    out.emplace_back(std::ldexp(1.0, (1 << (exponent_bits - 1))), infinity());
    return out;
  }

  uint16_t reference(double v, const std::vector<std::pair<double, uint16_t>>& g) const {
    const uint16_t sign = std::signbit(v) ? sign_bit() : 0;
    const double a = std::fabs(v);
    if (a >= g.back().first) return sign | infinity();
    auto hi = std::lower_bound(g.begin(), g.end(), a, [](const auto& e, double x) { return e.first < x; });
    if (hi->first == a) return sign | hi->second;
    auto lo = hi - 1;
    const double down = a - lo->first, up = hi->first - a;  // exact: both are within one binade of a
    if (down < up) return sign | lo->second;
    if (up < down) return sign | hi->second;
    return sign | ((lo->second & 1) ? hi->second : lo->second);
  }
};

const Format kHalf{"float16", 5, 10, [](double v) { return to_half(v).bits; },
                   [](uint16_t b) { return to_float(Half{b}); }};
const Format kBFloat16{"bfloat16", 8, 7, [](double v) { return to_bfloat16(v).bits; },
                       [](uint16_t b) { return to_float(BFloat16{b}); }};

// The values to round: every grid value, every midpoint between neighbours, the doubles
// either side of each midpoint (which a first rounding to float would move onto it), and
// random doubles of every magnitude, all with both signs.
std::vector<double> probes(const std::vector<std::pair<double, uint16_t>>& g, uint64_t seed) {
  std::vector<double> out;
  for (size_t i = 0; i + 1 < g.size(); ++i) {
    const double mid = (g[i].first + g[i + 1].first) / 2;  // exact in double
    for (double v : {g[i].first, mid, std::nextafter(mid, 0.0), std::nextafter(mid, INFINITY)}) {
      out.push_back(v);
      out.push_back(-v);
    }
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-160, 140);
  for (int i = 0; i < 200000; ++i) out.push_back((i % 2 ? -1 : 1) * std::ldexp(unit(rng), exponent(rng)));
  return out;
}

}  // namespace

TEST_CASE("every 16-bit value widens to float exactly and rounds back to itself") {
  for (const Format* f : {&kHalf, &kBFloat16}) {
    CAPTURE(f->name);
    int nans = 0, mismatches = 0;
    for (uint32_t b = 0; b <= 0xffff; ++b) {
      const auto bits = static_cast<uint16_t>(b);
      const float wide = f->widen(bits);
      if (f->is_nan(bits)) {
        nans += std::isnan(wide) ? 1 : 0;
        // NaN stays NaN, keeps its sign, and comes back quiet.
        const uint16_t back = f->round(wide);
        if (!f->is_nan(back) || (back & f->sign_bit()) != (bits & f->sign_bit())) ++mismatches;
        continue;
      }
      if (f->round(wide) != bits || f->round(static_cast<double>(wide)) != bits) ++mismatches;
    }
    CHECK(mismatches == 0);
    CHECK(nans == 2 * (f->sign_bit() - 1 - f->infinity()));
  }
}

TEST_CASE("rounding to 16 bits: nearest, ties to even, once, overflow to infinity") {
  for (const Format* f : {&kHalf, &kBFloat16}) {
    CAPTURE(f->name);
    const auto g = f->grid();
    int wrong = 0;
    for (double v : probes(g, 7)) {
      const uint16_t got = f->round(v), want = f->reference(v, g);
      if (got != want && ++wrong <= 5) {
        std::ostringstream out;
        out << f->name << ": " << v << " rounds to 0x" << std::hex << got << ", expected 0x" << want;
        MESSAGE(out.str());
      }
    }
    CHECK(wrong == 0);
    // The specials.
    CHECK(f->round(INFINITY) == f->infinity());
    CHECK(f->round(-INFINITY) == (f->sign_bit() | f->infinity()));
    CHECK(f->round(-0.0) == f->sign_bit());
    CHECK(f->is_nan(f->round(NAN)));
    CHECK(f->round(std::numeric_limits<double>::denorm_min()) == 0);
  }
  // Known bits: the largest float16, the first value that overflows, the smallest subnormal
  // and the tie below it, a double just above a tie that a float would round onto it.
  CHECK(to_half(65504.0).bits == 0x7bff);
  CHECK(to_half(65519.99).bits == 0x7bff);
  CHECK(to_half(65520.0).bits == 0x7c00);
  CHECK(to_half(std::ldexp(1.0, -24)).bits == 0x0001);
  CHECK(to_half(std::ldexp(1.0, -25)).bits == 0x0000);
  CHECK(to_half(std::ldexp(3.0, -26)).bits == 0x0001);
  const double above_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  CHECK(static_cast<float>(above_tie) == 1.0f + std::ldexp(1.0f, -11));  // through float it would be a tie ...
  CHECK(to_half(static_cast<float>(above_tie)).bits == 0x3c00);          // ... broken to even, downwards
  CHECK(to_half(above_tie).bits == 0x3c01);                              // but it is above the tie
  CHECK(to_bfloat16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)).bits == 0x3f81);
  CHECK(to_bfloat16(3.4e38).bits == 0x7f80);  // beyond bfloat16's largest (3.39e38)
  CHECK(to_float(BFloat16{0x7f7f}) == 3.3895313892515355e38f);
}

TEST_CASE("rounding from float (the fast path) gives the bits of rounding the float as a double") {
  // Float bit patterns in steps of 251 (17 million: every exponent, NaNs and subnormals
  // included), and the floats either side of every 16-bit value and midpoint.
  std::vector<float> floats;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 251) {
    const auto bits = static_cast<uint32_t>(b);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    floats.push_back(f);
  }
  for (const Format* f : {&kHalf, &kBFloat16}) {
    const auto g = f->grid();
    for (size_t i = 0; i + 1 < g.size(); ++i) {
      const auto mid = static_cast<float>((g[i].first + g[i + 1].first) / 2);  // exact: 12 or 9 bits
      for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        floats.push_back(v);
        floats.push_back(-v);
      }
    }
  }
  int64_t half_wrong = 0, bfloat_wrong = 0;
  for (float v : floats) {
    const Half h = to_half(v), hd = to_half(static_cast<double>(v));
    const BFloat16 b = to_bfloat16(v), bd = to_bfloat16(static_cast<double>(v));
    half_wrong += h.bits != hd.bits;
    bfloat_wrong += b.bits != bd.bits;
  }
  CHECK(half_wrong == 0);
  CHECK(bfloat_wrong == 0);
}

TEST_CASE("hd::convert to and from the 16-bit types: integers saturate, bool is != 0") {
  CHECK(hd::convert<int32_t>(to_half(-2.75)) == -2);
  CHECK(hd::convert<int32_t>(Half{0x7c00}) == std::numeric_limits<int32_t>::max());  // +inf saturates
  CHECK(hd::convert<int64_t>(Half{0x7e00}) == 0);                                     // NaN is 0
  CHECK(hd::convert<uint8_t>(to_bfloat16(300.0)) == 255);
  CHECK(hd::convert<bool>(Half{0x8000}) == false);  // -0
  CHECK(hd::convert<bool>(Half{0x7e00}) == true);   // NaN
  CHECK(hd::convert<Half>(int64_t{70000}).bits == 0x7c00);
  CHECK(hd::convert<Half>(true).bits == 0x3c00);
  CHECK(hd::convert<BFloat16>(to_half(1.0009765625)).bits == 0x3f80);  // 1 + 2^-10 rounds to 1 in bfloat16
  CHECK(hd::convert<Half>(to_bfloat16(65536.0)).bits == 0x7c00);
}

TEST_CASE("float16 and bfloat16 tensors: create, fill, convert, copy strided, print, save") {
  for (DType dtype : {DType::Float16, DType::BFloat16}) {
    CAPTURE(dtype);
    CHECK(element_size(dtype) == 2);
    Tensor x = test::random({5, 7}, DType::Float64, 3);
    Tensor h = x.to(dtype);
    CHECK(h.dtype() == dtype);
    CHECK(h.nbytes() == 70);
    // Each value is the rounded double, whichever dtype it came from.
    const auto values = x.to_vector<double>();
    const auto back = h.to_vector<double>();
    const auto via_float = x.to(DType::Float32).to(dtype).to(DType::Float64).to_vector<double>();
    for (size_t i = 0; i < values.size(); ++i) {
      const double want = dtype == DType::Float16 ? to_float(to_half(values[i])) : to_float(to_bfloat16(values[i]));
      CHECK(back[i] == want);
      CHECK(via_float[i] == doctest::Approx(want).epsilon(1e-2));
    }
    // Strided copies, both ways, and between the two 16-bit types.
    Tensor t = zeros({7, 5}, dtype).transpose(0, 1);
    t.copy_(x);
    CHECK(test::mismatch(t.to(DType::Float64), h.to(DType::Float64), 0, 0).empty());
    Tensor other = h.to(dtype == DType::Float16 ? DType::BFloat16 : DType::Float16);
    CHECK(test::mismatch(other.to(DType::Float64), x, 0, 1e-2).empty());
    CHECK(full({3}, 2.5, dtype).to_vector<float>() == std::vector<float>{2.5f, 2.5f, 2.5f});
    CHECK(full({1}, 1.0 / 3, dtype).item() == (dtype == DType::Float16 ? 0.333251953125 : 0.333984375));
    Tensor elsewhere = h.to(Device("cpu:1"));
    CHECK(test::mismatch(elsewhere.to(kCPU).to(DType::Float64), h.to(DType::Float64), 0, 0).empty());
    std::ostringstream printed;
    printed << full({2}, 1.5, dtype);
    CHECK(printed.str() == "tensor([1.5000, 1.5000], dtype=" + std::string(dtype_name(dtype)) + ", device=cpu:0)");
    // Ops that compute refuse, saying what to do.
    CHECK_THROWS_WITH_AS(add(h, h), Contains("cannot be computed with"), Error);
    CHECK_THROWS_WITH_AS(sum(h), Contains("convert with .to(DType::Float32) first"), Error);
    CHECK_THROWS_WITH_AS(matmul(h, h.t()), Contains(dtype_name(dtype).data()), Error);
  }
}
