// Q5_0, Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K): dequantization of hand-built blocks, quantizers
// on hand-worked blocks, golden digests from ggml's C reference, the level rule and error bounds
// on random data of realistic magnitudes, row-length and non-finite errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace smolrt {
namespace {

const GgmlType kNewTypes[] = {GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K,
                              GgmlType::Q6_K};

std::vector<uint8_t> quantize(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(*type_info(t), x.size()));
  std::memset(q.data(), 0x5a, q.size());  // poison
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> dequantize(GgmlType t, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> y(n, NAN);
  dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(n));
  return y;
}

// 6-bit (scale, min) pairs packed as Q4_K / Q5_K store them: bytes 0-3 the low 6 bits of scales
// 0-3 with the top 2 bits of scales 4-7 above; bytes 4-7 the same for the mins; bytes 8-11 the low
// nibbles of scale (low) and min (high) 4-7.
void pack_scales(const int sc[8], const int m[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

// --- dequantization of hand-built blocks ---------------------------------------------------------

TEST(DequantHand, Q5_0AndQ5_1) {
  // q_j = j (0..31): nibble j & 15 (low nibbles hold j < 16, high nibbles j >= 16), 5th bit = 1
  // exactly for j >= 16 -> qh = 0xffff0000.
  BlockQ5_0 a;
  a.d = 0x3800;  // 0.5
  BlockQ5_1 b;
  b.d = 0xb400;  // -0.25
  b.m = 0x4200;  // 3
  for (int j = 0; j < 16; ++j) a.qs[j] = b.qs[j] = static_cast<uint8_t>(j | (j << 4));
  const uint8_t qh[4] = {0x00, 0x00, 0xff, 0xff};
  std::memcpy(a.qh, qh, 4);
  std::memcpy(b.qh, qh, 4);
  float ya[32], yb[32];
  dequantize_row(GgmlType::Q5_0, &a, ya, 32);
  dequantize_row(GgmlType::Q5_1, &b, yb, 32);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(ya[j], (j - 16) * 0.5f) << j;
    EXPECT_EQ(yb[j], j * -0.25f + 3.0f) << j;
  }
}

TEST(DequantHand, Q4_KAndQ5_K) {
  // Scales and mins >= 16 for sub-blocks 4..7 exercise the split 6-bit packing.
  const int sc[8] = {1, 2, 3, 63, 17, 33, 48, 60};
  const int m[8] = {0, 5, 63, 7, 20, 40, 1, 16};
  BlockQ4_K a;
  BlockQ5_K b;
  a.d = b.d = 0x3c00;        // 1
  a.dmin = b.dmin = 0x3800;  // 0.5
  pack_scales(sc, m, a.scales);
  pack_scales(sc, m, b.scales);
  // Weight l of sub-block j: 4-bit level (l + 3j) & 15 in qs[32 (j/2) + l] (low nibble for even
  // j); Q5_K adds a 5th bit (l + j) % 3 == 0, bit j of qh[l].
  std::memset(b.qh, 0, sizeof b.qh);
  for (int j = 0; j < 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      const int q = (l + 3 * j) & 15;
      uint8_t& byte_a = a.qs[32 * (j / 2) + l];
      uint8_t& byte_b = b.qs[32 * (j / 2) + l];
      if (j % 2 == 0) {
        byte_a = static_cast<uint8_t>(q);
        byte_b = static_cast<uint8_t>(q);
      } else {
        byte_a = static_cast<uint8_t>(byte_a | (q << 4));
        byte_b = static_cast<uint8_t>(byte_b | (q << 4));
      }
      if ((l + j) % 3 == 0) b.qh[l] = static_cast<uint8_t>(b.qh[l] | (1 << j));
    }
  }
  float ya[256], yb[256];
  dequantize_row(GgmlType::Q4_K, &a, ya, 256);
  dequantize_row(GgmlType::Q5_K, &b, yb, 256);
  for (int j = 0; j < 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      const int q = (l + 3 * j) & 15;
      const int q5 = q + ((l + j) % 3 == 0 ? 16 : 0);
      EXPECT_EQ(ya[32 * j + l], static_cast<float>(sc[j] * q) - 0.5f * m[j]) << j << " " << l;
      EXPECT_EQ(yb[32 * j + l], static_cast<float>(sc[j] * q5) - 0.5f * m[j]) << j << " " << l;
    }
  }
}

