// Tensor element types and quantization block layouts, shared by CPU and CUDA code.
//
// Block formats (32 weights per block, facts.md):
//   Q4_0 (18 B): fp16 d, 16 B qs. w[j] = ((qs[j] & 15) - 8) * d, w[j+16] = ((qs[j] >> 4) - 8) * d.
//   Q4_1 (20 B): fp16 d, fp16 m, 16 B qs. w = nibble * d + m (same nibble order as Q4_0).
//   Q8_0 (34 B): fp16 d, 32 x int8. w = q * d.
// fp16 and bf16 are stored as raw uint16_t bits; the converters below are bit-exact IEEE
// (round to nearest even), usable on host and device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SMOLRT_HD __host__ __device__ __forceinline__
#else
#define SMOLRT_HD inline
#endif

namespace smolrt {

// GGML type ids as stored in GGUF tensor infos.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

constexpr int kQK = 32;  // weights per block for Q4_0, Q4_1, Q8_0

struct BlockQ4_0 {
  uint16_t d;      // fp16 scale
  uint8_t qs[16];  // nibbles: low = weights 0..15, high = weights 16..31
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block must be 18 bytes");

struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block must be 20 bytes");

struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");

// Size facts for every type id GGUF files may carry, supported for compute or not.
struct TypeInfo {
  GgmlType type;
  const char* name;  // "q4_0", as llama.cpp prints it
  int block_size;    // elements per block (1 for F32/F16/BF16)
  int block_bytes;   // bytes per block
  bool computable;   // smolrt has kernels for it (F32, F16, BF16, Q4_0, Q4_1, Q8_0)
};

// nullptr for an id that is not a known GGML type.
const TypeInfo* type_info(uint32_t id);
inline const TypeInfo* type_info(GgmlType t) {
  return type_info(static_cast<uint32_t>(t));
}
const char* type_name(GgmlType t);  // "q4_0"; "unknown" for an unknown id

// Bytes of a row of n elements; n must be a multiple of the block size (checked by callers).
inline size_t row_bytes(const TypeInfo& ti, uint64_t n) {
  return static_cast<size_t>(n / ti.block_size) * ti.block_bytes;
}

// --- fp16 / bf16 <-> f32 (bit-exact, round to nearest even) -------------------------------------

SMOLRT_HD float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
SMOLRT_HD uint32_t f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

SMOLRT_HD float fp16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_to_f32(sign);
    // subnormal: value = mant * 2^-24
    float v = (float)mant * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

SMOLRT_HD uint16_t f32_to_fp16(float f) {
  const uint32_t x = f32_to_bits(f);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN (NaN keeps a quiet payload bit)
    return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  }
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520 -> inf
  if (ax < 0x38800000u) {               // below the smallest normal half (2^-14): subnormal or zero
    if (ax < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24 for the range handled here
    uint32_t half_m = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) half_m++;
    return (uint16_t)(sign | half_m);
  }
  uint32_t h = ((ax >> 13) - (112u << 10));
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // may carry into the exponent: fine
  return (uint16_t)(sign | h);
}

SMOLRT_HD float bf16_to_f32(uint16_t b) {
  return bits_to_f32((uint32_t)b << 16);
}

SMOLRT_HD uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)((x + rounding) >> 16);
}

// --- per-block dequantization (host and device)
// ---------------------------------------------------

SMOLRT_HD void dequant_block_q4_0(const BlockQ4_0& b, float* out) {
  const float d = fp16_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    out[j] = (float)((int)(b.qs[j] & 0x0f) - 8) * d;
    out[j + 16] = (float)((int)(b.qs[j] >> 4) - 8) * d;
  }
}

SMOLRT_HD void dequant_block_q4_1(const BlockQ4_1& b, float* out) {
  const float d = fp16_to_f32(b.d);
  const float m = fp16_to_f32(b.m);
  for (int j = 0; j < 16; ++j) {
    out[j] = (float)(b.qs[j] & 0x0f) * d + m;
    out[j + 16] = (float)(b.qs[j] >> 4) * d + m;
  }
}

SMOLRT_HD void dequant_block_q8_0(const BlockQ8_0& b, float* out) {
  const float d = fp16_to_f32(b.d);
  for (int j = 0; j < 32; ++j) out[j] = (float)b.qs[j] * d;
}

}  // namespace smolrt
