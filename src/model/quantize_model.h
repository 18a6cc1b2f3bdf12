// Whole-model requantization (`smolrt quantize`): reads a GGUF, re-encodes its tensors for a
// target and prepares a Writer with the metadata copied and general.file_type set.
//
// A target (--type) is one element type or one of llama.cpp's K-quant mixtures:
//   f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k     one type for every matrix
//   q4_k_s q4_k_m q5_k_s q5_k_m                               llama.cpp's mixtures (base Q4_K/Q5_K)
//
// Per-tensor rule (plan_model):
//   - 1-D tensors (norms, biases; any tensor with ne[1] == 1) are stored F32.
//   - matrices (ne[1] > 1) get the target's base type, except:
//       * q4_0, q4_1: token_embd.weight and output.weight become Q8_0 (the layout of common
//         SmolLM Q4_0/Q4_1 files; the embedding is also the tied lm_head);
//       * q5_0 ... q6_k and the mixtures, as llama.cpp's llama_tensor_get_type
//       (src/llama-quant.cpp,
//         2026-10, for the llama architecture without an importance matrix):
//           output.weight, and token_embd.weight when there is no output.weight (tied): Q6_K if
//           its rows are whole 256-blocks, else Q8_0;
//           q4_k_m / q5_k_m: attn_v (and attn_qkv) number i of n, and ffn_down number i of n,
//           become Q6_K when use_more_bits(i, n): i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2,
//           numbered as llama.cpp's loader orders weights (by layer number, then name: i is the
//           layer for llama files, whatever their tensor order);
//           q4_k_s: the first 4 attn_v and the ffn_down of layers i < n/8 become Q5_K;
//           (q5_k_s, and the single types: nothing more).
//   - row-length fall-back (llama.cpp's tensor_type_fallback): a row length ne[0] that is not a
//     multiple of the chosen type's block size demotes Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0;
//     when even that (or a 32-block type) does not fit, F16. Every fall-back is reported.
//   - a tensor already in its planned type is copied byte for byte (never requantized).
// Source types: every type quant/quantize.h converts (f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q4_k
// q5_k q6_k), dequantized and requantized; anything else is an Error naming the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/formats.h"

namespace smolrt {

enum class QuantMix { None, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M };

struct QuantTarget {
  GgmlType type = GgmlType::Q4_0;  // the base type of the layer matrices
  QuantMix mix = QuantMix::None;

  QuantTarget() = default;
  QuantTarget(GgmlType t, QuantMix m = QuantMix::None) : type(t), mix(m) {}  // NOLINT: implicit
};

// "q4_0" ... "q6_k", "q4_k_m", ... (case-insensitive) -> target; Error otherwise, naming `flag`
// (e.g. "--type") and the accepted values.
QuantTarget parse_quant_target(const std::string& s, const std::string& flag = "--type");
// The name parse_quant_target accepts for t ("q4_k_m").
std::string target_name(const QuantTarget& t);

// llama.cpp's general.file_type (llama_ftype) for a target: F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 7,
// Q5_0 8, Q5_1 9, Q4_K_S 14, Q4_K_M 15, Q5_K_S 16, Q5_K_M 17, Q6_K 18, BF16 32. The single types
// q4_k / q5_k map to the _S mixtures' ids ("mostly Q4_K").
uint32_t llama_file_type(const QuantTarget& t);

// One tensor as the planner sees it.
struct TensorShape {
  std::string name;
  uint64_t ne[4] = {1, 1, 1, 1};
  uint32_t n_dims = 1;
};

struct TensorPlan {
  GgmlType type;
  std::string note;  // non-empty when the tensor fell back because of its row length
};

// The stored type of every tensor (rule above), in the order given.
std::vector<TensorPlan> plan_model(const std::vector<TensorShape>& tensors, const QuantTarget& t);

// The requantized model. `writer` holds pointers into `buffers`: keep this object alive (it may
// be moved: the buffers' heap storage does not move) until writer.write()/to_bytes() returns.
struct QuantizedModel {
  gguf::Writer writer;
  std::vector<std::vector<uint8_t>> buffers;  // one per tensor, in file order
  // Tensors stored in a fall-back type (their row length is not a multiple of the target's block).
  struct Fallback {
    std::string name;
    GgmlType type;
  };
  std::vector<Fallback> fallbacks;
  std::vector<std::pair<GgmlType, int>> type_counts;  // tensors per stored type, by type id
  uint64_t n_tensors = 0;
  uint64_t n_params = 0;
  uint64_t tensor_bytes = 0;  // sum of tensor data sizes (without alignment padding)
};

// Progress/notice sink: one line per call, no trailing newline (the CLI prints to stderr).
using LogFn = std::function<void(const std::string&)>;

// Re-encodes every tensor of `in` for `target`. Throws Error naming the tensor (and row) for an
// unsupported source type or a non-finite value (see quant/quantize.h for the policy).
QuantizedModel quantize_model(const gguf::File& in, const QuantTarget& target,
                              const LogFn& log = {});

}  // namespace smolrt