TEST(DequantHand, Q6_K) {
  // Weight k of the 256: level q = (7k) % 64 (stored q, weight uses q - 32), group scale
  // 3 * (k/16) - 20 (negative and positive), d = 0.25.
  BlockQ6_K b;
  std::memset(&b, 0, sizeof b);
  b.d = 0x3400;
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(3 * g - 20);
  for (int k = 0; k < 256; ++k) {
    const int q = (7 * k) % 64;
    // Half h = k / 128; quarter r = (k % 128) / 32 and l = k % 32: low 4 bits in ql[64h + l] (r = 0
    // low nibble, r = 2 high nibble) or ql[64h + 32 + l] (r = 1 low, r = 3 high); high 2 bits at
    // bits 2r of qh[32h + l].
    const int h = k / 128, r = (k % 128) / 32, l = k % 32;
    uint8_t& lb = b.ql[64 * h + 32 * (r & 1) + l];
    lb = static_cast<uint8_t>(lb | ((q & 15) << (r >= 2 ? 4 : 0)));
    b.qh[32 * h + l] = static_cast<uint8_t>(b.qh[32 * h + l] | ((q >> 4) << (2 * r)));
  }
  float y[256];
  dequantize_row(GgmlType::Q6_K, &b, y, 256);
  for (int k = 0; k < 256; ++k) {
    EXPECT_EQ(y[k],
              0.25f * static_cast<float>(3 * (k / 16) - 20) * static_cast<float>((7 * k) % 64 - 32))
        << k;
  }
}

// --- quantizers on hand-worked blocks ------------------------------------------------------------

TEST(QuantHand, Q5_0) {
  // max = -16 at x[0] -> d = 1 (0x3c00), id = 1; q = min(31, (int8)(x + 16.5)).
  std::vector<float> x(32, 0.25f);  // 16.75 -> 16 (nonzero filler)
  x[0] = -16.0f;                    // 0.5 -> 0
  x[1] = 1.5f;                      // 18.0 -> 18: bit 4 set, nibble 2
  x[2] = 15.5f;                     // 32.0 -> clamped 31
  x[3] = -0.75f;                    // 15.75 -> 15: bit 4 clear
  x[17] = -3.5f;                    // 13.0 -> 13 (high nibble of byte 1)
  x[18] = 7.0f;                     // 23.5 -> 23 (high nibble of byte 2)
  const std::vector<uint8_t> q = quantize(GgmlType::Q5_0, x);
  BlockQ5_0 b;
  std::memcpy(&b, q.data(), sizeof b);
  EXPECT_EQ(b.d, 0x3c00);
  EXPECT_EQ(b.qs[0], 0x00);
  EXPECT_EQ(b.qs[1], 0xD2);
  EXPECT_EQ(b.qs[2], 0x7F);
  EXPECT_EQ(b.qs[3], 0x0F);
  EXPECT_EQ(b.qs[4], 0x00);
  // 5th bits: x1, x2 and every 0.25 filler (16) except 0, 3; upper half all set but 17.
  EXPECT_EQ(load_qh(b.qh), 0xfffdfff6u);
}

