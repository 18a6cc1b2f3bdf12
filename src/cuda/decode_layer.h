// The per-layer pieces of a one-token decode step that depend on the architecture (model/model.h),
// shared by the single-sequence backend and the multi-sequence backend's one-row steps, so both
// follow every switch the same way.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/device_weights.h"
#include "model/model.h"

namespace smolrt::cuda {

// Whether the QKV matvec's epilogue can do the whole of qkv_finish (plain llama: no biases, no QK
// norm, normal RoPE without frequency factors, no sliding window). Otherwise step_qkv runs
// qkv_finish after it.
bool qkv_fused(const ModelConfig& c);

// Layer l's Q, K, V of the token at *pos: Q (finished, roped) into q; K and V into the layer's
// caches at row *slot (slot == nullptr: *pos). x: the residual stream, norm_w: attn_norm for
// the matvec's fused RMSNorm (or nullptr when x is already normalized). k_raw, v_raw: [kv_dim]
// scratch for the unfused path.
// ring > 0: the layer's caches are a ring of that many rows (position p at row p % ring).
// kv_half: the caches hold fp16 (else fp32).
void step_qkv(const ModelConfig& c, const DeviceWeights& dw, int l, const float* x,
              const float* norm_w, const int* pos, const int* slot, float* q, float* k_raw,
              float* v_raw, void* k_cache, void* v_cache, cudaStream_t s, int ring = 0,
              bool kv_half = false);

// x += W·in, or with a post norm (gemma3) x += rmsnorm(W·in, post_norm); tmp: [W.rows] scratch.
void step_residual(const ModelConfig& c, const DevMat& w, const float* in, const float* post_norm,
                   float* x, float* tmp, cudaStream_t s);

}  // namespace smolrt::cuda
