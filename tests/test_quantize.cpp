// Row quantizers: hand-made blocks with bytes worked out from the reference rules (facts.md),
// error bounds on random data, fp16/bf16 round trips, the non-finite policy, convert_row.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace smolrt {
namespace {

using Block = std::array<float, 32>;

Block zeros() {
  Block b{};
  return b;
}

std::vector<uint8_t> qs_bytes(const uint8_t* qs) {
  return std::vector<uint8_t>(qs, qs + 16);
}

std::vector<uint8_t> filled(uint8_t fill, std::initializer_list<std::pair<int, uint8_t>> at) {
  std::vector<uint8_t> v(16, fill);
  for (auto [i, b] : at) v[static_cast<size_t>(i)] = b;
  return v;
}

// --- Q4_0 by hand -------------------------------------------------------------------------------

TEST(QuantQ4_0, ZeroBlock) {
  // max = 0 -> d = 0 / -8 = -0 (IEEE: fp16 0x8000, as the reference stores it), id = 0,
  // nibble = (int8)(0 + 8.5) = 8 everywhere.
  Block x = zeros();
  BlockQ4_0 y;
  std::memset(&y, 0x5a, sizeof y);  // poison
  quantize_row_q4_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x8000);
  EXPECT_EQ(qs_bytes(y.qs), filled(0x88, {}));
}

TEST(QuantQ4_0, SingleLargeNegative) {
  // max = -8 -> d = 1 (fp16 0x3c00), id = 1. x[3]: -8 + 8.5 = 0.5 -> 0; zeros -> 8.
  Block x = zeros();
  x[3] = -8.0f;
  BlockQ4_0 y;
  std::memset(&y, 0x5a, sizeof y);
  quantize_row_q4_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x3c00);
  EXPECT_EQ(qs_bytes(y.qs), filled(0x88, {{3, 0x80}}));
}

TEST(QuantQ4_0, MixedSignsAndRoundingEdges) {
  // d = 1, id = 1 (max = -8 at x[0]); nibble = min(15, trunc(x + 8.5)).
  Block x = zeros();
  x[0] = -8.0f;     // 0.5  -> 0
  x[1] = 1.5f;      // 10.0 -> 10 (lands exactly on an integer)
  x[2] = -0.5f;     // 8.0  -> 8
  x[3] = 7.5f;      // 16.0 -> 16, clamped to 15
  x[4] = 7.0f;      // 15.5 -> 15
  x[5] = -7.5f;     // 1.0  -> 1
  x[6] = 0.25f;     // 8.75 -> 8
  x[7] = -1.25f;    // 7.25 -> 7
  x[8] = 3.0f;      // 11.5 -> 11
  x[9] = -3.5f;     // 5.0  -> 5
  x[10] = 1.4375f;  // 9.9375 -> 9 (just below the edge)
  x[16] = 2.5f;     // 11.0 -> 11
  x[17] = -2.5f;    // 6.0  -> 6
  x[18] = 6.5f;     // 15.0 -> 15
  x[19] = -6.5f;    // 2.0  -> 2
  BlockQ4_0 y;
  std::memset(&y, 0x5a, sizeof y);
  quantize_row_q4_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x3c00);
  // byte j = nib[j] | nib[j + 16] << 4
  EXPECT_EQ(qs_bytes(y.qs), filled(0x88, {{0, 0xB0},
                                          {1, 0x6A},
                                          {2, 0xF8},
                                          {3, 0x2F},
                                          {4, 0x8F},
                                          {5, 0x81},
                                          {6, 0x88},
                                          {7, 0x87},
                                          {8, 0x8B},
                                          {9, 0x85},
                                          {10, 0x89}}));
}

TEST(QuantQ4_0, MaxMagnitudePositiveFirst) {
  // |4| == |-4|: the first wins, max = +4 -> d = -0.5 (0xb800), id = -2.
  // x0: -8 + 8.5 -> 0; x1: 8 + 8.5 = 16.5 -> 16 -> 15; x2 = 1: -2 + 8.5 = 6.5 -> 6.
  Block x = zeros();
  x[0] = 4.0f;
  x[1] = -4.0f;
  x[2] = 1.0f;
  BlockQ4_0 y;
  quantize_row_q4_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0xb800);
  EXPECT_EQ(qs_bytes(y.qs), filled(0x88, {{0, 0x80}, {1, 0x8F}, {2, 0x86}}));
}

