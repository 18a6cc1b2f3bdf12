// Device copy of a model in the layout prefill_forward() reads (stacked QKV rows, interleaved
// gate/up rows, raw GGUF blocks otherwise) plus a KV cache. Used by the prefill tests and
// bench/bench_prefill; a backend that already holds its own device weights can instead fill a
// PrefillWeights with pointers to them (same block format) and its own KV cache.
#pragma once

#include <vector>

#include "cuda/prefill_forward.h"
#include "model/model.h"

namespace smolrt::cuda {

class PrefillModel {
 public:
  // Copies w (host TensorViews: Q4_0 layer matrices, F32 norms, Q8_0/Q4_0/F32/F16 token_embd,
  // Q8_0/Q4_0 output) to the device and allocates a KV cache of n_ctx positions per layer.
  // Throws smolrt::Error naming the tensor whose type or shape prefill cannot use.
  PrefillModel(const LlamaConfig& c, const Weights& w, int n_ctx, bool kv_half);
  ~PrefillModel();
  PrefillModel(const PrefillModel&) = delete;
  PrefillModel& operator=(const PrefillModel&) = delete;

  const PrefillWeights& weights() const { return pw_; }

 private:
  void* upload(const void* src, size_t bytes);
  std::vector<void*> allocs_;
  PrefillWeights pw_;
};

}  // namespace smolrt::cuda
