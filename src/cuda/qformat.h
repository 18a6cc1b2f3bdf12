// The weight formats as the CUDA kernels see them: ONE description per format, everything a kernel
// family needs of it. Adding a format = one QFormat specialization here (plus its block struct and
// reference dequantizer in quant/formats.h, its CPU quantizer, and its tests); the kernel families
// (gemv.cu's decode matvec with its fused epilogues, embed) are templates over QFormat and pick it
// up through the one dispatch table, for_each_format() / dispatch_format() below.
//
// Device image (dev_mat.h DevMat), lossless, made at upload by repack():
//   block formats: per block, kPay payload bytes (a multiple of 16, so every payload is 16-byte
//   aligned and read with 16-byte loads) in DevMat::q, and kMeta bytes of scales/minima/high bits
//   (a multiple of 2) in DevMat::d, both [rows][blocks per row]. Formats whose GGUF block is
//   already 16-byte sized with 16-byte aligned quants (Q4_K, Q5_K) keep it whole as the payload.
//   float formats (F32, F16, BF16): the GGUF bytes, row-major, DevMat::d unused.
//
// Kernels work in "units" of 32 consecutive columns (a 32-weight block, or one 32-weight sub-block
// of a 256-weight K-quant super-block): load(m, row, u) fetches unit u of a row into registers
// (its Raw), dot(raw, x, xsum) multiplies it with x[0..31] including every scale (xsum: the sum
// of x[0..31], which formats with a minimum need; kLayout.xsum says so, and the kernels compute it
// once per slice of x they hold rather than per row), at(m, r, c) decodes one weight (embedding
// rows). The K-quants also describe the matvec's int8 path (where a block computes enough rows):
// load_pair(m, row, g) fetches the two units of group g that share their quant bytes (units
// pair_first(g) and pair_first(g) + kPairStep), idot_pair(raw, x0, x1) their product with x
// quantized to two int8 levels (XQ, DP4A). Dequantized values
// equal the reference dequantizer's (formats.h) up to the order of fp32 operations (the kernels
// factor the scale out of the sum).
//
// The prefill GEMM (gemm.cu) reads 16 weights per thread and 64-column chunk: of unit u, the
// columns 8h + k and 16 + 8h + k (k < 8, h = 0 or 1: which half of the unit's lane pair).
// load16(q, d, blk, j, h) fetches them raw (Raw16; blk = the unit's block, j = the unit inside it),
// pairs16(raw, h2) turns them into the mma's 8 fp16 pairs: pair 2s+q holds the weights of columns
// k and k+2 of half s&1 (k = 4(s/2)+q, column 8h + k + 16*(s&1)). The quants become fp16 by the
// exact magic-number trick (int2_h2: no integer-to-float conversion, a quarter-rate instruction
// on Hopper), then the block scale (and minimum) apply in fp16: the weight rounded once (twice
// with a minimum) to fp16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/format.h"
#include "quant/formats.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define SMOLRT_DEV __device__ __forceinline__
#endif

namespace smolrt::cuda {

struct DevMat;  // dev_mat.h

// Device layout of a format (see above). qk: weights per block (1 for float formats).
struct DevLayout {
  int qk = 1;
  int pay = 0;   // payload bytes per block (block formats), bytes per element (float formats)
  int meta = 0;  // meta bytes per block
  bool block = false;
  bool xsum = false;  // dot() takes the sum of x (a minimum per block)
};

template <GgmlType T>
struct QFormat;

#if defined(__CUDACC__)
// --- device helpers shared by the format descriptions --------------------------------------------

// 2^23 + byte e of v, as a float: PRMT puts the byte under the exponent of 2^23, so subtracting
// a bias gives small integers EXACTLY (bit-identical to a cast). This replaces I2F, a
// quarter-rate conversion on Hopper (16/clk/SM) that bounded the dequantizing matvecs; PRMT and
// FADD run at full rate. e must fold to a constant (unrolled loops).
SMOLRT_DEV float byte_plus_2p23(uint32_t v, int e) {
  return __int_as_float((int)__byte_perm(v, 0x4B000000u, 0x7440u | (unsigned)e));
}
constexpr float k2p23 = 8388608.f;

// sum_e (byte e of w[i] - bias) * x[4i + e] over the 4 words of w, in one fixed order.
SMOLRT_DEV float bytes_dot16(const uint32_t (&w)[4], const float* x, float bias) {
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) t += (byte_plus_2p23(w[i], e) - bias) * x[4 * i + e];
  }
  return t;
}

SMOLRT_DEV float x_sum32(const float* x) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 32; ++j) s += x[j];
  return s;
}

// Bits 0..3 of v to bit 4 of bytes 0..3 (the 5th bit of four weights).
SMOLRT_DEV uint32_t spread4_bit4(uint32_t v) {
  return ((v & 0xFu) * 0x00204081u & 0x01010101u) << 4;
}

