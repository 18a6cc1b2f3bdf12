// The fast CPU path's data layouts, shared by the repacker (pack.cpp) and the SIMD kernels
// (simd_*.cpp). Plain constants and structs only: the SIMD translation units are compiled with
// their level's -m flags, and any inline function they pulled in from elsewhere could be emitted
// there and picked by the linker for baseline code (an illegal instruction on older CPUs).
//
// Weights: rows are grouped in panels of kPanel = 16 (the last one zero-padded). A 32-weight
// sub-block of a panel stores its quants as unsigned bytes q in 0..2^bits-1 (w = scale * q +
// offset-or-min), "quad" k (weights 4k..4k+3 of each of the 16 rows) as 64 bytes: row r's 4
// weights at bytes 4r..4r+3, so one 512-bit register holds a quad of all 16 rows (a 256-bit one
// the quad of 8 rows) and one u8 x s8 dot instruction (vpdpbusd) adds its 4 products to row r's
// 32-bit lane. Bit planes of a sub-block (kQuantBytes[bits] bytes):
//   4 bits: 4 chunks of 64 bytes; chunk c byte (r, i): quad c's weight in the low nibble, quad
//           c + 4's in the high nibble (for Q4_0/Q4_1/Q5_x this is the source block's own nibble
//           order transposed).
//   5 bits: + 64 bytes: byte (r, i) bit c = 5th bit of quad c's weight i, bit c + 4 = quad c + 4's.
//   6 bits: + 64 bytes for quads 0..3 (bits 2c, 2c+1 = high bits of quad c's weight i) and 64 for
//           quads 4..7 (bits 2c, 2c+1 = quad c + 4's).
//   8 bits: 8 quads of 64 bytes, q = int8 weight + 128.
// A panel is [units x quant bytes][units x scale bytes] (padded to 64 bytes); a unit is a 32-block
// (Q4_0..Q8_0) or a 256-weight super-block of 8 sub-blocks (K-quants). Scale bytes per unit, each
// array holding the panel's 16 rows:
//   Q4_0/Q5_0/Q8_0: fp16 d[16]                      w = d * (q - 8 | 16 | 128)
//   Q4_1/Q5_1:      fp16 d[16], fp16 m[16]          w = d * q + m
//   Q4_K/Q5_K:      fp16 d[16], fp16 dmin[16], u8 sc[8][16], u8 m[8][16]
//                                                   w = d * sc[j] * q - dmin * m[j]
//   Q6_K:           fp16 d[16], s8 sc[16][16]       w = d * sc[w / 16] * (q - 32)
//
// Activations: each row of x quantized per 32-block (llama.cpp's q8_0 with an f32 scale):
// q = round(x / d), d = max|x| / 127; kept with d * sum(q) (for formats with a min) and the sums
// of q over each 16 (for the constant offsets: Q6_K's scales change every 16).
#pragma once

#include <cstddef>
#include <cstdint>

namespace smolrt::cpu::fast {

constexpr int kPanel = 16;

enum PackFmt : int { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kPackFmts };

// Per format: bits per quant, 32-blocks per unit, quant bytes per sub-block, scale bytes per unit.
struct PackInfo {
  int bits;
  int subs;
  int sub_bytes;
  int scale_bytes;
};
constexpr PackInfo kPackInfo[kPackFmts] = {
    {4, 1, 256, 32},   // Q4_0
    {4, 1, 256, 64},   // Q4_1
    {5, 1, 320, 32},   // Q5_0
    {5, 1, 320, 64},   // Q5_1
    {8, 1, 512, 32},   // Q8_0
    {4, 8, 256, 320},  // Q4_K: d, dmin 32 + 32, sc 128, m 128
    {5, 8, 320, 320},  // Q5_K
    {6, 8, 384, 288},  // Q6_K: d 32, sc 256
};

// A repacked weight: panels of kPanel rows, `units` units each.
struct PackedView {
  const uint8_t* data = nullptr;
  int64_t panel_bytes = 0;
  int64_t units = 0;
  int64_t rows = 0;
};

// n rows of activations quantized per 32-block: q [n][q_stride] int8, d and s [n][blocks] (s = d *
// sum of the block's q), sum16 [n][2 * blocks] (sums of q over each half block).
struct QActs {
  const int8_t* q = nullptr;
  int64_t q_stride = 0;
  const float* d = nullptr;
  const float* s = nullptr;
  const int32_t* sum16 = nullptr;
  int64_t blocks = 0;
};

// A weight kept in its float type (F32, F16 or BF16), rows as stored, any cols.
enum FloatFmt : int { kF32, kF16, kBF16, kFloatFmts };
struct FloatView {
  const uint8_t* data = nullptr;
  int64_t row_stride = 0;  // bytes
  int64_t rows = 0;
  int64_t cols = 0;
};

// One query head of one row for attention_head: k and v point at the head's KV-head columns of
// the pools (rows `stride` floats apart); positions first..n_pos-1 are read page by page.
struct AttnHead {
  float* out = nullptr;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t stride = 0;
  const int* pages = nullptr;
  int page_size = 0;
  int first = 0;
  int n_pos = 0;
  int head_dim = 0;
  float scale = 0.f;
  float* scores = nullptr;  // n_pos - first floats of scratch
  int64_t* rows = nullptr;  // n_pos - first of scratch: the positions' pool offsets
};

// One SIMD level's kernels (simd_<level>.cpp).
struct SimdTable {
  // One row of x (cols a multiple of 32) -> q [cols], d, s [cols / 32], sum16 [cols / 16].
  void (*quantize)(const float* x, int64_t cols, int8_t* q, float* d, float* s, int32_t* sum16);
  // out[j * ldo + r] for the rows r of panels [p0, p1) (below w.rows) and inputs j < n.
  void (*gemm[kPackFmts])(const PackedView& w, const QActs& a, int n, int64_t p0, int64_t p1,
                          float* out, int64_t ldo);
  // out[j * ldo + r] = dot(row r, x + j * ldx) for rows [r0, r1), j < n.
  void (*gemm_float[kFloatFmts])(const FloatView& w, const float* x, int64_t ldx, int n, int64_t r0,
                                 int64_t r1, float* out, int64_t ldo);
  void (*attention_head)(const AttnHead& h);
  // gate[i] = act(gate[i]) * up[i]
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  void (*gelu_mul)(float* gate, const float* up, int64_t n);
};

extern const SimdTable kSimdScalar;
extern const SimdTable kSimdAvx2;
extern const SimdTable kSimdAvx512;
extern const SimdTable kSimdAvx512Vnni;

}  // namespace smolrt::cpu::fast
