#include "quant/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/format.h"

namespace smolrt {

namespace {

// --- error helpers -------------------------------------------------------------------------------

[[noreturn]] void non_finite(float v, int64_t idx) {
  fail("non-finite value ", v, " at element ", idx,
       "; quantization refuses NaN/inf weights (the source tensor is corrupt: re-export it)");
}

[[noreturn]] void overflow(float v, int64_t idx, const char* what) {
  fail("value ", v, " at element ", idx, " overflows ", what,
       "; keep this tensor in a wider type (e.g. --type f32 or q8_0)");
}

// Block-scale overflow: |d| would become inf in fp16.
[[noreturn]] void scale_overflow(float d, int64_t block_start, const char* fmt) {
  fail(fmt, " block starting at element ", block_start, " needs scale ", d,
       ", which overflows fp16 (max 65504); keep this tensor in f16/f32");
}

// Branch-free scan first (vectorizes), then the index of the first bad value only on failure.
inline void check_finite_block(const float* x, int64_t n, int64_t base) {
  uint32_t bad = 0;
  for (int64_t j = 0; j < n; ++j) bad |= (f32_to_bits(x[j]) & 0x7f800000u) == 0x7f800000u;
  if (!bad) return;
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(x[j])) non_finite(x[j], base + j);
  }
}

// (int)roundf(v) (halves away from zero) for |v| < 2^23 without the libm call: the integer part
// and the remainder v - t are exact in float.
inline int round_half_away(float v) {
  const int t = static_cast<int>(v);
  const float frac = v - static_cast<float>(t);
  return t + (frac >= 0.5f) - (frac <= -0.5f);
}

inline uint16_t scale_to_fp16(float d, int64_t base, const char* fmt) {
  const uint16_t h = f32_to_fp16(d);
  if ((h & 0x7c00u) == 0x7c00u) scale_overflow(d, base, fmt);
  return h;
}

// 1/d as the reference computes it; a d so small that 1/d overflows is treated as 0 (see header).
inline float inverse_scale(float d) {
  if (d == 0.0f) return 0.0f;
  const float id = 1.0f / d;
  return std::isfinite(id) ? id : 0.0f;
}

// 32 5th bits as the little-endian uint32 the Q5_0 / Q5_1 blocks store.
inline void store_qh(uint32_t qh, uint8_t* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(qh >> (8 * i));
}

// The element of x with the largest magnitude (the first of equals; 0 when all are zero), as the
// reference quantizers pick the signed maximum of Q4_0 / Q5_0 blocks and Q6_K groups.
inline float largest_magnitude(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float a = std::fabs(x[j]);
    if (amax < a) {
      amax = a;
      max = x[j];
    }
  }
  return max;
}

// The least and greatest element of x (Q4_1 / Q5_1 blocks).
inline void min_max(const float* x, int n, float& min, float& max) {
  min = FLT_MAX;
  max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
}

}  // namespace

// --- the formats' quantizers (format.h; base = index of x[0] in the caller's row, for messages) --

