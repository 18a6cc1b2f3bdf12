// A weight format described once (host side): Format<T> names its GGML type id, its name as
// llama.cpp prints it, its block layout (Block, kBlockSize elements per block), its reference
// dequantizer and its quantizer. for_each_format visits the formats smolrt computes and converts,
// in one fixed order; with_format turns a runtime type id into a Format<T>. The type table
// (formats.cpp), the quantizer and converter (quantize.cpp), the CPU oracle's ops, the CLI's
// format lists, error messages and the tests' type lists are all driven by them, so a new format
// is its block struct and decoder in formats.h, its Format<T> here, its quantizer in
// quantize.cpp, and the device side (cuda/qformat.h, the fast CPU path's packing) where it is
// to run there.
//
// Element formats (F32, F16, BF16) are blocks of one element.
#pragma once

#include <cstdint>
#include <string>

#include "quant/formats.h"

namespace smolrt {

template <GgmlType T>
struct Format;

// Members every Format<T> has, given its Block and block size.
template <GgmlType T, typename B, int kSize>
struct FormatBase {
  static constexpr GgmlType kType = T;
  using Block = B;
  static constexpr int kBlockSize = kSize;
  static constexpr int kBlockBytes = static_cast<int>(sizeof(B));
};

// Each Format<T> below also has kName (as llama.cpp prints it), kFileType (GGUF's
// general.file_type, llama_ftype, of a file whose matrices are all this format; the K-quants': the
// "_S" mixture's, as llama.cpp writes for them), and
//   static void dequantize(const Block& b, float* out);  // kBlockSize floats, the reference
//   static void quantize(const float* x, Block& y, int64_t base);  // in quantize.cpp
// quantize encodes kBlockSize floats (`base`: the element index of the first, for messages) and
// throws smolrt::Error on a non-finite value or an overflow (quantize.h's policy).

template <>
struct Format<GgmlType::F32> : FormatBase<GgmlType::F32, float, 1> {
  static constexpr const char* kName = "f32";
  static constexpr uint32_t kFileType = 0;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const float& b, float* out) { *out = b; }
};
template <>
struct Format<GgmlType::F16> : FormatBase<GgmlType::F16, uint16_t, 1> {
  static constexpr const char* kName = "f16";
  static constexpr uint32_t kFileType = 1;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const uint16_t& b, float* out) { *out = fp16_to_f32(b); }
};
template <>
struct Format<GgmlType::BF16> : FormatBase<GgmlType::BF16, uint16_t, 1> {
  static constexpr const char* kName = "bf16";
  static constexpr uint32_t kFileType = 32;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const uint16_t& b, float* out) { *out = bf16_to_f32(b); }
};
template <>
struct Format<GgmlType::Q4_0> : FormatBase<GgmlType::Q4_0, BlockQ4_0, kQK> {
  static constexpr const char* kName = "q4_0";
  static constexpr uint32_t kFileType = 2;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const Block& b, float* out) { dequant_block_q4_0(b, out); }
};
template <>
struct Format<GgmlType::Q4_1> : FormatBase<GgmlType::Q4_1, BlockQ4_1, kQK> {
  static constexpr const char* kName = "q4_1";
  static constexpr uint32_t kFileType = 3;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const Block& b, float* out) { dequant_block_q4_1(b, out); }
};
template <>
struct Format<GgmlType::Q5_0> : FormatBase<GgmlType::Q5_0, BlockQ5_0, kQK> {
  static constexpr const char* kName = "q5_0";
  static constexpr uint32_t kFileType = 8;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const Block& b, float* out) { dequant_block_q5_0(b, out); }
};
template <>
struct Format<GgmlType::Q5_1> : FormatBase<GgmlType::Q5_1, BlockQ5_1, kQK> {
  static constexpr const char* kName = "q5_1";
  static constexpr uint32_t kFileType = 9;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const Block& b, float* out) { dequant_block_q5_1(b, out); }
};
template <>
struct Format<GgmlType::Q8_0> : FormatBase<GgmlType::Q8_0, BlockQ8_0, kQK> {
  static constexpr const char* kName = "q8_0";
  static constexpr uint32_t kFileType = 7;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const Block& b, float* out) { dequant_block_q8_0(b, out); }
};
template <>
struct Format<GgmlType::Q4_K> : FormatBase<GgmlType::Q4_K, BlockQ4_K, kQKK> {
  static constexpr const char* kName = "q4_k";
  static constexpr uint32_t kFileType = 14;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const Block& b, float* out) { dequant_block_q4_k(b, out); }
};
template <>
struct Format<GgmlType::Q5_K> : FormatBase<GgmlType::Q5_K, BlockQ5_K, kQKK> {
  static constexpr const char* kName = "q5_k";
  static constexpr uint32_t kFileType = 16;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const Block& b, float* out) { dequant_block_q5_k(b, out); }
};
template <>
struct Format<GgmlType::Q6_K> : FormatBase<GgmlType::Q6_K, BlockQ6_K, kQKK> {
  static constexpr const char* kName = "q6_k";
  static constexpr uint32_t kFileType = 18;
  static void quantize(const float* x, Block& y, int64_t base);
  static void dequantize(const Block& b, float* out) { dequant_block_q6_k(b, out); }
};

// The formats smolrt computes and converts, in the order lists and messages show them.
template <GgmlType... Ts>
struct FormatList {
  static constexpr int kCount = sizeof...(Ts);
  template <typename F>
  static constexpr void each(F&& f) {
    (f(Format<Ts>{}), ...);
  }
  // f(Tag<T>{}) for the T of the list equal to t; false (f not called) when none is. constexpr,
  // so that the CUDA kernels' dispatch (cuda/qformat.h) runs the same fold on the device.
  template <template <GgmlType> class Tag, typename F>
  static constexpr bool find(GgmlType t, F&& f) {
    return ((t == Ts ? (f(Tag<Ts>{}), true) : false) || ...);
  }
};
using Formats = FormatList<GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0,
                           GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K>;

// f(Format<T>{}) for every format of Formats, in order.
template <typename F>
constexpr void for_each_format(F&& f) {
  Formats::each(f);
}

// f(Format<T>{}) for the format whose id is t; false (f not called) when t is none of them.
template <typename F>
bool with_format(GgmlType t, F&& f) {
  return Formats::find<Format>(t, f);
}

// True for the types of Formats.
inline bool is_format(GgmlType t) {
  return with_format(t, [](auto) {});
}

// "f32, f16, bf16, q4_0, ...": the names of Formats, for help texts and error messages (`upper`:
// "F32, F16, ...", as tensor types are shown).
std::string format_names(bool upper = false);

}  // namespace smolrt