SMOLRT_DEV float h2f(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

SMOLRT_DEV uint4 ldg16(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

SMOLRT_DEV void words(const uint4& v, uint32_t (&w)[4]) {
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}

SMOLRT_DEV uint2 ldg8(const void* p) {
  return __ldg(static_cast<const uint2*>(p));
}

// Two small non-negative integers in bits 0-9 and 16-25 of v -> the fp16 pair (v0 - bias,
// v1 - bias), exact: 0x6400 | n is 1024 + n in fp16.
SMOLRT_DEV __half2 int2_h2(uint32_t v, float bias) {
  const uint32_t h = v | 0x64006400u;
  return __hsub2(*reinterpret_cast<const __half2*>(&h), __float2half2_rn(1024.f + bias));
}
SMOLRT_DEV uint32_t h2_bits(__half2 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}
SMOLRT_DEV __half2 h2_of(float v) {
  return __float2half2_rn(v);
}

// Q4_0-style nibble block (16 bytes: low nibbles = weights 0..15, high = 16..31) plus optional 5th
// bits (qh bit j for weight j), dotted with x[0..31] after subtracting `bias` from each value.
SMOLRT_DEV float nib_dot32(const uint4& q, uint32_t qh, bool has_qh, const float* x, float bias) {
  uint32_t w[4];
  words(q, w);
  uint32_t lo[4], hi[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo[i] = w[i] & 0x0F0F0F0Fu;
    hi[i] = (w[i] >> 4) & 0x0F0F0F0Fu;
    if (has_qh) {
      lo[i] |= spread4_bit4(qh >> (4 * i));
      hi[i] |= spread4_bit4(qh >> (16 + 4 * i));
    }
  }
  return bytes_dot16(lo, x, bias) + bytes_dot16(hi, x + 16, bias);
}

// --- the int8 path: x quantized per 32-column unit, dot products on DP4A ------------------------
// x = s * (hi + lo / kLoDiv) with int8 hi = rint(x / s), s = max|x| / 127, and int8
// lo = rint((x - s * hi) * kLoDiv / s): each element within s / (2 * kLoDiv) = max|x| / 64516 of
// its unit, about fp16's precision, at 4 multiply-adds per instruction and no dequantization.
constexpr float kLoDiv = 254.f;
constexpr float kMagic = 12582912.f;  // 1.5 * 2^23

// The two levels of one 32-column unit of x as a lane holds them (gemv.cu), with the unit's scale
// s and the sum of its fp32 values (formats with a minimum).
struct XQ {
  uint4 hi0, hi1, lo0, lo1;  // bytes of columns 0..15 and 16..31
  float s, sum;
};

// Quantizes the float4 v of columns 4(lane&7)..+3 of a unit held by 8 consecutive lanes (all 32
// lanes of the warp call it): its hi and lo words, the unit's scale and, with kSum, its fp32 sum
// (the same on the 8 lanes; a fixed xor tree, so deterministic; the lm_head's Q8_0 needs none, and
// its shuffles would not be dropped as dead code). Non-finite x: a NaN scale, so the rows come out
// NaN as in the fp32 path.
template <bool kSum>
SMOLRT_DEV void quantize_x4(float4 v, uint32_t& hi, uint32_t& lo, float& s, float& sum) {
  float am = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  if constexpr (kSum) sum = (v.x + v.y) + (v.z + v.w);
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) {
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    if constexpr (kSum) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  const bool fin = am <= 3.0e38f;
  s = fin ? am * (1.f / 127.f) : __int_as_float(0x7fc00000);
  const float inv = fin && am > 0.f ? 127.f / am : 0.f;
  // Rounding by kMagic: t = y + 1.5 * 2^23 holds rint(y) (ties to even) in its low mantissa bits,
  // so byte 0 of t's bits is rint(y) as an int8 (|y| <= 127) with no float-to-int conversion (a
  // quarter-rate instruction); lo's |y - h| * kLoDiv is at most 127 by construction.
  const float e[4] = {v.x, v.y, v.z, v.w};
  uint32_t hb[4], lb[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float y = e[i] * inv;
    const float th = y + kMagic;
    const float h = th - kMagic;
    hb[i] = __float_as_uint(th);
    lb[i] = __float_as_uint((y - h) * kLoDiv + kMagic);
  }
  hi = __byte_perm(__byte_perm(hb[0], hb[1], 0x0040u), __byte_perm(hb[2], hb[3], 0x0040u), 0x5410u);
  lo = __byte_perm(__byte_perm(lb[0], lb[1], 0x0040u), __byte_perm(lb[2], lb[3], 0x0040u), 0x5410u);
}

// Adds the DP4A dot products of 16 int8 weights w (signed bytes) with 16 columns of x's two
// levels to ih and il.
SMOLRT_DEV void idot16(const uint4& w, const uint4& h, const uint4& l, int& ih, int& il) {
  ih = __dp4a(
      (int)w.w, (int)h.w,
      __dp4a((int)w.z, (int)h.z, __dp4a((int)w.y, (int)h.y, __dp4a((int)w.x, (int)h.x, ih))));
  il = __dp4a(
      (int)w.w, (int)l.w,
      __dp4a((int)w.z, (int)l.z, __dp4a((int)w.y, (int)l.y, __dp4a((int)w.x, (int)l.x, il))));
}

// Bytes 0..63 of v less 32 each, as signed bytes: with 0x80 set no byte borrows from the next,
// and the xor turns 0x80 + (q - 32) into q - 32's two's complement.
SMOLRT_DEV uint32_t bytes_less_32(uint32_t v) {
  return ((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

// The two levels' integer sums as the dot product in units of x's scale: ih + il / kLoDiv.
// (|ih|, |il| < 2^22, so 1.5 * 2^23 + i is exact: no int-to-float conversion.)
SMOLRT_DEV float i2f_small(int i) {
  return __int_as_float(0x4B400000 + i) - kMagic;
}
SMOLRT_DEV float two_level(int ih, int il) {
  return i2f_small(ih) + i2f_small(il) * (1.f / kLoDiv);
}
#endif

// --- float formats
// --------------------------------------------------------------------------------

template <>
struct QFormat<GgmlType::F32> {
  static constexpr DevLayout kLayout{1, 4, 0, false};
#if defined(__CUDACC__)
  static SMOLRT_DEV float elem(const void* p, size_t i) {
    return __ldg(static_cast<const float*>(p) + i);
  }
#endif
};

// F16 and BF16: 16-bit elements; the GEMM takes element pairs (k, k+2) with one PRMT, BF16 then
// converted to fp16 pairs.
template <bool kBf>
struct QFormatHalf {
  static constexpr DevLayout kLayout{1, 2, 0, false};
#if defined(__CUDACC__)
  struct Raw16 {
    uint4 lo, hi;  // elements 8h..8h+7 and 16+8h.. of the unit
  };
  static SMOLRT_DEV Raw16 load16(const void* q, const uint16_t*, size_t blk, int, int h) {
    const uint16_t* p = static_cast<const uint16_t*>(q) + blk * 32 + 8 * h;
    return {ldg16(p), ldg16(p + 16)};
  }
  static SMOLRT_DEV void pairs16(const Raw16& r, uint32_t (&h2)[8]) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint4& g = (s & 1) ? r.hi : r.lo;
      const uint32_t w1 = (s >> 1) ? g.z : g.x, w2 = (s >> 1) ? g.w : g.y;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t v = __byte_perm(w1, w2, q ? 0x7632 : 0x5410);  // elements k, k+2
        if constexpr (kBf) {
          h2[2 * s + q] = h2_bits(
              __floats2half2_rn(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u)));
        } else {
          h2[2 * s + q] = v;
        }
      }
    }
  }
  static SMOLRT_DEV float elem(const void* p, size_t i) {
    const uint16_t b = __ldg(static_cast<const uint16_t*>(p) + i);
    if constexpr (kBf) return __uint_as_float((uint32_t)b << 16);
    return h2f(b);
  }
#endif
};
template <>
struct QFormat<GgmlType::F16> : QFormatHalf<false> {};
template <>
struct QFormat<GgmlType::BF16> : QFormatHalf<true> {};

// --- 32-weight block formats
// -----------------------------------------------------------------------

// Q4_0: payload qs (16 B), meta d.
template <>
struct QFormat<GgmlType::Q4_0> {
  static constexpr DevLayout kLayout{32, 16, 2, true};
  static void repack(const uint8_t* src, uint8_t* pay, uint8_t* meta) {
    const auto& b = *reinterpret_cast<const BlockQ4_0*>(src);
    std::memcpy(pay, b.qs, 16);
    std::memcpy(meta, &b.d, 2);
  }
#if defined(__CUDACC__)
  struct Raw {
    uint4 q;
    float d;
  };
  static SMOLRT_DEV Raw load(const void* q, const uint16_t* d, size_t blk, int) {
    return {ldg16(static_cast<const uint8_t*>(q) + blk * 16), h2f(__ldg(d + blk))};
  }
  static SMOLRT_DEV float dot(const Raw& r, const float* x, float xsum) {
    return r.d * nib_dot32(r.q, 0, false, x, k2p23 + 8.f);
  }
  static SMOLRT_DEV float at(const void* q, const uint16_t* d, size_t blk, int j) {
    const uint8_t b = static_cast<const uint8_t*>(q)[blk * 16 + (j & 15)];
    return (float)((int)(j < 16 ? (b & 15) : (b >> 4)) - 8) * h2f(d[blk]);
  }
  struct Raw16 {
    uint2 q;  // qs bytes 8h..8h+7: low nibbles columns 8h+k, high nibbles 16+8h+k
    uint32_t d;
  };
  static SMOLRT_DEV Raw16 load16(const void* q, const uint16_t* d, size_t blk, int, int h) {
    return {ldg8(static_cast<const uint8_t*>(q) + blk * 16 + 8 * h), __ldg(d + blk)};
  }
  // The mma pairs straight from the nibbles, exact in fp16: (0x6400 | n) is 1024 + n, minus 1032
  // gives n - 8 exactly, and one multiply by the fp16 scale rounds once (the value of rounding
  // (n-8)*d). Pair 2s+q: bytes 4(s/2)+q and +2, nibble s&1.
  static SMOLRT_DEV void pairs16(const Raw16& r, uint32_t (&h2)[8]) {
    const __half2 d2 = __half2half2(__ushort_as_half((unsigned short)r.d));
    const __half2 k1032 = __halves2half2(__ushort_as_half(0x6408), __ushort_as_half(0x6408));
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t w = s < 2 ? r.q.x : r.q.y;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t bits = w >> ((s & 1) * 4 + 8 * q);
        const uint32_t hb = (bits & 0x000F000Fu) | 0x64006400u;
        const __half2 v = *reinterpret_cast<const __half2*>(&hb);
        const __half2 p = __hmul2(__hsub2(v, k1032), d2);
        h2[2 * s + q] = *reinterpret_cast<const uint32_t*>(&p);
      }
    }
  }