TEST(QuantHand, Q5_1) {
  // min = -1, max = 30 -> d = 1, m = -1 (0xbc00); q = (int)(x + 1 + 0.5).
  std::vector<float> x(32, 4.0f);  // 5.5 -> 5
  x[0] = -1.0f;                    // 0
  x[1] = 30.0f;                    // 31
  x[2] = 14.6f;                    // 16.1 -> 16: bit 4 only
  x[20] = 15.4f;                   // 16.9 -> 16
  const std::vector<uint8_t> q = quantize(GgmlType::Q5_1, x);
  BlockQ5_1 b;
  std::memcpy(&b, q.data(), sizeof b);
  EXPECT_EQ(b.d, 0x3c00);
  EXPECT_EQ(b.m, 0xbc00);
  EXPECT_EQ(b.qs[0], 0x50);
  EXPECT_EQ(b.qs[1], 0x5F);
  EXPECT_EQ(b.qs[2], 0x50);
  EXPECT_EQ(b.qs[4], 0x05);
  EXPECT_EQ(load_qh(b.qh), (1u << 1) | (1u << 2) | (1u << 20));
}

// Values on an exact grid x = step * level keep their levels: the first fit reproduces them with
// zero error, which no trial scale can beat (ties keep the first), and the stored 6-bit / int8
// scales give the same levels back.
TEST(QuantHand, KQuantsKeepAnExactGrid) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K}) {
    const int nmax = t == GgmlType::Q4_K ? 15 : 31;
    std::vector<float> x(256);
    std::vector<int> lv(256);
    for (int k = 0; k < 256; ++k) {
      // Every sub-block of 32 holds levels 0 and nmax (so min = 0, max = 0.01 * nmax).
      lv[k] = (k % 32 == 0) ? 0 : (k % 32 == 1) ? nmax : (k * 7 + k / 32) % (nmax + 1);
      x[k] = 0.01f * static_cast<float>(lv[k]);
    }
    const std::vector<uint8_t> q = quantize(t, x);
    uint16_t dmin;
    std::memcpy(&dmin, q.data() + 2, 2);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      k_scale_min(j, q.data() + 4, sc, m);
      EXPECT_EQ(sc, 63) << type_name(t) << " sub-block " << j;  // all sub-blocks equal: max scale
      EXPECT_LT(fp16_to_f32(dmin) * m, 1e-7f) << type_name(t);  // no minimum needed
    }
    const uint8_t* qs = q.data() + (t == GgmlType::Q4_K ? 16 : 48);
    for (int k = 0; k < 256; ++k) {
      const int j = k / 32, l = k % 32;
      int level = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
      if (t == GgmlType::Q5_K) level |= ((q[16 + l] >> j) & 1) << 4;
      ASSERT_EQ(level, lv[k]) << type_name(t) << " weight " << k;
    }
  }
  // Q6_K: symmetric levels -32..31 with -32 in every group of 16 (the largest magnitude, so the
  // group scales are all -128 / max_scale * scale = -128).
  std::vector<float> x(256);
  std::vector<int> lv(256);
  for (int k = 0; k < 256; ++k) {
    lv[k] = (k % 16 == 0) ? -32 : (k * 5) % 64 - 32;
    if (lv[k] == -32 && k % 16 != 0) lv[k] = 31;
    x[k] = 0.01f * static_cast<float>(lv[k]);
  }
  const std::vector<uint8_t> q = quantize(GgmlType::Q6_K, x);
  BlockQ6_K b;
  std::memcpy(&b, q.data(), sizeof b);
  for (int g = 0; g < 16; ++g) EXPECT_EQ(b.scales[g], -128) << g;
  // d = 1 / iscale, iscale = -128 / 0.01, within half an fp16 step (2^-25 in [2^-14, 2^-13)).
  EXPECT_NEAR(fp16_to_f32(b.d), -0.01f / 128.0f, 3e-8f);
  for (int k = 0; k < 256; ++k) {
    const int h = k / 128, r = (k % 128) / 32, l = k % 32;
    const int lo = (b.ql[64 * h + 32 * (r & 1) + l] >> (r >= 2 ? 4 : 0)) & 15;
    const int hi = (b.qh[32 * h + l] >> (2 * r)) & 3;
    ASSERT_EQ((lo | (hi << 4)) - 32, lv[k]) << "weight " << k;
  }
}

