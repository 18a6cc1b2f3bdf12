// Tensor element types and quantization block layouts, shared by CPU and CUDA code.
//
// Block formats (32 weights per block, facts.md):
//   Q4_0 (18 B): fp16 d, 16 B qs. w[j] = ((qs[j] & 15) - 8) * d, w[j+16] = ((qs[j] >> 4) - 8) * d.
//   Q4_1 (20 B): fp16 d, fp16 m, 16 B qs. w = nibble * d + m (same nibble order as Q4_0).
//   Q5_0 (22 B): fp16 d, 4 B qh (bit j = 5th bit of weight j), 16 B qs (Q4_0 nibble order).
//                w = (q5 - 16) * d.
//   Q5_1 (24 B): fp16 d, fp16 m, 4 B qh, 16 B qs. w = q5 * d + m.
//   Q8_0 (34 B): fp16 d, 32 x int8. w = q * d.
// K-quants (256 weights per super-block, ggml's k_quants):
//   Q4_K (144 B): fp16 d, fp16 dmin, 12 B of packed 6-bit (scale, min) pairs for the 8
//                sub-blocks of 32, 128 B qs. Sub-block j: bytes 32*(j/2).. of qs, low nibbles for
//                even j, high for odd j. w = d*sc_j * q - dmin*m_j.
//   Q5_K (176 B): as Q4_K plus 32 B qh: bit j of qh[l] is the 5th bit of weight l of sub-block j.
//   Q6_K (210 B): 128 B ql (low 4 bits), 64 B qh (high 2 bits), 16 int8 scales (one per 16
//                weights), fp16 d. w = d * sc * (q6 - 32). Layout: two halves of 128 weights; half
//                h, l < 32: weights l, l+32, l+64, l+96 take ql[64h+l] lo, ql[64h+l+32] lo,
//                ql[64h+l] hi, ql[64h+l+32] hi and bit pairs 0, 2, 4, 6 of qh[32h+l]; scale
//                index 8h + l/16 + {0, 2, 4, 6}.
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

constexpr int kQK = 32;    // weights per block for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
constexpr int kQKK = 256;  // weights per super-block for the K-quants

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

struct BlockQ5_0 {
  uint16_t d;      // fp16 scale
  uint8_t qh[4];   // 5th bits, little-endian uint32: bit j for weight j
  uint8_t qs[16];  // low nibbles as Q4_0
};
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block must be 22 bytes");

struct BlockQ5_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block must be 24 bytes");

struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");

struct BlockQ4_K {
  uint16_t d;          // fp16 super-block scale of the sub-block scales
  uint16_t dmin;       // fp16 super-block scale of the sub-block minima
  uint8_t scales[12];  // 8 x (6-bit scale, 6-bit min), packed (k_scale_min below)
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block must be 144 bytes");

struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block must be 176 bytes");

struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block must be 210 bytes");

// Size facts for every type id GGUF files may carry, supported for compute or not.
struct TypeInfo {
  GgmlType type;
  const char* name;  // "q4_0", as llama.cpp prints it
  int block_size;    // elements per block (1 for F32/F16/BF16)
  int block_bytes;   // bytes per block
  bool computable;   // the CPU backend computes it (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
                     // Q4_K, Q5_K, Q6_K); the CUDA backend checks its own kernel list
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

SMOLRT_HD uint32_t load_qh(const uint8_t* qh) {
  return (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) |
         ((uint32_t)qh[3] << 24);
}

SMOLRT_HD void dequant_block_q5_0(const BlockQ5_0& b, float* out) {
  const float d = fp16_to_f32(b.d);
  const uint32_t qh = load_qh(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b.qs[j] & 0x0f) | (int)(((qh >> j) << 4) & 0x10);
    const int hi = (b.qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
    out[j] = (float)(lo - 16) * d;
    out[j + 16] = (float)(hi - 16) * d;
  }
}

SMOLRT_HD void dequant_block_q5_1(const BlockQ5_1& b, float* out) {
  const float d = fp16_to_f32(b.d);
  const float m = fp16_to_f32(b.m);
  const uint32_t qh = load_qh(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b.qs[j] & 0x0f) | (int)(((qh >> j) << 4) & 0x10);
    const int hi = (b.qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
    out[j] = (float)lo * d + m;
    out[j + 16] = (float)hi * d + m;
  }
}

// Scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K / Q5_K (ggml's
// get_scale_min_k4): j < 4: low 6 bits of bytes j and j+4; j >= 4: a nibble of byte j+4 and the top
// two bits of bytes j-4 (scale) and j (min).
SMOLRT_HD void k_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K and Q5_K share everything but the 5th bit (qh == nullptr: Q4_K).
SMOLRT_HD void dequant_k4(uint16_t dh, uint16_t dminh, const uint8_t* scales, const uint8_t* qs,
                          const uint8_t* qh, float* out) {
  const float d = fp16_to_f32(dh);
  const float dmin = fp16_to_f32(dminh);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k_scale_min(j, scales, sc, m);
    const float d1 = d * (float)sc, m1 = dmin * (float)m;
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = (j & 1) * 4;
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0f) + (qh ? ((qh[l] >> j) & 1) << 4 : 0);
      out[32 * j + l] = d1 * (float)v - m1;
    }
  }
}

SMOLRT_HD void dequant_block_q4_k(const BlockQ4_K& b, float* out) {
  dequant_k4(b.d, b.dmin, b.scales, b.qs, nullptr, out);
}

SMOLRT_HD void dequant_block_q5_k(const BlockQ5_K& b, float* out) {
  dequant_k4(b.d, b.dmin, b.scales, b.qs, b.qh, out);
}

SMOLRT_HD void dequant_block_q6_k(const BlockQ6_K& b, float* out) {
  const float d = fp16_to_f32(b.d);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    const int8_t* sc = b.scales + 8 * h;
    float* y = out + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = (int)((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = (int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * (float)sc[is + 0] * (float)q1;
      y[l + 32] = d * (float)sc[is + 2] * (float)q2;
      y[l + 64] = d * (float)sc[is + 4] * (float)q3;
      y[l + 96] = d * (float)sc[is + 6] * (float)q4;
    }
  }
}

}  // namespace smolrt