#endif
};

// Q4_1: payload qs, meta {d, m}.
template <>
struct QFormat<GgmlType::Q4_1> {
  static constexpr DevLayout kLayout{32, 16, 4, true, true};
  static void repack(const uint8_t* src, uint8_t* pay, uint8_t* meta) {
    const auto& b = *reinterpret_cast<const BlockQ4_1*>(src);
    std::memcpy(pay, b.qs, 16);
    std::memcpy(meta, &b.d, 2);
    std::memcpy(meta + 2, &b.m, 2);
  }
#if defined(__CUDACC__)
  struct Raw {
    uint4 q;
    float d, m;
  };
  static SMOLRT_DEV Raw load(const void* q, const uint16_t* d, size_t blk, int) {
    const uint32_t dm = __ldg(reinterpret_cast<const uint32_t*>(d) + blk);
    return {ldg16(static_cast<const uint8_t*>(q) + blk * 16), h2f((uint16_t)dm),
            h2f((uint16_t)(dm >> 16))};
  }
  static SMOLRT_DEV float dot(const Raw& r, const float* x, float xsum) {
    return r.d * nib_dot32(r.q, 0, false, x, k2p23) + r.m * xsum;
  }
  static SMOLRT_DEV float at(const void* q, const uint16_t* d, size_t blk, int j) {
    const uint8_t b = static_cast<const uint8_t*>(q)[blk * 16 + (j & 15)];
    return (float)(j < 16 ? (b & 15) : (b >> 4)) * h2f(d[2 * blk]) + h2f(d[2 * blk + 1]);
  }
  struct Raw16 {
    uint2 q;
    uint32_t dm;
  };
  static SMOLRT_DEV Raw16 load16(const void* q, const uint16_t* d, size_t blk, int, int h) {
    return {ldg8(static_cast<const uint8_t*>(q) + blk * 16 + 8 * h),
            __ldg(reinterpret_cast<const uint32_t*>(d) + blk)};
  }
  static SMOLRT_DEV void pairs16(const Raw16& r, uint32_t (&h2)[8]) {
    const __half2 d = h2_of(h2f((uint16_t)r.dm)), m = h2_of(h2f((uint16_t)(r.dm >> 16)));
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t w = s < 2 ? r.q.x : r.q.y;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t v = (w >> ((s & 1) * 4 + 8 * q)) & 0x000F000Fu;
        h2[2 * s + q] = h2_bits(__hfma2(int2_h2(v, 0.f), d, m));
      }
    }
  }