TEST(QuantQ4_0, MaxMagnitudeNegativeFirst) {
  // max = -4 -> d = 0.5 (0x3800), id = 2. x0 -> 0; x1: 16.5 -> 15; x2 = 1: 2 + 8.5 -> 10.
  Block x = zeros();
  x[0] = -4.0f;
  x[1] = 4.0f;
  x[2] = 1.0f;
  BlockQ4_0 y;
  quantize_row_q4_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x3800);
  EXPECT_EQ(qs_bytes(y.qs), filled(0x88, {{0, 0x80}, {1, 0x8F}, {2, 0x8A}}));
}

TEST(QuantQ4_0, MaxInUpperHalf) {
  // max = -16 at x[20] -> d = 2 (0x4000), id = 0.5. x20 -> 0 (high nibble of byte 4);
  // x5 = 3: 1.5 + 8.5 = 10.0 -> 10 (low nibble of byte 5).
  Block x = zeros();
  x[20] = -16.0f;
  x[5] = 3.0f;
  BlockQ4_0 y;
  quantize_row_q4_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x4000);
  EXPECT_EQ(qs_bytes(y.qs), filled(0x88, {{4, 0x08}, {5, 0x8A}}));
}

// --- Q4_1 by hand -------------------------------------------------------------------------------

TEST(QuantQ4_1, ZeroAndConstantBlocks) {
  // max == min -> d = 0, id = 0, nibble = (int8)(0 + 0.5) = 0; m = min.
  Block x = zeros();
  BlockQ4_1 y;
  std::memset(&y, 0x5a, sizeof y);
  quantize_row_q4_1(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x0000);
  EXPECT_EQ(y.m, 0x0000);
  EXPECT_EQ(qs_bytes(y.qs), filled(0x00, {}));
  x.fill(3.0f);
  quantize_row_q4_1(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x0000);
  EXPECT_EQ(y.m, 0x4200);  // fp16(3)
  EXPECT_EQ(qs_bytes(y.qs), filled(0x00, {}));
}

TEST(QuantQ4_1, MixedAndRoundingEdges) {
  // min = -1, max = 14 -> d = 1 (0x3c00), m = -1 (0xbc00), id = 1; nibble = trunc(x + 1 + 0.5).
  Block x = zeros();  // zeros -> 1.5 -> 1
  x[0] = -1.0f;       // 0.5 -> 0
  x[1] = 14.0f;       // 15.5 -> 15
  x[3] = 0.5f;        // 2.0 -> 2 (exact integer)
  x[4] = 0.25f;       // 1.75 -> 1
  x[5] = 13.5f;       // 15.0 -> 15
  x[6] = 12.5f;       // 14.0 -> 14
  x[16] = 3.0f;       // 4.5 -> 4
  x[17] = -0.5f;      // 1.0 -> 1
  BlockQ4_1 y;
  std::memset(&y, 0x5a, sizeof y);
  quantize_row_q4_1(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x3c00);
  EXPECT_EQ(y.m, 0xbc00);
  EXPECT_EQ(qs_bytes(y.qs), filled(0x11, {{0, 0x40}, {1, 0x1F}, {3, 0x12}, {5, 0x1F}, {6, 0x1E}}));
}

// --- Q8_0 by hand -------------------------------------------------------------------------------

TEST(QuantQ8_0, ZeroBlock) {
  Block x = zeros();
  BlockQ8_0 y;
  std::memset(&y, 0x5a, sizeof y);
  quantize_row_q8_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x0000);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y.qs[j], 0) << j;
}

TEST(QuantQ8_0, MixedAndRoundingEdges) {
  // amax = 127 -> d = 1, id = 1; q = roundf(x) (halves away from zero).
  Block x = zeros();
  x[0] = 127.0f;
  x[1] = 2.5f;     // 3
  x[2] = -2.5f;    // -3
  x[3] = 0.49f;    // 0
  x[4] = -127.0f;  // -127
  x[5] = 0.5f;     // 1
  x[6] = -0.5f;    // -1
  x[7] = 126.5f;   // 127
  BlockQ8_0 y;
  std::memset(&y, 0x5a, sizeof y);
  quantize_row_q8_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x3c00);
  const int8_t want[8] = {127, 3, -3, 0, -127, 1, -1, 127};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(y.qs[j], want[j]) << j;
  for (int j = 8; j < 32; ++j) EXPECT_EQ(y.qs[j], 0) << j;
}

TEST(QuantQ8_0, NegativeMaxHalfScale) {
  // amax = 63.5 -> d = 0.5 (0x3800), id = 2: -63.5 -> -127, 1.25 -> roundf(2.5) = 3.
  Block x = zeros();
  x[31] = -63.5f;
  x[1] = 1.25f;
  BlockQ8_0 y;
  quantize_row_q8_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x3800);
  EXPECT_EQ(y.qs[31], -127);
  EXPECT_EQ(y.qs[1], 3);
  EXPECT_EQ(y.qs[0], 0);
}

