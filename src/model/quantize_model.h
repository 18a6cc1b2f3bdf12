// Whole-model requantization (`smolrt quantize`): reads a GGUF, re-encodes its tensors for a
// target type and prepares a Writer with the metadata copied and general.file_type set.
//
// Per-tensor rule (plan_tensor_type):
//   - 1-D tensors (norms, biases; any tensor with ne[1] == 1) are stored F32.
//   - matrices (ne[1] > 1) get the target type, except:
//       * 4-bit targets (q4_0, q4_1): token_embd.weight and output.weight become Q8_0, the
//         layout of common SmolLM Q4_0/Q4_1 files (the embedding is also the tied lm_head);
//       * a row length ne[0] that is not a multiple of 32 cannot hold Q4_0/Q4_1/Q8_0 blocks:
//         the tensor falls back to F16 and the fallback is reported.
//   - a tensor already in its planned type is copied byte for byte (never requantized).
// Source types: f32, f16, bf16, q4_0, q4_1, q8_0; anything else is an Error naming the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/formats.h"

namespace smolrt {

// "q4_0" | "q4_1" | "q8_0" | "f16" | "bf16" | "f32" (case-insensitive) -> type; Error otherwise,
// naming `flag` (e.g. "--type") and the accepted values.
GgmlType parse_target_type(const std::string& s, const std::string& flag = "--type");

// llama.cpp's general.file_type (llama_ftype) for a target: F32 0, F16 1, Q4_0 2, Q4_1 3,
// Q8_0 7, BF16 32.
uint32_t llama_file_type(GgmlType target);

// The stored type of one tensor for `target` (rule above). When the tensor falls back because of
// its row length, *note (if given) receives a one-line explanation; otherwise it is cleared.
GgmlType plan_tensor_type(const std::string& name, const uint64_t ne[4], uint32_t n_dims,
                          GgmlType target, std::string* note = nullptr);

// The requantized model. `writer` holds pointers into `buffers`: keep this object alive (it may
// be moved: the buffers' heap storage does not move) until writer.write()/to_bytes() returns.
struct QuantizedModel {
  gguf::Writer writer;
  std::vector<std::vector<uint8_t>> buffers;  // one per tensor, in file order
  std::vector<std::string> fallbacks;         // names of tensors stored F16 instead of the target
  uint64_t n_tensors = 0;
  uint64_t n_params = 0;
  uint64_t tensor_bytes = 0;  // sum of tensor data sizes (without alignment padding)
};

// Progress/notice sink: one line per call, no trailing newline (the CLI prints to stderr).
using LogFn = std::function<void(const std::string&)>;

// Re-encodes every tensor of `in` for `target`. Throws Error naming the tensor (and row) for an
// unsupported source type or a non-finite value (see quant/quantize.h for the policy).
QuantizedModel quantize_model(const gguf::File& in, GgmlType target, const LogFn& log = {});

}  // namespace smolrt