#endif
};

// Q5_0 / Q5_1: payload qs, meta {qh (2 halves), d, m or 0}: 8 bytes, one aligned load.
template <GgmlType T, class B, bool kMin>
struct QFormatQ5 {
  static constexpr DevLayout kLayout{32, 16, 8, true, kMin};
  static void repack(const uint8_t* src, uint8_t* pay, uint8_t* meta) {
    const auto& b = *reinterpret_cast<const B*>(src);
    std::memcpy(pay, b.qs, 16);
    std::memcpy(meta, b.qh, 4);
    std::memcpy(meta + 4, &b.d, 2);
    uint16_t m = 0;
    if constexpr (kMin) m = b.m;
    std::memcpy(meta + 6, &m, 2);
  }
#if defined(__CUDACC__)
  struct Raw {
    uint4 q;
    uint32_t qh;
    float d, m;
  };
  static SMOLRT_DEV Raw load(const void* q, const uint16_t* d, size_t blk, int) {
    const uint2 mt = __ldg(reinterpret_cast<const uint2*>(d) + blk);
    return {ldg16(static_cast<const uint8_t*>(q) + blk * 16), mt.x, h2f((uint16_t)mt.y),
            h2f((uint16_t)(mt.y >> 16))};
  }
  static SMOLRT_DEV float dot(const Raw& r, const float* x, float xsum) {
    if constexpr (kMin) {
      return r.d * nib_dot32(r.q, r.qh, true, x, k2p23) + r.m * xsum;
    } else {
      return r.d * nib_dot32(r.q, r.qh, true, x, k2p23 + 16.f);
    }
  }
  static SMOLRT_DEV float at(const void* q, const uint16_t* d, size_t blk, int j) {
    const uint8_t b = static_cast<const uint8_t*>(q)[blk * 16 + (j & 15)];
    const uint32_t qh = (uint32_t)d[4 * blk] | ((uint32_t)d[4 * blk + 1] << 16);
    const int v = (j < 16 ? (b & 15) : (b >> 4)) | (int)(((qh >> j) & 1u) << 4);
    if constexpr (kMin) return (float)v * h2f(d[4 * blk + 2]) + h2f(d[4 * blk + 3]);
    return (float)(v - 16) * h2f(d[4 * blk + 2]);
  }
  struct Raw16 {
    uint2 q;
    uint2 meta;  // qh, d | m << 16
    int h;
  };
  static SMOLRT_DEV Raw16 load16(const void* q, const uint16_t* d, size_t blk, int, int h) {
    return {ldg8(static_cast<const uint8_t*>(q) + blk * 16 + 8 * h),
            __ldg(reinterpret_cast<const uint2*>(d) + blk), h};
  }
  static SMOLRT_DEV void pairs16(const Raw16& r, uint32_t (&h2)[8]) {
    const __half2 d = h2_of(h2f((uint16_t)r.meta.y)), m = h2_of(h2f((uint16_t)(r.meta.y >> 16)));
    const uint32_t qh = r.meta.x >> (8 * r.h);  // bit k: column 8h+k; bit 16+k: 16+8h+k
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t w = s < 2 ? r.q.x : r.q.y;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t b5 = qh >> (16 * (s & 1) + 4 * (s >> 1) + q);  // bits of k and k+2
        const uint32_t v = ((w >> ((s & 1) * 4 + 8 * q)) & 0x000F000Fu) | ((b5 << 4) & 0x10u) |
                           ((b5 << 18) & 0x100000u);
        if constexpr (kMin) {
          h2[2 * s + q] = h2_bits(__hfma2(int2_h2(v, 0.f), d, m));
        } else {
          h2[2 * s + q] = h2_bits(__hmul2(int2_h2(v, 16.f), d));
        }
      }
    }
  }
