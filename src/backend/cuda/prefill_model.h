// A model on the device for step_forward() without the engine: the weight image
// (backend/cuda/device_weights.h, one allocation, split layout) plus a contiguous KV cache. Used
// by the prefill tests, bench/bench_prefill and `smolrt bench-gemm`; the engine fills a
// StepWeights from its own weights and paged pool instead.
#pragma once

#include <vector>

#include "backend/cuda/device_weights.h"
#include "backend/cuda/step_forward.h"
#include "cuda/device_buffer.h"
#include "model/model.h"

namespace smolrt::cuda {

// The StepWeights view of decode weights dw for KV caches k_cache(l) / v_cache(l).
StepWeights prefill_view(const ModelConfig& c, const DeviceWeights& dw, int n_ctx, bool kv_half,
                         const std::vector<void*>& k_caches, const std::vector<void*>& v_caches);

// True when step_forward takes this model: layer matrices the GEMM takes (gemm.h, any
// format but F32; gate and up of one type) of the config's shapes, a
// head_dim the prefill attention supports, dims multiples of 32, q/kv dims multiples of 16 (the
// embedding and lm_head run on the decode kernels, so any type the decode path takes is fine).
// Otherwise the caller prefills token by token.
bool prefill_fits(const ModelConfig& c, const Weights& w);

class PrefillModel {
 public:
  // Uploads w (upload_weights: Error naming a tensor without a CUDA kernel) and allocates a KV
  // cache of n_ctx positions per layer (fp16 or fp32); dense: also the fp16 copies the dense
  // GEMMs read (device_weights.h make_dense), taken by every chunk (weights().dense_rows 1). Throws
  // smolrt::Error when prefill cannot run the model's shapes.
  PrefillModel(const ModelConfig& c, const Weights& w, int n_ctx, bool kv_half, bool dense = false);

  const StepWeights& weights() const { return pw_; }

 private:
  DeviceWeights dw_;
  DenseWeights dense_;
  DeviceBuffer kv_;
  StepWeights pw_;
};

}  // namespace smolrt::cuda
