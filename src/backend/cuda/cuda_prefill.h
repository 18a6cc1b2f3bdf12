// Batched (layer-major) prefill for CudaBackend: the glue between the decode session and the
// prefill kernels of src/cuda/prefill_forward.h.
//
// Weights: the prefill GEMMs read raw GGUF Q4_0 blocks with QKV stacked and gate/up interleaved,
// while the decode kernels read the 16-byte-aligned "split" layout (cuda/dev_mat.h). Until the
// GEMMs read the split layout, CudaPrefill holds a SECOND device copy of the quantized matrices
// in the prefill layout, in one allocation, made only for models prefill_supported() accepts.
// Memory cost: the Q4_0 layer matrices plus the raw token_embd (and the raw lm_head when untied);
// for SmolLM2-135M Q4_0 about 61 MB + 30 MB. The F32 norm vectors are shared with the decode
// weights (same layout), and so is the KV cache.
//
// KV cache: the decode session's fp32 cache, [n_layers][2][n_ctx][kv_dim] (k then v per layer);
// prefill writes positions [pos0, pos0 + n) that decode then reads.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_weights.h"
#include "cuda/prefill_forward.h"
#include "model/model.h"

namespace smolrt::cuda {

class CudaPrefill {
 public:
  // nullptr when the batched prefill cannot run this model (types or shapes the prefill kernels
  // do not support, e.g. stories260K or F32 weights): the caller keeps the token-by-token path.
  // dw: the decode weights (their F32 norms are reused). kv: the decode KV cache as above.
  static std::unique_ptr<CudaPrefill> create(const Model& m, const DeviceWeights& dw, float* kv,
                                             int n_ctx);

  // Tokens at positions [pos0, pos0 + n) in chunks of at most `chunk`; the caller has validated
  // the ids and pos0 + n <= n_ctx. The last token's logits go to logits_out (device [vocab]) and
  // their argmax to argmax_out (device [1]); nothing is read back and the stream is not synced.
  void run_last(std::span<const int> tokens, int pos0, int chunk, float* logits_out,
                int* argmax_out, cudaStream_t s);
  // Same, returning the logits of every token, row-major [n][vocab] (synchronizes the stream).
  // The chunk is capped at kAllLogitsChunk so the logits workspace stays kAllLogitsChunk rows.
  std::vector<float> run_all(std::span<const int> tokens, int pos0, int chunk, cudaStream_t s);

  size_t weight_bytes() const { return buf_.size(); }  // the second weight copy
  const PrefillWeights& weights() const { return pw_; }

  static constexpr int kAllLogitsChunk = 128;

 private:
  CudaPrefill() = default;
  // Copies tokens into pinned staging memory (grown on demand) for async H2D chunk copies.
  const int* stage_tokens(std::span<const int> tokens, cudaStream_t s);

  DeviceBuffer buf_;  // the prefill-layout weights, one allocation
  PrefillWeights pw_;
  PrefillWorkspace ws_;    // chunk activations, grown on demand, reused
  PinnedBuffer tok_host_;  // staging for token ids
};

}  // namespace smolrt::cuda