#endif
};
template <>
struct QFormat<GgmlType::Q5_0> : QFormatQ5<GgmlType::Q5_0, BlockQ5_0, false> {};
template <>
struct QFormat<GgmlType::Q5_1> : QFormatQ5<GgmlType::Q5_1, BlockQ5_1, true> {};

// Q8_0: payload qs (32 B), meta d.
template <>
struct QFormat<GgmlType::Q8_0> {
  static constexpr DevLayout kLayout{32, 32, 2, true};
  static void repack(const uint8_t* src, uint8_t* pay, uint8_t* meta) {
    const auto& b = *reinterpret_cast<const BlockQ8_0*>(src);
    std::memcpy(pay, b.qs, 32);
    std::memcpy(meta, &b.d, 2);
  }
#if defined(__CUDACC__)
  struct Raw {
    uint4 q0, q1;
    float d;
  };
  static SMOLRT_DEV Raw load(const void* q, const uint16_t* d, size_t blk, int) {
    const uint8_t* p = static_cast<const uint8_t*>(q) + blk * 32;
    return {ldg16(p), ldg16(p + 16), h2f(__ldg(d + blk))};
  }
  // int8 ^ 0x80 is the int8 + 128 as an unsigned byte.
  static SMOLRT_DEV float dot(const Raw& r, const float* x, float xsum) {
    uint32_t a[4], b[4];
    words(r.q0, a);
    words(r.q1, b);
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] ^= 0x80808080u, b[i] ^= 0x80808080u;
    return r.d * (bytes_dot16(a, x, k2p23 + 128.f) + bytes_dot16(b, x + 16, k2p23 + 128.f));
  }
  static SMOLRT_DEV float at(const void* q, const uint16_t* d, size_t blk, int j) {
    return (float)static_cast<const int8_t*>(q)[blk * 32 + j] * h2f(d[blk]);
  }
  struct Raw16 {
    uint2 lo, hi;  // bytes 8h.. and 16+8h..
    uint32_t d;
  };
  static SMOLRT_DEV Raw16 load16(const void* q, const uint16_t* d, size_t blk, int, int h) {
    const uint8_t* p = static_cast<const uint8_t*>(q) + blk * 32 + 8 * h;
    return {ldg8(p), ldg8(p + 16), __ldg(d + blk)};
  }
  static SMOLRT_DEV void pairs16(const Raw16& r, uint32_t (&h2)[8]) {
    const __half2 d = h2_of(h2f((uint16_t)r.d));
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint2& g = (s & 1) ? r.hi : r.lo;
      const uint32_t w = s < 2 ? g.x : g.y;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t v = ((w >> (8 * q)) & 0x00FF00FFu) ^ 0x00800080u;  // int8 + 128
        h2[2 * s + q] = h2_bits(__hmul2(int2_h2(v, 128.f), d));
      }
    }
  }
#endif
};

// --- 256-weight K-quant super-blocks (unit u: super-block u/8, sub-block j = u%8)
// -------------------

#if defined(__CUDACC__)
// Scale and min of sub-block j from the 16-byte head {d, dmin, scales[12]} (formats.h
// k_scale_min, with the bytes taken out of registers by shifts: no local-memory array).
SMOLRT_DEV void k_scale_min_regs(const uint4& h, int j, float& sc, float& m) {
  const int sh = 8 * (j & 3);
  const uint32_t a = (h.y >> sh) & 0xFFu, b = (h.z >> sh) & 0xFFu, c = (h.w >> sh) & 0xFFu;
  if (j < 4) {
    sc = (float)(a & 63u);
    m = (float)(b & 63u);
  } else {
    sc = (float)((c & 15u) | ((a >> 6) << 4));
    m = (float)((c >> 4) | ((b >> 6) << 4));
  }
}
// The scales and minima of sub-blocks j and j + 1 (j even, so both in the same half of the table):
// one shift per scale word, the 6-bit values made floats exactly by the magic-number trick.
SMOLRT_DEV void k_scale_min_pair(const uint4& h, int j, float (&sc)[2], float (&m)[2]) {
  const int sh = 8 * (j & 3);
  const uint32_t a = h.y >> sh, b = h.z >> sh, c = h.w >> sh;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t ak = a >> (8 * k), bk = b >> (8 * k), ck = c >> (8 * k);
    const uint32_t s = j < 4 ? ak & 63u : (ck & 15u) | ((ak >> 2) & 48u);
    const uint32_t n = j < 4 ? bk & 63u : ((ck >> 4) & 15u) | ((bk >> 2) & 48u);
    sc[k] = i2f_small((int)s);
    m[k] = i2f_small((int)n);
  }
}
#endif