void Format<GgmlType::Q4_0>::quantize(const float* x, BlockQ4_0& y, int64_t base) {
  check_finite_block(x, kQK, base);
  const float max = largest_magnitude(x, kQK);
  const float d = max / -8.0f;
  const float id = inverse_scale(d);
  y.d = scale_to_fp16(d, base, "q4_0");
  for (int j = 0; j < 16; ++j) {
    const int8_t lo = std::min<int8_t>(15, static_cast<int8_t>(x[j] * id + 8.5f));
    const int8_t hi = std::min<int8_t>(15, static_cast<int8_t>(x[j + 16] * id + 8.5f));
    y.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void Format<GgmlType::Q4_1>::quantize(const float* x, BlockQ4_1& y, int64_t base) {
  check_finite_block(x, kQK, base);
  float min, max;
  min_max(x, kQK, min, max);
  const float d = (max - min) / 15.0f;  // may be inf when max - min overflows: rejected below
  if (!std::isfinite(d)) scale_overflow(d, base, "q4_1");
  const float id = inverse_scale(d);
  y.d = scale_to_fp16(d, base, "q4_1");
  y.m = scale_to_fp16(min, base, "q4_1 (minimum)");
  for (int j = 0; j < 16; ++j) {
    const int8_t lo = std::min<int8_t>(15, static_cast<int8_t>((x[j] - min) * id + 0.5f));
    const int8_t hi = std::min<int8_t>(15, static_cast<int8_t>((x[j + 16] - min) * id + 0.5f));
    y.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void Format<GgmlType::Q8_0>::quantize(const float* x, BlockQ8_0& y, int64_t base) {
  check_finite_block(x, kQK, base);
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = inverse_scale(d);
  y.d = scale_to_fp16(d, base, "q8_0");
  for (int j = 0; j < kQK; ++j) y.qs[j] = static_cast<int8_t>(round_half_away(x[j] * id));
}

void Format<GgmlType::Q5_0>::quantize(const float* x, BlockQ5_0& y, int64_t base) {
  check_finite_block(x, kQK, base);
  const float max = largest_magnitude(x, kQK);
  const float d = max / -16.0f;
  const float id = inverse_scale(d);
  y.d = scale_to_fp16(d, base, "q5_0");
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min<int8_t>(31, static_cast<int8_t>(x[j] * id + 16.5f));
    const int hi = std::min<int8_t>(31, static_cast<int8_t>(x[j + 16] * id + 16.5f));
    y.qs[j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
    qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
  }
  store_qh(qh, y.qh);
}

void Format<GgmlType::Q5_1>::quantize(const float* x, BlockQ5_1& y, int64_t base) {
  check_finite_block(x, kQK, base);
  float min, max;
  min_max(x, kQK, min, max);
  const float d = (max - min) / 31.0f;
  if (!std::isfinite(d)) scale_overflow(d, base, "q5_1");
  const float id = inverse_scale(d);
  y.d = scale_to_fp16(d, base, "q5_1");
  y.m = scale_to_fp16(min, base, "q5_1 (minimum)");
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    // The reference truncates without a clamp: (x - min) * id <= 31 * (1 + a few ulp), so the
    // level never exceeds 31; the min() below never binds.
    const int lo = std::min(31, static_cast<int>((x[j] - min) * id + 0.5f));
    const int hi = std::min(31, static_cast<int>((x[j + 16] - min) * id + 0.5f));
    y.qs[j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
    qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
  }
  store_qh(qh, y.qh);
}

namespace {

// --- K-quants (256-element super-blocks) ---------------------------------------------------------

// Round to nearest, ties to even, as ggml's nearest_int: adding 1.5 * 2^23 leaves the rounded
// integer in the low mantissa bits. Exact for |v| <= 2^22 - 1; outside that range (and for
// inf/NaN, which the fits below can produce for degenerate sub-blocks) it returns the same
// deterministic bits as the reference, with no undefined float -> int conversion.
inline int nearest_int(float v) {
  const float t = v + 12582912.0f;
  return static_cast<int>(f32_to_bits(t) & 0x007fffffu) - 0x00400000;
}

// A super-block whose largest |x| exceeds this cannot be represented with fp16 super-block
// scales in any K format (the largest representable |w| is 65504 * 63 * 31 for Q5_K, 65504 *
// 127 * 32 for Q6_K, both < 2.7e8); rejecting it up front also keeps the fits' x^3 sums finite.
constexpr float kKMaxAbs = 1e9f;

void check_k_block(const float* x, int64_t base, const char* fmt) {
  check_finite_block(x, kQKK, base);
  for (int j = 0; j < kQKK; ++j) {
    if (std::fabs(x[j]) > kKMaxAbs) {
      fail("value ", x[j], " at element ", base + j, " is too large for ", fmt,
           " (|x| > 1e9 needs a super-block scale beyond fp16); keep this tensor in f16/f32");
    }
  }
}

// Symmetric fit of n values to integer levels l in [-nmax, nmax - 1] (ggml's make_qx_quants
// with rmse_type 1 and no importance weights, as quantize_row_q6_K_ref calls it). Weights
// w = x^2. Start from iscale = -nmax / max (max = the value of largest magnitude, first wins)
// and keep, among that and the 18 trial scales -(nmax + 0.1 * is) / max, is = -9..9 (not 0), the
// one with the largest sumlx^2 / suml2 (least weighted squared error). L receives l + nmax; the
// return value is the least-squares scale sumlx / suml2. All sums in f32, in element order.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  const float max = largest_magnitude(x, n);
  const float amax = std::fabs(max);
  if (amax < 1e-15f) {  // ggml's GROUP_MAX_EPS: an all-zero group
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float fnmax = static_cast<float>(nmax);
  float iscale = -fnmax / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(fnmax + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float fl =
          static_cast<float>(std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        L[i] = static_cast<int8_t>(nmax +
                                   std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Asymmetric fit x ~ scale * l - the_min, l in [0, nmax], minimizing sum w * err^2 (ggml's
// make_qkx2_quants with use_mad = false). min starts at min(x, 0) and the first guess is
// iscale = nmax / (max - min); then for is = 0..nstep the levels for iscale = (rmin + rdelta * is
// + nmax) / (max - min) get a weighted least-squares (scale, min) (min clamped to <= 0, scale
// refit), kept when its error is lower. The running `min` is the best fit so far, and later
// trials measure from it, as in the reference. Returns scale; *the_min = -min >= 0.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  const float fnmax = static_cast<float>(nmax);
  float iscale = fnmax / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
    L[i] = static_cast<uint8_t>(l);
    const float diff = scale * static_cast<float>(l) + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + fnmax) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = static_cast<uint8_t>(l);
      const float wl = weights[i] * static_cast<float>(l);
      sum_l += wl;
      sum_l2 += wl * static_cast<float>(l);
      sum_xl += wl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0.0f) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0.0f) {
        this_min = 0.0f;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0.0f;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        cur_error += weights[i] * (diff * diff);
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Q4_K / Q5_K share everything but the level count and the fit's trial range:
//   1. per sub-block j of 32: weights w = sqrt(mean(x^2)) + |x|; (scale_j, min_j) =
//      make_qkx2_quants(32, nmax, ...) with (rmin, rdelta, nstep) = (-1, 0.1, 20) for Q4_K,
//      (-0.5, 0.1, 15) for Q5_K;
//   2. d = max_j scale_j / 63, dmin = max_j min_j / 63 (fp16); the 6-bit sub-block values are
//      nearest_int(63 / max * scale_j) (and of min_j), capped at 63, packed as k_scale_min reads;
//   3. levels are recomputed from the stored values: l = nearest_int((x + dmin*m_j) / (d*sc_j)),
//      clamped to [0, nmax]; a sub-block whose d*sc_j is 0 keeps the levels of step 1.
// Returns the levels in L[256].
template <typename Block>
void k_scales_and_levels(const float* x, Block& y, uint8_t* L, int nmax, float rmin, float rdelta,
                         int nstep, int64_t base, const char* fmt) {
  float scales[8], mins[8], weights[32];
  uint8_t Laux[32];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] =
        make_qkx2_quants(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    // The reference stores nearest_int into a uint8_t before capping (a negative fit wraps to a
    // large value and is capped to 63).
    const uint8_t ls =
        std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      y.scales[j] = ls;
      y.scales[j + 4] = lm;
    } else {
      y.scales[j + 4] = static_cast<uint8_t>((ls & 0x0f) | ((lm & 0x0f) << 4));
      y.scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      y.scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  y.d = scale_to_fp16(max_scale / 63.0f, base, fmt);
  y.dmin = scale_to_fp16(max_min / 63.0f, base, fmt);
  const float d_all = fp16_to_f32(y.d), dmin_all = fp16_to_f32(y.dmin);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k_scale_min(j, y.scales, sc, m);
    const float d = d_all * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = dmin_all * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] =
          static_cast<uint8_t>(std::max(0, std::min(nmax, nearest_int((x[32 * j + l] + dm) / d))));
    }
  }
}

}  // namespace

void Format<GgmlType::Q4_K>::quantize(const float* x, BlockQ4_K& y, int64_t base) {
  check_k_block(x, base, "q4_k");
  uint8_t L[kQKK];
  k_scales_and_levels(x, y, L, 15, -1.0f, 0.1f, 20, base, "q4_k");
  // Sub-blocks 2i and 2i+1 share qs[32i..32i+31]: low nibbles the even one, high the odd one.
  for (int i = 0; i < 4; ++i) {
    for (int l = 0; l < 32; ++l) {
      y.qs[32 * i + l] = static_cast<uint8_t>(L[64 * i + l] | (L[64 * i + 32 + l] << 4));
    }
  }
}

void Format<GgmlType::Q5_K>::quantize(const float* x, BlockQ5_K& y, int64_t base) {
  check_k_block(x, base, "q5_k");
  uint8_t L[kQKK];
  k_scales_and_levels(x, y, L, 31, -0.5f, 0.1f, 15, base, "q5_k");
  // Low 4 bits as Q4_K; bit j of qh[l] is the 5th bit of weight l of sub-block j.
  std::memset(y.qh, 0, sizeof y.qh);
  for (int i = 0; i < 4; ++i) {
    for (int l = 0; l < 32; ++l) {
      const int l1 = L[64 * i + l], l2 = L[64 * i + 32 + l];
      y.qh[l] |= static_cast<uint8_t>(((l1 >> 4) << (2 * i)) | ((l2 >> 4) << (2 * i + 1)));
      y.qs[32 * i + l] = static_cast<uint8_t>((l1 & 0x0f) | ((l2 & 0x0f) << 4));
    }
  }
}

// Q6_K (quantize_row_q6_K_ref):
//   1. per group of 16: scale_g = make_qx_quants(16, 32, ...) (levels l + 32 in [0, 63]);
//   2. max_scale = the scale of largest magnitude (first wins); below 1e-15 the block is all
//      zero bytes; else iscale = -128 / max_scale, d = fp16(1 / iscale), and the int8 group
//      scales are min(127, nearest_int(iscale * scale_g));
//   3. levels recomputed: l = nearest_int(x / (d * sc_g)) clamped to [-32, 31], stored + 32; a
//      group whose d * sc_g is 0 keeps the levels of step 1;
//   4. packing as in formats.h (ql low nibbles, qh 2-bit pairs).
void Format<GgmlType::Q6_K>::quantize(const float* x, BlockQ6_K& y, int64_t base) {
  check_k_block(x, base, "q6_k");
  int8_t L[kQKK];
  float scales[16];
  float max_scale = 0.0f, max_abs_scale = 0.0f;
  for (int g = 0; g < 16; ++g) {
    scales[g] = make_qx_quants(16, 32, x + 16 * g, L + 16 * g);
    const float a = std::fabs(scales[g]);
    if (a > max_abs_scale) {
      max_abs_scale = a;
      max_scale = scales[g];
    }
  }
  if (max_abs_scale < 1e-15f) {
    std::memset(&y, 0, sizeof y);  // fp16 +0 scale, all-zero levels
    return;
  }
  const float iscale = -128.0f / max_scale;
  y.d = scale_to_fp16(1.0f / iscale, base, "q6_k");
  for (int g = 0; g < 16; ++g) {
    y.scales[g] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[g])));
  }
  const float d_all = fp16_to_f32(y.d);
  for (int g = 0; g < 16; ++g) {
    const float d = d_all * static_cast<float>(y.scales[g]);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i) {
      const int l = std::max(-32, std::min(31, nearest_int(x[16 * g + i] / d)));
      L[16 * g + i] = static_cast<int8_t>(l + 32);
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int8_t* Lh = L + 128 * h;
    uint8_t* ql = y.ql + 64 * h;
    uint8_t* qh = y.qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
      ql[l] = static_cast<uint8_t>((q1 & 0x0f) | ((q3 & 0x0f) << 4));
      ql[l + 32] = static_cast<uint8_t>((q2 & 0x0f) | ((q4 & 0x0f) << 4));
      qh[l] =
          static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
  }
}

namespace {

// --- whole-row encoders with an element offset for messages --------------------------------------

void encode(GgmlType type, const float* x, void* dst, int64_t n, int64_t base) {
  const bool known = with_format(type, [&](auto f) {
    using F = decltype(f);
    auto* y = static_cast<typename F::Block*>(dst);
    for (int64_t b = 0; b < n / F::kBlockSize; ++b)
      F::quantize(x + b * F::kBlockSize, y[b], base + b * F::kBlockSize);
  });
  if (!known) fail("cannot quantize to type ", type_name(type), "; supported: ", format_names());
}

}  // namespace

// --- the element formats' quantizers (format.h) --------------------------------------------------

void Format<GgmlType::F32>::quantize(const float* x, float& y, int64_t base) {
  if (!std::isfinite(*x)) non_finite(*x, base);
  y = *x;
}

void Format<GgmlType::F16>::quantize(const float* x, uint16_t& y, int64_t base) {
  if (!std::isfinite(*x)) non_finite(*x, base);
  y = f32_to_fp16(*x);
  if ((y & 0x7c00u) == 0x7c00u) overflow(*x, base, "f16 (max 65504)");
}

void Format<GgmlType::BF16>::quantize(const float* x, uint16_t& y, int64_t base) {
  if (!std::isfinite(*x)) non_finite(*x, base);
  y = f32_to_bf16(*x);
  if ((y & 0x7f80u) == 0x7f80u) overflow(*x, base, "bf16");
}

// --- public API ----------------------------------------------------------------------------------

bool is_convertible(GgmlType t) {
  return is_format(t);
}

void check_row_length(GgmlType t, int64_t n) {
  const TypeInfo* ti = type_info(t);
  if (!ti || !is_convertible(t)) {
    fail("type ", type_name(t), " (id ", static_cast<uint32_t>(t),
         ") is not supported for conversion; supported: ", format_names());
  }
  if (n < 0 || n % ti->block_size != 0) {
    fail("row of ", n, " elements is not a whole number of ", ti->name, " blocks (", ti->block_size,
         " elements each)");
  }
}

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n) {
  check_row_length(GgmlType::Q4_0, n);
  encode(GgmlType::Q4_0, x, y, n, 0);
}