// --- random data: byte-exact against a literal transcription of the reference rules -------------

// The facts.md rules written as plainly as possible (libm roundf, no shortcuts).
void ref_q4_0(const float* x, BlockQ4_0& y) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
  }
  const float d = max / -8, id = d ? 1.0f / d : 0.0f;
  y.d = f32_to_fp16(d);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min<int8_t>(15, (int8_t)(x[j] * id + 8.5f));
    const int hi = std::min<int8_t>(15, (int8_t)(x[j + 16] * id + 8.5f));
    y.qs[j] = (uint8_t)(lo | hi << 4);
  }
}
void ref_q4_1(const float* x, BlockQ4_1& y) {
  float mn = x[0], mx = x[0];
  for (int j = 0; j < 32; ++j) mn = std::min(mn, x[j]), mx = std::max(mx, x[j]);
  const float d = (mx - mn) / 15, id = d ? 1.0f / d : 0.0f;
  y.d = f32_to_fp16(d);
  y.m = f32_to_fp16(mn);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min<int8_t>(15, (int8_t)((x[j] - mn) * id + 0.5f));
    const int hi = std::min<int8_t>(15, (int8_t)((x[j + 16] - mn) * id + 0.5f));
    y.qs[j] = (uint8_t)(lo | hi << 4);
  }
}
void ref_q8_0(const float* x, BlockQ8_0& y) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
  y.d = f32_to_fp16(d);
  for (int j = 0; j < 32; ++j) y.qs[j] = (int8_t)std::roundf(x[j] * id);
}

TEST(QuantReference, ByteExactOnRandomBlocks) {
  // Mixed scales and many exact halves (values on a 1/64 grid) to hit the rounding edges.
  const int64_t nb = 4000, n = nb * 32;
  std::vector<float> x = test::randn(n, 31, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    if (i % 3 == 0) x[i] = std::round(x[i] * 64) / 64;
    x[i] *= std::ldexp(1.0f, static_cast<int>(i / 32 % 9) - 4);
  }
  std::vector<BlockQ4_0> a0(nb), b0(nb);
  std::vector<BlockQ4_1> a1(nb), b1(nb);
  std::vector<BlockQ8_0> a8(nb), b8(nb);
  quantize_row(GgmlType::Q4_0, x.data(), a0.data(), n);
  quantize_row(GgmlType::Q4_1, x.data(), a1.data(), n);
  quantize_row(GgmlType::Q8_0, x.data(), a8.data(), n);
  for (int64_t b = 0; b < nb; ++b) {
    ref_q4_0(&x[b * 32], b0[b]);
    ref_q4_1(&x[b * 32], b1[b]);
    ref_q8_0(&x[b * 32], b8[b]);
    ASSERT_EQ(std::memcmp(&a0[b], &b0[b], sizeof(BlockQ4_0)), 0) << "q4_0 block " << b;
    ASSERT_EQ(std::memcmp(&a1[b], &b1[b], sizeof(BlockQ4_1)), 0) << "q4_1 block " << b;
    ASSERT_EQ(std::memcmp(&a8[b], &b8[b], sizeof(BlockQ8_0)), 0) << "q8_0 block " << b;
  }
}

// --- random data: dequantize(quantize(x)) within the format's bound ----------------------------

// fp16 relative rounding error (half an ulp of a 10-bit mantissa).
const float kH = std::ldexp(1.0f, -11);

// Worst-case error of storing v as fp16: relative 2^-11 in the normal range, absolute 2^-25
// (half the smallest subnormal step) below 2^-14, where small scales such as 1e-3 / 127 land.
float fp16_err(float v) {
  return std::max(std::fabs(v) * kH, std::ldexp(1.0f, -25));
}

class RoundTrip : public ::testing::TestWithParam<float> {};

TEST_P(RoundTrip, Q4_0WithinHalfStep) {
  const int64_t n = 32 * 257;
  const std::vector<float> x = test::randn(n, 11, GetParam());
  std::vector<BlockQ4_0> q(n / 32);
  std::vector<float> back(n, NAN);  // poison
  quantize_row(GgmlType::Q4_0, x.data(), q.data(), n);
  dequantize_row(GgmlType::Q4_0, q.data(), back.data(), n);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(x[b * 32 + j])) amax = std::fabs(x[b * 32 + j]), max = x[b * 32 + j];
    }
    const float d = amax / 8;
    for (int j = 0; j < 32; ++j) {
      const float xi = x[b * 32 + j];
      // Values of the opposite sign to max above 7.5 d clamp to nibble 15: error up to d.
      // Everything else rounds to the nearest step: d / 2. Plus |q| <= 8 times the fp16 error
      // of d, and a little f32 slack for the x * id product.
      const bool clamped = (xi * max < 0) && std::fabs(xi) > 7.5f * d;
      const float bound = (clamped ? 1.0f : 0.5f) * d + 8 * fp16_err(d) + 1e-6f * amax;
      ASSERT_LE(std::fabs(back[b * 32 + j] - xi), bound) << "block " << b << " j " << j;
    }
  }
}