// Q4_K / Q5_K: the GGUF block as payload (144 / 176 bytes, quants 16-byte aligned), no meta.
template <GgmlType T, bool kQh>
struct QFormatQK {
  static constexpr int kBytes = kQh ? 176 : 144;
  static constexpr DevLayout kLayout{256, kBytes, 0, true, true};
  static void repack(const uint8_t* src, uint8_t* pay, uint8_t*) { std::memcpy(pay, src, kBytes); }
#if defined(__CUDACC__)
  struct Raw {
    uint4 h;       // d, dmin, scales
    uint4 q0, q1;  // 32 bytes of qs holding this sub-block's nibbles
    uint4 h0, h1;  // Q5_K: the 32 qh bytes
    int j;
  };
  static SMOLRT_DEV Raw load(const void* q, const uint16_t*, size_t sblk, int j) {
    const uint8_t* p = static_cast<const uint8_t*>(q) + sblk * kBytes;
    const uint8_t* qs = p + (kQh ? 48 : 16) + 32 * (j >> 1);
    Raw r;
    r.h = ldg16(p);
    r.q0 = ldg16(qs);
    r.q1 = ldg16(qs + 16);
    if constexpr (kQh) {
      r.h0 = ldg16(p + 16);
      r.h1 = ldg16(p + 32);
    }
    r.j = j;
    return r;
  }
  // Sub-block j's 32 quants out of a Raw holding its qs bytes (j or j ^ 1 loaded), as bytes:
  // weights 0..15 in a, 16..31 in b. sh = 4 * (j & 1), the nibble: a compile-time constant where
  // the caller knows it (idot_pair).
  static SMOLRT_DEV void quants(const Raw& r, int j, int sh, uint32_t (&a)[4], uint32_t (&b)[4]) {
    uint32_t qa[4], qb[4];
    words(r.q0, qa);
    words(r.q1, qb);
    uint32_t ha[4] = {0, 0, 0, 0}, hb[4] = {0, 0, 0, 0};
    if constexpr (kQh) words(r.h0, ha), words(r.h1, hb);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[i] = (qa[i] >> sh) & 0x0F0F0F0Fu;
      b[i] = (qb[i] >> sh) & 0x0F0F0F0Fu;
      if constexpr (kQh) {
        a[i] |= ((ha[i] >> j) & 0x01010101u) << 4;
        b[i] |= ((hb[i] >> j) & 0x01010101u) << 4;
      }
    }
  }
  // The unit's scale d * sc and minimum dmin * m.
  static SMOLRT_DEV void scale_min(const Raw& r, float& ds, float& dm) {
    float sc, m;
    k_scale_min_regs(r.h, r.j, sc, m);
    ds = h2f((uint16_t)r.h.x) * sc;
    dm = h2f((uint16_t)(r.h.x >> 16)) * m;
  }
  static SMOLRT_DEV float dot(const Raw& r, const float* x, float xsum) {
    uint32_t a[4], b[4];
    quants(r, r.j, 4 * (r.j & 1), a, b);
    float ds, dm;
    scale_min(r, ds, dm);
    const float qx = bytes_dot16(a, x, k2p23) + bytes_dot16(b, x + 16, k2p23);
    return ds * qx - dm * xsum;
  }
  // The int8 path: a lane takes the pair of sub-blocks 2g and 2g + 1 (g = 0..3), the low and high
  // nibbles of the same 32 qs bytes (Q5_K: bits 2g and 2g + 1 of the same qh bytes), so one Raw
  // feeds 64 weights. Against x's two int8 levels (XQ) of the two units: the quants are
  // non-negative bytes, so DP4A takes them as they are; the minimum term uses the units' fp32 sums.
  static constexpr int kPairStep = 1;
  static SMOLRT_DEV int pair_first(int g) {
    return 2 * g;
  }
  static SMOLRT_DEV Raw load_pair(const void* q, const uint16_t* d, size_t sblk, int g) {
    return load(q, d, sblk, pair_first(g));
  }
  static SMOLRT_DEV float idot_pair(const Raw& r, const XQ& x0, const XQ& x1) {
    float sc[2], m[2];
    k_scale_min_pair(r.h, r.j, sc, m);
    float acc = 0.f, macc = 0.f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const XQ& x = k == 0 ? x0 : x1;
      uint32_t a[4], b[4];
      quants(r, r.j + k, 4 * k, a, b);  // r.j is even: sub-block r.j + k's nibble is 4k
      int ih = 0, il = 0;
      idot16(make_uint4(a[0], a[1], a[2], a[3]), x.hi0, x.lo0, ih, il);
      idot16(make_uint4(b[0], b[1], b[2], b[3]), x.hi1, x.lo1, ih, il);
      acc += sc[k] * x.s * two_level(ih, il);
      macc += m[k] * x.sum;
    }
    return h2f((uint16_t)r.h.x) * acc - h2f((uint16_t)(r.h.x >> 16)) * macc;
  }
  static SMOLRT_DEV float at(const void* q, const uint16_t*, size_t sblk, int c) {
    const uint8_t* p = static_cast<const uint8_t*>(q) + sblk * kBytes;
    const int j = c / 32, l = c % 32;
    int sc, m;
    k_scale_min(j, p + 4, sc, m);
    const uint16_t* dd = reinterpret_cast<const uint16_t*>(p);
    int v = (p[(kQh ? 48 : 16) + 32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
    if constexpr (kQh) v += ((p[16 + l] >> j) & 1) << 4;
    return h2f(dd[0]) * (float)sc * (float)v - h2f(dd[1]) * (float)m;
  }
  struct Raw16 {
    uint4 hd;      // d, dmin, scales
    uint2 q0, q1;  // qs bytes 32(j/2) + 8h.. and +16
    uint2 g0, g1;  // Q5_K: qh bytes 8h.. and 16+8h..
    int j;
  };
  static SMOLRT_DEV Raw16 load16(const void* q, const uint16_t*, size_t sblk, int j, int h) {
    const uint8_t* p = static_cast<const uint8_t*>(q) + sblk * kBytes;
    const uint8_t* qs = p + (kQh ? 48 : 16) + 32 * (j >> 1) + 8 * h;
    Raw16 r;
    r.hd = ldg16(p);
    r.q0 = ldg8(qs);
    r.q1 = ldg8(qs + 16);
    if constexpr (kQh) {
      r.g0 = ldg8(p + 16 + 8 * h);
      r.g1 = ldg8(p + 32 + 8 * h);
    }
    r.j = j;
    return r;
  }
  static SMOLRT_DEV void pairs16(const Raw16& r, uint32_t (&h2)[8]) {
    float sc, m;
    k_scale_min_regs(r.hd, r.j, sc, m);
    const __half2 d1 = h2_of(h2f((uint16_t)r.hd.x) * sc);
    const __half2 m1 = h2_of(-h2f((uint16_t)(r.hd.x >> 16)) * m);
    const int sh = 4 * (r.j & 1);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint2& g = (s & 1) ? r.q1 : r.q0;
      const uint32_t w = s < 2 ? g.x : g.y;
      uint32_t gh = 0;
      if constexpr (kQh) {
        const uint2& gg = (s & 1) ? r.g1 : r.g0;
        gh = s < 2 ? gg.x : gg.y;
      }
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        uint32_t v = (w >> (8 * q + sh)) & 0x000F000Fu;
        if constexpr (kQh) v |= ((gh >> (8 * q + r.j)) & 0x00010001u) << 4;
        h2[2 * s + q] = h2_bits(__hfma2(int2_h2(v, 0.f), d1, m1));
      }
    }
  }