TEST(QuantHand, ZeroSuperBlocks) {
  // All zeros: Q4_K/Q5_K fits return scale 0, min -0 -> d = dmin = 0 and levels 0; Q6_K writes an
  // all-zero block. Everything dequantizes to exactly 0.
  const std::vector<float> x(256, 0.0f);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const std::vector<uint8_t> q = quantize(t, x);
    EXPECT_TRUE(std::all_of(q.begin(), q.end(), [](uint8_t c) { return c == 0; })) << type_name(t);
    for (float v : dequantize(t, q, 256)) ASSERT_EQ(v, 0.0f) << type_name(t);
  }
}

// --- golden digests from ggml's C reference ------------------------------------------------------

// A deterministic input without libm or <random> (whose distributions differ between standard
// libraries): 64 super-blocks, scales 2^-8 .. 2^4, plain, negative-only, outlier and offset
// positive blocks.
float golden_input(int64_t i) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  h *= 0x297a2d39u;
  h ^= h >> 15;
  const float u = static_cast<float>(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
  const int64_t blk = i / 256;
  const float s = std::ldexp(1.0f, static_cast<int>(blk % 13) - 8);
  float v = (u + 3.0f * u * u * u) * s;
  switch (blk % 4) {
    case 1:
      v = -std::fabs(v);
      break;
    case 2:
      if (i % 37 == 0) v *= 20.0f;
      break;
    case 3:
      v = std::fabs(v) + s;
      break;
    default:
      break;
  }
  return v;
}

uint64_t fnv1a(const std::vector<uint8_t>& b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t c : b) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

TEST(QuantGolden, MatchesGgmlReferenceDigests) {
  // FNV-1a of quantize_row_*_ref's output for golden_input(0 .. 16383), from ggml-quants.c as
  // vendored by llama-cpp-python 0.3.36, compiled with gcc -O2 for x86-64 (no fused multiply-add,
  // like quantize.cpp). A build of ggml that contracts a*b+c into FMAs (-march=native on an FMA
  // machine) gives different K-quant bytes for a few percent of super-blocks.
  const struct {
    GgmlType type;
    uint64_t digest;
  } cases[] = {{GgmlType::Q5_0, 0x45bf15cfea9e9c3full},
               {GgmlType::Q5_1, 0x903723cb22c02703ull},
               {GgmlType::Q4_K, 0xb0ffac169a1db196ull},
               {GgmlType::Q5_K, 0x9b351063afd25631ull},
               {GgmlType::Q6_K, 0xa2d82d7e8944d5a9ull}};
  std::vector<float> x(256 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = golden_input(static_cast<int64_t>(i));
  for (const auto& c : cases) {
    EXPECT_EQ(fnv1a(quantize(c.type, x)), c.digest) << type_name(c.type);
  }
}

// --- random data: the level rule and error bounds ------------------------------------------------

// Rows of N(0, sigma) super-blocks in the shapes weights take: plain, negative-only, with
// outliers (every 61st value x30), and all-positive offset (|x| + 3 sigma).
std::vector<float> realistic(float sigma, uint32_t seed, int64_t n_blocks = 512) {
  std::vector<float> x = test::randn(static_cast<size_t>(n_blocks * 256), seed, sigma);
  for (size_t i = 0; i < x.size(); ++i) {
    switch (i / 256 % 4) {
      case 1:
        x[i] = -std::fabs(x[i]);
        break;
      case 2:
        if (i % 61 == 0) x[i] *= 30.0f;
        break;
      case 3:
        x[i] = std::fabs(x[i]) + 3 * sigma;
        break;
      default:
        break;
    }
  }
  return x;
}

class KRoundTrip : public ::testing::TestWithParam<float> {};

// The last stage of every K-quantizer is "level = nearest_int(x / step) on the stored grid,
// clamped to the range": so an element inside its sub-block's range [lo, hi] decodes within half
// a stored step of x, and one outside decodes to the nearer end. Holds for any data; checked with
// the grid decoded from the bytes (f32 slack 1e-5 of the range).
TEST_P(KRoundTrip, LevelsAreNearestOnTheStoredGrid) {
  const std::vector<float> x = realistic(GetParam(), 41);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const std::vector<uint8_t> q = quantize(t, x);
    const std::vector<float> y = dequantize(t, q, x.size());
    const size_t bytes = type_info(t)->block_bytes;
    for (size_t b = 0; b < x.size() / 256; ++b) {
      const uint8_t* blk = q.data() + b * bytes;
      const int groups = t == GgmlType::Q6_K ? 16 : 8, g_len = 256 / groups;
      for (int g = 0; g < groups; ++g) {
        float step, lo, hi;
        if (t == GgmlType::Q6_K) {
          uint16_t dh;
          std::memcpy(&dh, blk + 208, 2);
          step = fp16_to_f32(dh) * static_cast<float>(static_cast<int8_t>(blk[192 + g]));
          lo = std::min(-32 * step, 31 * step);
          hi = std::max(-32 * step, 31 * step);
          step = std::fabs(step);
        } else {
          uint16_t dh, mh;
          std::memcpy(&dh, blk, 2);
          std::memcpy(&mh, blk + 2, 2);
          int sc, m;
          k_scale_min(g, blk + 4, sc, m);
          step = fp16_to_f32(dh) * static_cast<float>(sc);
          lo = -fp16_to_f32(mh) * static_cast<float>(m);
          hi = step * (t == GgmlType::Q4_K ? 15 : 31) + lo;
        }
        if (step == 0.0f) continue;  // a zero-scale sub-block decodes to its constant minimum
        const float slack = 1e-5f * (hi - lo);
        for (int i = 0; i < g_len; ++i) {
          const size_t k = b * 256 + static_cast<size_t>(g * g_len + i);
          const float want = std::clamp(x[k], lo, hi);
          ASSERT_LE(std::fabs(y[k] - want), 0.5f * step + slack)
              << type_name(t) << " block " << b << " group " << g << " x " << x[k];
        }
      }
    }
  }
}

