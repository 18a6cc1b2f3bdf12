// PrefillModel and prefill_view (see header).
#include "cuda/prefill_model.h"

#include "core/error.h"

namespace smolrt::cuda {

PrefillWeights prefill_view(const LlamaConfig& c, const DeviceWeights& dw, int n_ctx, bool kv_half,
                            const std::vector<void*>& k_caches,
                            const std::vector<void*>& v_caches) {
  if (dw.layers.size() != (size_t)c.n_layers || k_caches.size() != dw.layers.size() ||
      v_caches.size() != dw.layers.size())
    fail("prefill: ", dw.layers.size(), " device layers and ", k_caches.size(),
         " caches for a model of ", c.n_layers, " layers");
  PrefillWeights pw;
  pw.cfg = c;
  pw.n_ctx = n_ctx;
  pw.kv_half = kv_half;
  pw.token_embd = dw.token_embd;
  pw.output_norm = dw.output_norm;
  pw.output = dw.output;
  for (size_t l = 0; l < dw.layers.size(); ++l) {
    const DevLayer& L = dw.layers[l];
    PrefillLayerWeights P;
    P.wq = L.wq, P.wk = L.wk, P.wv = L.wv, P.wo = L.wo;
    P.w_gate = L.w_gate, P.w_up = L.w_up, P.w_down = L.w_down;
    P.attn_norm = L.attn_norm;
    P.ffn_norm = L.ffn_norm;
    P.k_cache = k_caches[l];
    P.v_cache = v_caches[l];
    pw.layers.push_back(P);
  }
  return pw;
}

PrefillModel::PrefillModel(const LlamaConfig& c, const Weights& w, int n_ctx, bool kv_half) {
  for (const LayerWeights& L : w.layers)
    if (!prefill_supported(c, L.wq.type) || L.wk.type != L.wq.type || L.wv.type != L.wq.type ||
        L.wo.type != L.wq.type || L.w_gate.type != L.wq.type || L.w_up.type != L.wq.type ||
        L.w_down.type != L.wq.type)
      fail("prefill: model shape/types not supported by the batched prefill kernels (layer type ",
           type_name(L.wq.type), ", head_dim ", c.head_dim, ")");
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
}

}  // namespace smolrt::cuda
