#include "quant/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"

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

// --- block quantizers (base = index of x[0] in the caller's row, for messages) -------------------

void q4_0_block(const float* x, BlockQ4_0& y, int64_t base) {
  check_finite_block(x, kQK, base);
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    const float a = std::fabs(x[j]);
    if (amax < a) {
      amax = a;
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = inverse_scale(d);
  y.d = scale_to_fp16(d, base, "q4_0");
  for (int j = 0; j < 16; ++j) {
    const int8_t lo = std::min<int8_t>(15, static_cast<int8_t>(x[j] * id + 8.5f));
    const int8_t hi = std::min<int8_t>(15, static_cast<int8_t>(x[j + 16] * id + 8.5f));
    y.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void q4_1_block(const float* x, BlockQ4_1& y, int64_t base) {
  check_finite_block(x, kQK, base);
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < kQK; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
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

void q8_0_block(const float* x, BlockQ8_0& y, int64_t base) {
  check_finite_block(x, kQK, base);
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = inverse_scale(d);
  y.d = scale_to_fp16(d, base, "q8_0");
  for (int j = 0; j < kQK; ++j) y.qs[j] = static_cast<int8_t>(round_half_away(x[j] * id));
}

// --- whole-row encoders with an element offset for messages --------------------------------------

void encode(GgmlType type, const float* x, void* dst, int64_t n, int64_t base) {
  switch (type) {
    case GgmlType::F32: {
      check_finite_block(x, n, base);
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      return;
    }
    case GgmlType::F16: {
      auto* y = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) non_finite(x[i], base + i);
        y[i] = f32_to_fp16(x[i]);
        if ((y[i] & 0x7c00u) == 0x7c00u) overflow(x[i], base + i, "f16 (max 65504)");
      }
      return;
    }
    case GgmlType::BF16: {
      auto* y = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) non_finite(x[i], base + i);
        y[i] = f32_to_bf16(x[i]);
        if ((y[i] & 0x7f80u) == 0x7f80u) overflow(x[i], base + i, "bf16");
      }
      return;
    }
    case GgmlType::Q4_0: {
      auto* y = static_cast<BlockQ4_0*>(dst);
      for (int64_t b = 0; b < n / kQK; ++b) q4_0_block(x + b * kQK, y[b], base + b * kQK);
      return;
    }
    case GgmlType::Q4_1: {
      auto* y = static_cast<BlockQ4_1*>(dst);
      for (int64_t b = 0; b < n / kQK; ++b) q4_1_block(x + b * kQK, y[b], base + b * kQK);
      return;
    }
    case GgmlType::Q8_0: {
      auto* y = static_cast<BlockQ8_0*>(dst);
      for (int64_t b = 0; b < n / kQK; ++b) q8_0_block(x + b * kQK, y[b], base + b * kQK);
      return;
    }
    default:
      break;
  }
  fail("cannot quantize to type ", type_name(type),
       "; supported: f32, f16, bf16, q4_0, q4_1, q8_0");
}

}  // namespace

// --- public API ----------------------------------------------------------------------------------

bool is_convertible(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
      return true;
    default:
      return false;
  }
}

void check_row_length(GgmlType t, int64_t n) {
  const TypeInfo* ti = type_info(t);
  if (!ti || !is_convertible(t)) {
    fail("type ", type_name(t), " (id ", static_cast<uint32_t>(t),
         ") is not supported for conversion; supported: f32, f16, bf16, q4_0, q4_1, q8_0");
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

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  check_row_length(type, n);
  encode(type, src, dst, n, 0);
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  check_row_length(type, n);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16: {
      const auto* x = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(x[i]);
      return;
    }
    case GgmlType::BF16: {
      const auto* x = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(x[i]);
      return;
    }
    case GgmlType::Q4_0: {
      const auto* x = static_cast<const BlockQ4_0*>(src);
      for (int64_t b = 0; b < n / kQK; ++b) dequant_block_q4_0(x[b], dst + b * kQK);
      return;
    }
    case GgmlType::Q4_1: {
      const auto* x = static_cast<const BlockQ4_1*>(src);
      for (int64_t b = 0; b < n / kQK; ++b) dequant_block_q4_1(x[b], dst + b * kQK);
      return;
    }
    case GgmlType::Q8_0: {
      const auto* x = static_cast<const BlockQ8_0*>(src);
      for (int64_t b = 0; b < n / kQK; ++b) dequant_block_q8_0(x[b], dst + b * kQK);
      return;
    }
    default:
      break;
  }
  fail("cannot dequantize type ", type_name(type));  // unreachable: check_row_length rejected it
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
  // Chunks of whole blocks of both types (block sizes are 1 or 32), through a 16 KiB stack
  // buffer so the row never needs a heap f32 copy.
  constexpr int64_t kChunk = 4096;
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