// Quality bounds (what a caller may rely on), per super-block with largest magnitude amax:
//   - every element within one step of a plain min/max grid spanning [-amax, amax] with the
//     format's level count: 2 amax / 15 (Q4_K), 2 amax / 31 (Q5_K), 2 amax / 63 (Q6_K). Each
//     sub-block's fit starts from its own min/max grid (whose step is no larger) and the stored
//     6-bit / int8 scales move the grid by at most a fraction of a step; measured maxima over
//     these data are 0.089, 0.054 and 0.021 amax, below the bounds 0.133, 0.065, 0.032.
//   - the RMS error no worse than the plain per-sub-block min/max grid's step / sqrt(12) (the fit
//     only accepts a lower weighted error than that grid): measured ratio 0.85 - 0.98; bound 1.05
//     for the rounding of the stored scales.
// sigma covers typical weights (0.02), unit and large (300) values; fp16 super-block scales stay
// normal for these (for |x| ~ 1e-4 they become subnormal and the grid coarser: not bounded here).
TEST_P(KRoundTrip, ErrorWithinFormatBounds) {
  const std::vector<float> x = realistic(GetParam(), 42);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const int nmax = t == GgmlType::Q4_K ? 15 : t == GgmlType::Q5_K ? 31 : 63;
    const int g_len = t == GgmlType::Q6_K ? 16 : 32;
    const std::vector<float> y = dequantize(t, quantize(t, x), x.size());
    double se = 0, naive = 0;
    for (size_t b = 0; b < x.size() / 256; ++b) {
      float amax = 0;
      for (int k = 0; k < 256; ++k) amax = std::max(amax, std::fabs(x[b * 256 + k]));
      for (int k = 0; k < 256; ++k) {
        const size_t i = b * 256 + k;
        ASSERT_LE(std::fabs(y[i] - x[i]), 2.0f * amax / static_cast<float>(nmax))
            << type_name(t) << " block " << b << " k " << k;
        se += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
      }
      for (int g = 0; g < 256 / g_len; ++g) {
        const float* xs = &x[b * 256 + g * g_len];
        const float mn = std::min(0.0f, *std::min_element(xs, xs + g_len));
        const float mx = *std::max_element(xs, xs + g_len);
        float ga = 0;
        for (int i = 0; i < g_len; ++i) ga = std::max(ga, std::fabs(xs[i]));
        // Q6_K's grid is symmetric: 64 levels over [-ga, ga].
        const double step = t == GgmlType::Q6_K ? ga / 32.0 : (mx - mn) / double(nmax);
        naive += g_len * step * step / 12;
      }
    }
    EXPECT_LE(std::sqrt(se), 1.05 * std::sqrt(naive)) << type_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(Scales, KRoundTrip, ::testing::Values(0.02f, 1.0f, 300.0f));

// Q5_0 / Q5_1, per block of 32 (as the Q4 bounds in test_quantize.cpp, with 16 / 31 steps):
//   Q5_0: d = amax / 16; values of the sign opposite to max above 15.5 d clamp to level 31
//         (error up to d), everything else rounds to the nearest step (d / 2); plus 16 times the
//         fp16 error of d and f32 slack.
//   Q5_1: d = (max - min) / 31; error d / 2, plus 31 steps of d's fp16 error and m's fp16 error.
TEST_P(KRoundTrip, Q5_0AndQ5_1WithinHalfStep) {
  const std::vector<float> x = realistic(GetParam(), 43, 64);
  const std::vector<float> y0 = dequantize(GgmlType::Q5_0, quantize(GgmlType::Q5_0, x), x.size());
  const std::vector<float> y1 = dequantize(GgmlType::Q5_1, quantize(GgmlType::Q5_1, x), x.size());
  auto fp16_err = [](float v) { return std::max(std::fabs(v) * std::ldexp(1.0f, -11), 3e-8f); };
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* xb = &x[b * 32];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(xb[j])) amax = std::fabs(xb[j]), max = xb[j];
    }
    const float mn = *std::min_element(xb, xb + 32), mx = *std::max_element(xb, xb + 32);
    const float d0 = amax / 16, d1 = (mx - mn) / 31;
    for (int j = 0; j < 32; ++j) {
      const bool clamped = xb[j] * max < 0 && std::fabs(xb[j]) > 15.5f * d0;
      const float b0 = (clamped ? 1.0f : 0.5f) * d0 + 16 * fp16_err(d0) + 1e-6f * amax;
      const float b1 = 0.5f * d1 + 31 * fp16_err(d1) + fp16_err(mn) + 1e-6f * (mx - mn);
      ASSERT_LE(std::fabs(y0[b * 32 + j] - xb[j]), b0) << "q5_0 block " << b << " j " << j;
      ASSERT_LE(std::fabs(y1[b * 32 + j] - xb[j]), b1) << "q5_1 block " << b << " j " << j;
    }
  }
}