#endif
};
template <>
struct QFormat<GgmlType::Q4_K> : QFormatQK<GgmlType::Q4_K, false> {};
template <>
struct QFormat<GgmlType::Q5_K> : QFormatQK<GgmlType::Q5_K, true> {};

// Q6_K: payload {ql 128, qh 64, scales 16} = 208 bytes, meta d. Sub-block j: half h = j/4,
// quarter t = j%4 of it (formats.h): ql bytes 64h + 32(t&1) .. +32, nibble t>>1; qh bytes 32h ..
// +32, bit pair 2t; scales 8h + 2t (weights 0..15) and 8h + 2t + 1 (16..31).
template <>
struct QFormat<GgmlType::Q6_K> {
  static constexpr DevLayout kLayout{256, 208, 2, true};
  static void repack(const uint8_t* src, uint8_t* pay, uint8_t* meta) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(src);
    std::memcpy(pay, b.ql, 128);
    std::memcpy(pay + 128, b.qh, 64);
    std::memcpy(pay + 192, b.scales, 16);
    std::memcpy(meta, &b.d, 2);
  }
#if defined(__CUDACC__)
  struct Raw {
    uint4 l0, l1, h0, h1;
    uint32_t sc;  // the unit's two int8 scales (pairs: and its partner's, bytes 2 and 3)
    float d;
    int j;
  };
  static SMOLRT_DEV Raw load(const void* q, const uint16_t* d, size_t sblk, int j) {
    const uint8_t* p = static_cast<const uint8_t*>(q) + sblk * 208;
    const int h = j >> 2, t = j & 3;
    Raw r;
    r.l0 = ldg16(p + 64 * h + 32 * (t & 1));
    r.l1 = ldg16(p + 64 * h + 32 * (t & 1) + 16);
    r.h0 = ldg16(p + 128 + 32 * h);
    r.h1 = ldg16(p + 128 + 32 * h + 16);
    r.sc = __ldg(reinterpret_cast<const uint16_t*>(p + 192 + 8 * h + 2 * t));
    r.d = h2f(__ldg(d + sblk));
    r.j = j;
    return r;
  }
  // A sub-block's two 16-column scales out of the low 16 bits of sc.
  static SMOLRT_DEV void scales(uint32_t sc, float& s0, float& s1) {
    s0 = (float)(int8_t)(sc & 0xFFu), s1 = (float)(int8_t)((sc >> 8) & 0xFFu);
  }
  // Sub-block j's 32 quants (0..63, not yet less 32) out of a Raw holding its ql bytes (j or j ^ 2
  // loaded) as bytes: weights 0..15 in a, 16..31 in b. ls = 4 * ((j & 3) >> 1), its ql nibble: a
  // compile-time constant where the caller knows it (idot_pair).
  static SMOLRT_DEV void quants(const Raw& r, int j, int ls, uint32_t (&a)[4], uint32_t (&b)[4]) {
    const int hs = 2 * (j & 3);
    uint32_t la[4], lb[4], ha[4], hb[4];
    words(r.l0, la);
    words(r.l1, lb);
    words(r.h0, ha);
    words(r.h1, hb);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[i] = ((la[i] >> ls) & 0x0F0F0F0Fu) | (((ha[i] >> hs) & 0x03030303u) << 4);
      b[i] = ((lb[i] >> ls) & 0x0F0F0F0Fu) | (((hb[i] >> hs) & 0x03030303u) << 4);
    }
  }
  static SMOLRT_DEV float dot(const Raw& r, const float* x, float xsum) {
    uint32_t a[4], b[4];
    quants(r, r.j, 4 * ((r.j & 3) >> 1), a, b);
    // Weights 0..15 are words 0..3 of a; 16..31 words 0..3 of b.
    float s0, s1;
    scales(r.sc, s0, s1);
    return r.d * (s0 * bytes_dot16(a, x, k2p23 + 32.f) + s1 * bytes_dot16(b, x + 16, k2p23 + 32.f));
  }
  // The int8 path: a lane takes the pair of sub-blocks t and t + 2 of a half (g = 2h + t, t < 2),
  // the low and high nibbles of the same 32 ql bytes and bit pairs of the same 32 qh bytes, so one
  // Raw feeds 64 weights. Against x's two int8 levels (XQ) of the two units: the 6-bit quants less
  // 32 as signed bytes, one integer sum per 16-column scale.
  static constexpr int kPairStep = 2;
  static SMOLRT_DEV int pair_first(int g) {
    return 4 * (g >> 1) + (g & 1);
  }
  static SMOLRT_DEV Raw load_pair(const void* q, const uint16_t* d, size_t sblk, int g) {
    const int j = pair_first(g);
    Raw r = load(q, d, sblk, j);
    const uint8_t* p = static_cast<const uint8_t*>(q) + sblk * 208;
    r.sc |= (uint32_t)__ldg(reinterpret_cast<const uint16_t*>(p + 192 + 2 * (j + kPairStep))) << 16;
    return r;
  }
  static SMOLRT_DEV float idot_pair(const Raw& r, const XQ& x0, const XQ& x1) {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const XQ& x = k == 0 ? x0 : x1;
      uint32_t a[4], b[4];
      quants(r, r.j + kPairStep * k, 4 * k, a, b);  // r.j's t < 2: the partner's nibble is 4k
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = bytes_less_32(a[i]), b[i] = bytes_less_32(b[i]);
      int ih0 = 0, il0 = 0, ih1 = 0, il1 = 0;
      idot16(make_uint4(a[0], a[1], a[2], a[3]), x.hi0, x.lo0, ih0, il0);
      idot16(make_uint4(b[0], b[1], b[2], b[3]), x.hi1, x.lo1, ih1, il1);
      float s0, s1;
      scales(r.sc >> (16 * k), s0, s1);
      acc += x.s * (s0 * two_level(ih0, il0) + s1 * two_level(ih1, il1));
    }
    return r.d * acc;
  }
  static SMOLRT_DEV float at(const void* q, const uint16_t* d, size_t sblk, int c) {
    const uint8_t* p = static_cast<const uint8_t*>(q) + sblk * 208;
    const int h = c / 128, l = c % 32, t = (c % 128) / 32;
    const int lo = (p[64 * h + 32 * (t & 1) + l] >> (4 * (t >> 1))) & 15;
    const int hi = (p[128 + 32 * h + l] >> (2 * t)) & 3;
    const int sc = (int8_t)p[192 + 8 * h + 2 * t + l / 16];
    return h2f(d[sblk]) * (float)sc * (float)((lo | (hi << 4)) - 32);
  }
  struct Raw16 {
    uint2 l0, l1, g0, g1;  // ql and qh bytes of columns 8h.. and 16+8h..
    uint32_t sc;           // the two int8 scales (columns < 16, >= 16)
    uint32_t d;
    int t;
  };
  static SMOLRT_DEV Raw16 load16(const void* q, const uint16_t* d, size_t sblk, int j, int h) {
    const uint8_t* p = static_cast<const uint8_t*>(q) + sblk * 208;
    const int hh = j >> 2, t = j & 3;
    const uint8_t* ql = p + 64 * hh + 32 * (t & 1) + 8 * h;
    const uint8_t* qh = p + 128 + 32 * hh + 8 * h;
    return {ldg8(ql),
            ldg8(ql + 16),
            ldg8(qh),
            ldg8(qh + 16),
            __ldg(reinterpret_cast<const uint16_t*>(p + 192 + 8 * hh + 2 * t)),
            __ldg(d + sblk),
            t};
  }
  static SMOLRT_DEV void pairs16(const Raw16& r, uint32_t (&h2)[8]) {
    const float d = h2f((uint16_t)r.d);
    const __half2 s0 = h2_of(d * (float)(int8_t)(r.sc & 0xFFu));
    const __half2 s1 = h2_of(d * (float)(int8_t)(r.sc >> 8));
    const int ls = 4 * (r.t >> 1), hs = 2 * r.t;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint2& l = (s & 1) ? r.l1 : r.l0;
      const uint2& g = (s & 1) ? r.g1 : r.g0;
      const uint32_t lw = s < 2 ? l.x : l.y, gw = s < 2 ? g.x : g.y;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t v =
            ((lw >> (8 * q + ls)) & 0x000F000Fu) | (((gw >> (8 * q + hs)) & 0x00030003u) << 4);
        h2[2 * s + q] = h2_bits(__hmul2(int2_h2(v, 32.f), (s & 1) ? s1 : s0));
      }
    }
  }
#endif
};

// --- the one dispatch table
// -----------------------------------------------------------------------

// Calls f(tag) for the format t, tag.value its GgmlType; false for a type that is no format. The
// formats are quant/format.h's list: each needs its QFormat<T> above (this fails to compile
// without one). F is a generic lambda taking `auto tag`.
template <GgmlType T>
struct FormatTag {
  static constexpr GgmlType value = T;
};

template <class F>
SMOLRT_HD bool dispatch_format(GgmlType t, F&& f) {
  return Formats::find<FormatTag>(t, f);
}

// The device layout of t; layout.qk == 0 for a type with no device description.
SMOLRT_HD DevLayout dev_layout(GgmlType t) {
  DevLayout l{0, 0, 0, false};
  dispatch_format(t, [&](auto tag) { l = QFormat<decltype(tag)::value>::kLayout; });
  return l;
}

}  // namespace smolrt::cuda
