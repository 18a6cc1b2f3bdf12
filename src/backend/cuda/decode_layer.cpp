// See decode_layer.h.
#include "backend/cuda/decode_layer.h"

#include <utility>

#include "core/error.h"

#include "cuda/gemv.h"
#include "cuda/qkv_finish.h"
#include "cuda/rmsnorm.h"

namespace smolrt::cuda {

bool qkv_fused(const ModelConfig& c) {
  // Sliding-window models take qkv_finish, as they were tested and measured; the engine's rings
  // are pool slots, which the fused epilogue could write too (not measured).
  return !c.attn_bias && !c.qk_norm && !c.rope_neox && c.rope_freq_factors.empty() &&
         c.sliding_window == 0;
}

void step_qkv(const ModelConfig& c, const DeviceWeights& dw, int l, const float* x,
              const float* norm_w, const int* pos, const int* slot, float* q, float* k_raw,
              float* v_raw, void* k_cache, void* v_cache, const Launch& s, bool kv_half,
              const ResidualIn& res) {
  const DevLayer& L = dw.layers[l];
  const bool fused = qkv_fused(c);
  QkvArgs qa;
  qa.wq = L.wq, qa.wk = L.wk, qa.wv = L.wv, qa.x = x, qa.norm_w = norm_w, qa.eps = c.norm_eps;
  qa.head_dim = c.head_dim, qa.rope_dim = c.rope_dim, qa.rope_base = c.layer_rope_base(l);
  qa.pos = pos, qa.rope = fused, qa.slot = slot, qa.q_out = q;
  qa.k_out = fused ? k_cache : k_raw;
  qa.v_out = fused ? v_cache : v_raw;
  qa.kv_half = kv_half;  // read by the fused epilogue only
  qa.res = res;
  gemv_qkv(qa, s);
  if (fused) return;
  QkvFinishArgs f;
  f.q = q, f.ldq = c.q_dim(), f.k = k_raw, f.v = v_raw, f.ldkv = c.kv_dim();
  f.k_cache = k_cache, f.v_cache = v_cache, f.pos_dev = pos, f.row_slot = slot;
  f.kv_half = kv_half;
  f.bq = L.bq, f.bk = L.bk, f.bv = L.bv, f.q_norm = L.q_norm, f.k_norm = L.k_norm;
  f.eps = c.norm_eps, f.n_heads = c.n_heads, f.n_kv_heads = c.n_kv_heads;
  f.head_dim = c.head_dim, f.rope_dim = c.rope_dim, f.rope_base = c.layer_rope_base(l);
  f.neox = c.rope_neox, f.freq_factors = dw.rope_factors;
  qkv_finish(f, s);
}

void DecodeResidual::add(const DevMat& w, const float* in, const float* post_norm,
                         const Launch& s) {
  flush(s);  // an update no matvec took (a profiling graph that leaves kernels out)
  if (!post_norm) {
    gemv(w, in, nullptr, c_.norm_eps, x_, /*accumulate=*/true, s);
    return;
  }
  gemv(w, in, nullptr, c_.norm_eps, tmp_, /*accumulate=*/false, s);
  pending_norm_ = post_norm;
  if (!fuse_) flush(s);
}

ResidualIn DecodeResidual::take(const float** x_in) {
  *x_in = x_;
  if (!pending_norm_) return {};
  const ResidualIn r{tmp_, pending_norm_, alt_};
  pending_norm_ = nullptr;
  std::swap(x_, alt_);
  return r;
}

void DecodeResidual::flush(const Launch& s) {
  if (!pending_norm_) return;
  rmsnorm_add(x_, c_.dim, tmp_, c_.dim, pending_norm_, c_.dim, 1, c_.norm_eps, s);
  pending_norm_ = nullptr;
}

}  // namespace smolrt::cuda