TEST(KRoundTripTiny, SmallValuesStayClose) {
  // |x| ~ 1e-4 (fp16 super-block scales are subnormal): still no NaN, signs kept for values
  // above a few grid steps, and an RMS error within 15% of the values' RMS.
  const std::vector<float> x = realistic(1e-4f, 44, 64);
  for (GgmlType t : kNewTypes) {
    const std::vector<float> y = dequantize(t, quantize(t, x), x.size());
    double se = 0, sx = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << type_name(t);
      se += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
      sx += double(x[i]) * x[i];
    }
    EXPECT_LE(std::sqrt(se / sx), 0.15) << type_name(t);
  }
}

// --- convert_row across block sizes --------------------------------------------------------------

TEST(ConvertRowK, RequantizeEqualsDequantThenQuantize) {
  // 4608 = 18 super-blocks: more than one 4096-element chunk of convert_row.
  const std::vector<float> x = realistic(0.05f, 45, 18);
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<uint8_t> q6 = quantize(GgmlType::Q6_K, x);
  for (GgmlType dst : {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::F16}) {
    const std::vector<uint8_t> want = quantize(dst, dequantize(GgmlType::Q6_K, q6, x.size()));
    std::vector<uint8_t> got(want.size(), 0x5a);
    convert_row(GgmlType::Q6_K, q6.data(), dst, got.data(), n);
    EXPECT_EQ(got, want) << "q6_k -> " << type_name(dst);
  }
  const std::vector<uint8_t> q50 = quantize(GgmlType::Q5_0, x);
  const std::vector<uint8_t> want =
      quantize(GgmlType::Q5_K, dequantize(GgmlType::Q5_0, q50, x.size()));
  std::vector<uint8_t> got(want.size(), 0x5a);
  convert_row(GgmlType::Q5_0, q50.data(), GgmlType::Q5_K, got.data(), n);
  EXPECT_EQ(got, want);
}