TEST_P(RoundTrip, Q4_1WithinHalfStep) {
  const int64_t n = 32 * 257;
  const std::vector<float> x = test::randn(n, 12, GetParam());
  std::vector<BlockQ4_1> q(n / 32);
  std::vector<float> back(n, NAN);
  quantize_row(GgmlType::Q4_1, x.data(), q.data(), n);
  dequantize_row(GgmlType::Q4_1, q.data(), back.data(), n);
  for (int64_t b = 0; b < n / 32; ++b) {
    float mn = x[b * 32], mx = x[b * 32];
    for (int j = 0; j < 32; ++j) mn = std::min(mn, x[b * 32 + j]), mx = std::max(mx, x[b * 32 + j]);
    const float d = (mx - mn) / 15;
    for (int j = 0; j < 32; ++j) {
      // d / 2 from rounding, 15 steps of d's fp16 error, m's fp16 error, f32 slack.
      const float bound = 0.5f * d + 15 * fp16_err(d) + fp16_err(mn) + 1e-6f * (mx - mn);
      ASSERT_LE(std::fabs(back[b * 32 + j] - x[b * 32 + j]), bound) << "block " << b;
    }
  }
}

TEST_P(RoundTrip, Q8_0WithinHalfStep) {
  const int64_t n = 32 * 257;
  const std::vector<float> x = test::randn(n, 13, GetParam());
  std::vector<BlockQ8_0> q(n / 32);
  std::vector<float> back(n, NAN);
  quantize_row(GgmlType::Q8_0, x.data(), q.data(), n);
  dequantize_row(GgmlType::Q8_0, q.data(), back.data(), n);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127;
    for (int j = 0; j < 32; ++j) {
      const float bound = 0.5f * d + 127 * fp16_err(d) + 1e-6f * amax;
      ASSERT_LE(std::fabs(back[b * 32 + j] - x[b * 32 + j]), bound) << "block " << b;
    }
  }
}

TEST_P(RoundTrip, F16AndBf16Relative) {
  const int64_t n = 4096;
  const std::vector<float> x = test::randn(n, 14, GetParam());
  std::vector<uint16_t> h(n), b(n);
  std::vector<float> hb(n, NAN), bb(n, NAN);
  quantize_row(GgmlType::F16, x.data(), h.data(), n);
  quantize_row(GgmlType::BF16, x.data(), b.data(), n);
  dequantize_row(GgmlType::F16, h.data(), hb.data(), n);
  dequantize_row(GgmlType::BF16, b.data(), bb.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    // Normal fp16 range: relative 2^-11; below 2^-14 fp16 is subnormal with absolute 2^-25.
    ASSERT_LE(std::fabs(hb[i] - x[i]), std::fabs(x[i]) * kH + std::ldexp(1.0f, -25)) << i;
    ASSERT_LE(std::fabs(bb[i] - x[i]), std::fabs(x[i]) * std::ldexp(1.0f, -8)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Scales, RoundTrip, ::testing::Values(1.0f, 0.02f, 1e-3f, 300.0f));

TEST(RoundTripExact, HalfAndBf16BitsSurviveF32) {
  // Every finite fp16 / bf16 value converts to f32 and back to the same bits via convert_row.
  std::vector<uint16_t> all, back;
  for (uint32_t v = 0; v < 0x10000u; ++v) {
    if ((v & 0x7c00u) != 0x7c00u) all.push_back(static_cast<uint16_t>(v));
  }
  const int64_t n = static_cast<int64_t>(all.size());
  std::vector<float> f(n);
  back.assign(n, 0xffff);
  convert_row(GgmlType::F16, all.data(), GgmlType::F32, f.data(), n);
  convert_row(GgmlType::F32, f.data(), GgmlType::F16, back.data(), n);
  EXPECT_EQ(back, all);

  all.clear();
  for (uint32_t v = 0; v < 0x10000u; ++v) {
    if ((v & 0x7f80u) != 0x7f80u) all.push_back(static_cast<uint16_t>(v));
  }
  const int64_t nb = static_cast<int64_t>(all.size());
  f.assign(nb, NAN);
  back.assign(nb, 0xffff);
  convert_row(GgmlType::BF16, all.data(), GgmlType::F32, f.data(), nb);
  convert_row(GgmlType::F32, f.data(), GgmlType::BF16, back.data(), nb);
  EXPECT_EQ(back, all);
}

// --- convert_row ---------------------------------------------------------------------------------

TEST(ConvertRow, RequantizeEqualsDequantThenQuantize) {
  const int64_t n = 32 * 300;  // more than one 4096-element chunk, not a multiple of it
  const std::vector<float> x = test::randn(n, 21, 0.05f);
  std::vector<BlockQ4_1> q41(n / 32);
  quantize_row(GgmlType::Q4_1, x.data(), q41.data(), n);
  std::vector<float> f(n);
  dequantize_row(GgmlType::Q4_1, q41.data(), f.data(), n);
  std::vector<BlockQ4_0> want(n / 32), got(n / 32);
  quantize_row(GgmlType::Q4_0, f.data(), want.data(), n);
  std::memset(got.data(), 0x5a, got.size() * sizeof(BlockQ4_0));
  convert_row(GgmlType::Q4_1, q41.data(), GgmlType::Q4_0, got.data(), n);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(BlockQ4_0)), 0);
}

