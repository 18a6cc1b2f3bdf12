// The per-layer pieces of a one-token decode step (the CUDA engine's one-row steps) that depend on
// the architecture (model/model.h).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/device_weights.h"
#include "cuda/gemv.h"
#include "cuda/launch.h"
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
// kv_half: the caches hold fp16 (else fp32).
// res: a pending residual update of x made in the matvec's staging (DecodeResidual::take).
void step_qkv(const ModelConfig& c, const DeviceWeights& dw, int l, const float* x,
              const float* norm_w, const int* pos, const int* slot, float* q, float* k_raw,
              float* v_raw, void* k_cache, void* v_cache, const Launch& s, bool kv_half = false,
              const ResidualIn& res = {});

// The residual stream of a one-token decode step. add(): x += W·in, in the matvec's epilogue; with
// a post norm (gemma3), x += rmsnorm(W·in)·post_norm, where W·in goes to tmp and the update is left
// pending for the next matvec, whose input staging makes it (gemv.h ResidualIn) and writes the sum
// to the other of two buffers: take() hands it over and from then on x() is that buffer. flush()
// makes a pending update with rmsnorm_add where no matvec of ours follows (the output head).
// That saves a launch per post norm (gemma3-270m: 35 of 147 per step). fuse false (debug
// readbacks, which want x after every layer): every update is made at once, rmsnorm_add.
class DecodeResidual {
 public:
  DecodeResidual(const ModelConfig& c, float* x, float* alt, float* tmp, bool fuse)
      : c_(c), x_(x), alt_(alt), tmp_(tmp), fuse_(fuse) {}
  float* x() const { return x_; }
  void add(const DevMat& w, const float* in, const float* post_norm, const Launch& s);
  // For the next matvec on x(): the pending update (all null: none), after which x() is where
  // that matvec writes the updated stream. Call it once per such matvec, right before it.
  ResidualIn take(const float** x_in);
  void flush(const Launch& s);

 private:
  const ModelConfig& c_;
  float* x_;
  float* alt_;
  float* tmp_;
  bool fuse_;
  const float* pending_norm_ = nullptr;
};

}  // namespace smolrt::cuda