void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n) {
  check_row_length(GgmlType::Q4_1, n);
  encode(GgmlType::Q4_1, x, y, n, 0);
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  check_row_length(GgmlType::Q8_0, n);
  encode(GgmlType::Q8_0, x, y, n, 0);
}

void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n) {
  check_row_length(GgmlType::Q5_0, n);
  encode(GgmlType::Q5_0, x, y, n, 0);
}

void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n) {
  check_row_length(GgmlType::Q5_1, n);
  encode(GgmlType::Q5_1, x, y, n, 0);
}

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n) {
  check_row_length(GgmlType::Q4_K, n);
  encode(GgmlType::Q4_K, x, y, n, 0);
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n) {
  check_row_length(GgmlType::Q5_K, n);
  encode(GgmlType::Q5_K, x, y, n, 0);
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n) {
  check_row_length(GgmlType::Q6_K, n);
  encode(GgmlType::Q6_K, x, y, n, 0);
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  check_row_length(type, n);
  encode(type, src, dst, n, 0);
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  check_row_length(type, n);
  with_format(type, [&](auto f) {
    using F = decltype(f);
    const auto* x = static_cast<const typename F::Block*>(src);
    for (int64_t b = 0; b < n / F::kBlockSize; ++b) F::dequantize(x[b], dst + b * F::kBlockSize);
  });
}

void convert_row(GgmlType src_type, const void* src, GgmlType dst_type, void* dst, int64_t n) {
  check_row_length(src_type, n);
  check_row_length(dst_type, n);
  const TypeInfo& si = *type_info(src_type);
  const TypeInfo& di = *type_info(dst_type);
  if (src_type == dst_type) {
    std::memcpy(dst, src, row_bytes(si, static_cast<uint64_t>(n)));
    return;
  }
  // Chunks of whole blocks of both types (block sizes are 1, 32 or 256), through a 16 KiB stack
  // buffer so the row never needs a heap f32 copy.
  constexpr int64_t kChunk = 4096;
  static_assert(kChunk % kQKK == 0, "a chunk must hold whole super-blocks");
  float buf[kChunk];
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    dequantize_row(src_type, s + row_bytes(si, static_cast<uint64_t>(i)), buf, len);
    encode(dst_type, buf, d + row_bytes(di, static_cast<uint64_t>(i)), len, i);
  }
}

}  // namespace smolrt
