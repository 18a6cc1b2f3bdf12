// CPU quantization and dequantization of rows, bit-exact with ggml's reference quantizers
// (quantize_row_*_ref in ggml-quants.c; the rules are restated below, the code is our own).
//
// Supported element types (is_convertible()): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks
// of kQK = 32) and the K-quants Q4_K, Q5_K, Q6_K (super-blocks of kQKK = 256). n must be a whole
// number of blocks of the type; violations throw smolrt::Error.
//
// Reference rules per block of 32 values x[0..31] (facts.md):
//   Q4_0: max = the value of largest magnitude, sign kept (first one wins a tie);
//         d = max / -8; id = d ? 1/d : 0; stored d = fp16(d);
//         nibble = min(15, (int8)(x*id + 8.5)); byte j = nib[j] | nib[j+16] << 4.
//   Q4_1: min, max of the block; d = (max - min) / 15; id = d ? 1/d : 0; m = min;
//         nibble = min(15, (int8)((x - min)*id + 0.5)); stored fp16(d), fp16(m).
//   Q5_0: as Q4_0 with d = max / -16 and q = min(31, (int8)(x*id + 16.5)); low nibbles as Q4_0,
//         bit 4 of q_j -> bit j of the little-endian uint32 qh.
//   Q5_1: as Q4_1 with d = (max - min) / 31 and q = (int)((x - min)*id + 0.5); qh as Q5_0.
//   Q8_0: d = max|x| / 127; id = d ? 1/d : 0; q = roundf(x*id); stored fp16(d).
// id is computed from the f32 d (not the fp16-rounded one), exactly as the reference does.
//
// K-quants, per super-block of 256 (details beside the code in quantize.cpp). All rounding to
// integers is nearest_int (round half to even, ggml's 1.5*2^23 trick); all sums are f32 in
// element order, with no fused multiply-add (quantize.cpp is compiled with -ffp-contract=off),
// which is the C reference's arithmetic.
//   Q4_K / Q5_K: per sub-block of 32, a weighted least-squares fit x ~ scale*l - min with
//         l in [0, 15] / [0, 31] (make_qkx2_quants, weights sqrt(mean x^2) + |x|); the 8 scales
//         and mins become 6-bit multiples of d = max scale / 63 and dmin = max min / 63; the levels
//         are then recomputed from the stored (fp16 d, 6-bit) values.
//   Q6_K: per group of 16, a symmetric fit with l in [-32, 31] (make_qx_quants, weights x^2); the
//         16 scales become int8 multiples of d = -max_scale / 128; levels recomputed likewise.
// gguf-py (ggml's Python package) can quantize every 32-block type above but no K-quant; the
// K-quant rules are checked by tests/test_quantize.cpp (hand-worked blocks, error bounds).
//
// Non-finite policy (one rule for every target type): quantize_row and convert_row never write a
// NaN or inf. They throw smolrt::Error naming the element index and the value when
//   - an input value is NaN or +-inf, or
//   - a finite value overflows the target: |x| >= 65520 for F16, a value that rounds to inf in
//     BF16, a block scale d (or Q4_1/Q5_1 minimum m, or K-quant dmin) that does not fit fp16
//     (|d| >= 65520), or for the K-quants any |x| > 1e9 (beyond what fp16 super-block scales can
//     represent: at most 65504 * 127 * 32 < 2.7e8).
// Callers that know the tensor and row (quantize_model) catch the Error and rethrow it with that
// context. A 32-block whose scale is so small that 1/d overflows f32 (|d| < ~2.9e-39) is quantized
// as an all-zero block: its fp16 d is 0, so it dequantizes to exactly 0 either way.
// dequantize_row never throws for bad values: it decodes bytes as they are (NaN scales give NaN).
#pragma once

#include <cstdint>

#include "quant/formats.h"

namespace smolrt {

// True for the types quantize_row / dequantize_row / convert_row handle.
bool is_convertible(GgmlType t);

// Throws Error unless n elements of type t form whole blocks (and t is convertible).
void check_row_length(GgmlType t, int64_t n);

// --- per-format reference quantizers (n a multiple of the block size; throw on non-finite input)
// --
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n);
void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n);
void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n);
// K-quants: n a multiple of 256.
void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n);
void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n);
void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n);

// Quantizes n floats into dst (row_bytes(type, n) bytes) in the format of `type`.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);
// Decodes n elements of `type` from src into n floats.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Re-encodes n elements: a plain copy when the types are equal, else src -> f32 -> dst through a
// fixed-size stack buffer (no allocation). Same non-finite policy as quantize_row.
void convert_row(GgmlType src_type, const void* src, GgmlType dst_type, void* dst, int64_t n);

}  // namespace smolrt