// --- errors --------------------------------------------------------------------------------------

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(QuantErrors, KRowNotAMultipleOf256) {
  std::vector<float> x(576, 0.5f);
  std::vector<uint8_t> out(4096);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const std::string msg = error_of([&] { quantize_row(t, x.data(), out.data(), 576); });
    EXPECT_NE(msg.find("row of 576 elements is not a whole number of " + std::string(type_name(t)) +
                       " blocks (256 elements each)"),
              std::string::npos)
        << msg;
    EXPECT_NE(error_of([&] { dequantize_row(t, out.data(), x.data(), 288); }), "");
    EXPECT_NE(error_of([&] { convert_row(GgmlType::F32, x.data(), t, out.data(), 544); }), "");
  }
  // 32-blocks still reject 48 elements; unsupported types name the supported ones.
  EXPECT_NE(error_of([&] { quantize_row(GgmlType::Q5_1, x.data(), out.data(), 48); }), "");
  const std::string msg =
      error_of([&] { quantize_row(GgmlType::Q3_K, x.data(), out.data(), 256); });
  EXPECT_NE(msg.find("q5_0, q5_1, q8_0, q4_k, q5_k, q6_k"), std::string::npos) << msg;
}

TEST(QuantErrors, NonFiniteNamesTheElementForEveryNewType) {
  for (GgmlType t : kNewTypes) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> x = test::randn(512, 7, 0.02f);
      x[300] = bad;
      std::vector<uint8_t> out(row_bytes(*type_info(t), 512));
      const std::string msg = error_of([&] { quantize_row(t, x.data(), out.data(), 512); });
      EXPECT_NE(msg.find("element 300"), std::string::npos) << type_name(t) << ": " << msg;
      EXPECT_NE(msg.find("non-finite"), std::string::npos) << msg;
    }
  }
}

TEST(QuantErrors, ScaleOverflow) {
  std::vector<float> x = test::randn(256, 8, 1.0f);
  std::vector<uint8_t> out(256);
  x[9] = 1e8f;  // Q4_K: d ~ 1e8 / 15 / 63 > 65504; Q6_K: d ~ 1e8 / 32 / 128 = 24414 fits
  EXPECT_NE(error_of([&] {
              quantize_row(GgmlType::Q4_K, x.data(), out.data(), 256);
            }).find("overflows fp16"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { quantize_row(GgmlType::Q6_K, x.data(), out.data(), 256); }), "");
  x[9] = 2e6f;  // Q5_0: d = 2e6 / 16 = 125000 does not fit fp16
  EXPECT_NE(error_of([&] {
              quantize_row(GgmlType::Q5_0, x.data(), out.data(), 256);
            }).find("q5_0 block starting at element 0"),
            std::string::npos);
  x[9] = 3e9f;  // beyond any fp16 super-block scale: rejected before the fit
  const std::string msg =
      error_of([&] { quantize_row(GgmlType::Q6_K, x.data(), out.data(), 256); });
  EXPECT_NE(msg.find("element 9 is too large for q6_k"), std::string::npos) << msg;
}

}  // namespace
}  // namespace smolrt