TEST(ConvertRow, SameTypeIsACopy) {
  const int64_t n = 64;
  const std::vector<float> x = test::randn(n, 22);
  std::vector<BlockQ8_0> a(2), b(2);
  quantize_row(GgmlType::Q8_0, x.data(), a.data(), n);
  std::memset(b.data(), 0x5a, sizeof(BlockQ8_0) * 2);
  convert_row(GgmlType::Q8_0, a.data(), GgmlType::Q8_0, b.data(), n);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(BlockQ8_0) * 2), 0);
}

TEST(ConvertRow, BadLengthsAndTypes) {
  float x[64] = {1.0f};
  BlockQ4_0 y[2];
  EXPECT_THROW(quantize_row(GgmlType::Q4_0, x, y, 33), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q6_K, x, y, 128), Error);  // not a whole super-block
  EXPECT_THROW(convert_row(GgmlType::Q2_K, x, GgmlType::F32, y, 256), Error);  // unsupported
  try {
    quantize_row(GgmlType::Q8_0, x, y, 40);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("40 elements"), std::string::npos) << e.what();
  }
}

// --- non-finite policy ---------------------------------------------------------------------------

std::string quant_error(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() * 4 + 64);
  try {
    quantize_row(t, x.data(), out.data(), static_cast<int64_t>(x.size()));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NonFinite, RejectedWithElementIndexForEveryType) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                     GgmlType::Q8_0}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> x = test::randn(64, 5);
      x[37] = bad;
      const std::string msg = quant_error(t, x);
      EXPECT_NE(msg.find("element 37"), std::string::npos) << type_name(t) << ": " << msg;
      EXPECT_NE(msg.find("non-finite"), std::string::npos) << msg;
    }
  }
}

TEST(NonFinite, OverflowOfTargetRejected) {
  std::vector<float> x = test::randn(32, 6);
  x[9] = 70000.0f;  // > 65504: inf in fp16
  EXPECT_NE(quant_error(GgmlType::F16, x).find("element 9"), std::string::npos);
  x[9] = 1e6f;  // q4_0 d = 125000 does not fit fp16; q8_0 d = 7874 does
  EXPECT_NE(quant_error(GgmlType::Q4_0, x).find("overflows fp16"), std::string::npos);
  EXPECT_EQ(quant_error(GgmlType::Q8_0, x), "");
  x[9] = 3.4e38f;
  x[10] = -3.4e38f;  // max - min overflows f32
  EXPECT_NE(quant_error(GgmlType::Q4_1, x).find("q4_1"), std::string::npos);
  EXPECT_NE(quant_error(GgmlType::BF16, x), "");  // 3.4e38 rounds to inf in bf16
}

TEST(NonFinite, TinyScaleBlockIsZero) {
  // 1/d overflows f32: treated as an all-zero block (fp16 d is -0 as the reference stores it),
  // no UB from converting inf/NaN to int8, no NaN out.
  Block x = zeros();
  x[0] = 1e-39f;  // d = -1.25e-40, 1/d = -inf
  BlockQ4_0 y;
  quantize_row_q4_0(x.data(), &y, 32);
  EXPECT_EQ(y.d, 0x8000);
  EXPECT_EQ(qs_bytes(y.qs), filled(0x88, {}));
  float back[32];
  dequantize_row(GgmlType::Q4_0, &y, back, 32);
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace smolrt
