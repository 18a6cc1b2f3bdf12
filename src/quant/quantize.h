// CPU quantization and dequantization of rows, bit-exact with ggml's reference quantizers.
//
// Supported element types: F32, F16, BF16, Q4_0, Q4_1, Q8_0 (is_convertible()). For the block
// types n must be a multiple of kQK (32); violations throw smolrt::Error.
//
// Reference rules (facts.md), per block of 32 values x[0..31]:
//   Q4_0: max = the value of largest magnitude, sign kept (first one wins a tie);
//         d = max / -8; id = d ? 1/d : 0; stored d = fp16(d);
//         nibble = min(15, (int8)(x*id + 8.5)); byte j = nib[j] | nib[j+16] << 4.
//   Q4_1: min, max of the block; d = (max - min) / 15; id = d ? 1/d : 0; m = min;
//         nibble = min(15, (int8)((x - min)*id + 0.5)); stored fp16(d), fp16(m).
//   Q8_0: d = max|x| / 127; id = d ? 1/d : 0; q = roundf(x*id); stored fp16(d).
// id is computed from the f32 d (not the fp16-rounded one), exactly as the reference does.
//
// Non-finite policy (one rule for every target type): quantize_row and convert_row never write a
// NaN or inf. They throw smolrt::Error naming the element index and the value when
//   - an input value is NaN or +-inf, or
//   - a finite value overflows the target: |x| >= 65520 for F16, a value that rounds to inf in
//     BF16, or a block scale d (or Q4_1 minimum m) that does not fit fp16 (|d| >= 65520).
// Callers that know the tensor and row (quantize_model) catch the Error and rethrow it with that
// context. A block whose scale is so small that 1/d overflows f32 (|d| < ~2.9e-39) is quantized
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

// --- per-format reference quantizers (n a multiple of 32; throw on non-finite input) -------------
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n);
void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);

// Quantizes n floats into dst (row_bytes(type, n) bytes) in the format of `type`.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);
// Decodes n elements of `type` from src into n floats.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Re-encodes n elements: a plain copy when the types are equal, else src -> f32 -> dst through a
// fixed-size stack buffer (no allocation). Same non-finite policy as quantize_row.
void convert_row(GgmlType src_type, const void* src, GgmlType dst_type, void* dst, int64_t n);

}  // namespace smolrt
