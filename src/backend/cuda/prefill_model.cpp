// PrefillModel and prefill_view (see header).
#include "backend/cuda/prefill_model.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/attention_paged.h"
#include "cuda/attention_prefill.h"
#include "cuda/gemm.h"

namespace smolrt::cuda {

StepWeights prefill_view(const ModelConfig& c, const DeviceWeights& dw, int n_ctx, bool kv_half,
                         const std::vector<void*>& k_caches, const std::vector<void*>& v_caches) {
  if (dw.layers.size() != (size_t)c.n_layers || k_caches.size() != dw.layers.size() ||
      v_caches.size() != dw.layers.size())
    fail("prefill: ", dw.layers.size(), " device layers and ", k_caches.size(),
         " caches for a model of ", c.n_layers, " layers");
  StepWeights pw;
  pw.cfg = c;
  pw.n_ctx = n_ctx;
  pw.kv_half = kv_half;
  pw.token_embd = dw.token_embd;
  pw.output_norm = dw.output_norm;
  pw.output = dw.output;
  pw.rope_factors = dw.rope_factors;
  for (size_t l = 0; l < dw.layers.size(); ++l) {
    const DevLayer& L = dw.layers[l];
    StepLayerWeights P;
    static_cast<DevLayer&>(P) = L;
    P.k_cache = k_caches[l];
    P.v_cache = v_caches[l];
    pw.layers.push_back(P);
  }
  return pw;
}

namespace {

// A matrix the prefill GEMM takes (gemm.h: any format but F32) of this shape.
bool shape_is(const TensorView& t, int64_t rows, int64_t cols) {
  return t.data != nullptr && gemm_takes(t.type) && t.rows == rows && t.cols == cols;
}

}  // namespace

bool prefill_fits(const ModelConfig& c, const Weights& w) {
  if (!(attention_prefill_supports(c.head_dim) ||
        attention_paged_supports(c.head_dim, c.n_heads / std::max(c.n_kv_heads, 1))) ||
      c.dim % 32 != 0 || c.q_dim() % 32 != 0 || c.hidden_dim % 32 != 0 || c.kv_dim() % 16 != 0 ||
      c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim || (int)w.layers.size() != c.n_layers)
    return false;
  for (const LayerWeights& L : w.layers) {
    if (!shape_is(L.wq, c.q_dim(), c.dim) || !shape_is(L.wk, c.kv_dim(), c.dim) ||
        !shape_is(L.wv, c.kv_dim(), c.dim) || !shape_is(L.wo, c.dim, c.q_dim()) ||
        !shape_is(L.w_gate, c.hidden_dim, c.dim) || !shape_is(L.w_up, c.hidden_dim, c.dim) ||
        !shape_is(L.w_down, c.dim, c.hidden_dim) || L.w_gate.type != L.w_up.type)
      return false;
  }
  return true;
}

PrefillModel::PrefillModel(const ModelConfig& c, const Weights& w, int n_ctx, bool kv_half,
                           bool dense) {
  if (!prefill_fits(c, w))
    fail("prefill: model shape/types not supported by the batched prefill kernels (layer type ",
         w.layers.empty() ? "none" : type_name(w.layers[0].wq.type), ", head_dim ", c.head_dim,
         "); it needs layers the GEMM takes (not f32) and head_dim 8..256, powers of two");
  dw_ = upload_weights(w, c);
  const size_t per = (size_t)n_ctx * c.kv_dim() * (kv_half ? 2 : 4);
  kv_ = DeviceBuffer(per * 2 * c.n_layers, "prefill KV cache");
  std::vector<void*> k, v;
  char* base = static_cast<char*>(kv_.get());
  for (int l = 0; l < c.n_layers; ++l) {
    k.push_back(base + (2 * l) * per);
    v.push_back(base + (2 * l + 1) * per);
  }
  pw_ = prefill_view(c, dw_, n_ctx, kv_half, k, v);
  if (dense) {
    dense_ = make_dense(dw_, c);
    for (int l = 0; l < c.n_layers; ++l) pw_.layers[l].dense = dense_.layers[l];
    pw_.dense_output = dense_.output;
    pw_.dense_rows = 1;  // every chunk on the dense path (tests and benchmarks compare them)
  }
}

}  // namespace smolrt::cuda
