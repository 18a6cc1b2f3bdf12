// PrefillModel: host -> device upload with the two row-wise concatenations (see header).
#include "cuda/prefill_model.h"

#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"

namespace smolrt::cuda {
namespace {

void expect(const TensorView& t, GgmlType type, int64_t rows, int64_t cols) {
  if (t.type != type || t.rows != rows || t.cols != cols || !t.data)
    fail("prefill: tensor ", t.name, " is ", type_name(t.type), " [", t.rows, " x ", t.cols,
         "], expected ", type_name(type), " [", rows, " x ", cols, "]");
}

}  // namespace

void* PrefillModel::upload(const void* src, size_t bytes) {
  void* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, bytes));
  allocs_.push_back(d);
  if (src) CUDA_CHECK(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
  return d;
}

PrefillModel::~PrefillModel() {
  for (void* p : allocs_) cudaFree(p);
}

PrefillModel::PrefillModel(const LlamaConfig& c, const Weights& w, int n_ctx, bool kv_half) {
  if (!prefill_supported(c, GgmlType::Q4_0, w.output.type))
    fail("prefill: model shape/types not supported by the batched prefill kernels (head_dim ",
         c.head_dim, ", output ", type_name(w.output.type), ")");
  const GgmlType q4 = GgmlType::Q4_0;
  pw_.cfg = c;
  pw_.n_ctx = n_ctx;
  pw_.kv_half = kv_half;
  pw_.embd_type = w.token_embd.type;
  pw_.token_embd = upload(w.token_embd.data, w.token_embd.nbytes);
  expect(w.output_norm, GgmlType::F32, 1, c.dim);
  pw_.output_norm = static_cast<const float*>(upload(w.output_norm.data, w.output_norm.nbytes));
  pw_.output_type = w.output.type;
  pw_.output =
      w.output.data == w.token_embd.data ? pw_.token_embd : upload(w.output.data, w.output.nbytes);
  const size_t kv_bytes = (size_t)n_ctx * c.kv_dim() * (kv_half ? 2 : 4);
  for (const LayerWeights& L : w.layers) {
    expect(L.wq, q4, c.q_dim(), c.dim);
    expect(L.wk, q4, c.kv_dim(), c.dim);
    expect(L.wv, q4, c.kv_dim(), c.dim);
    expect(L.wo, q4, c.dim, c.q_dim());
    expect(L.w_gate, q4, c.hidden_dim, c.dim);
    expect(L.w_up, q4, c.hidden_dim, c.dim);
    expect(L.w_down, q4, c.dim, c.hidden_dim);
    expect(L.attn_norm, GgmlType::F32, 1, c.dim);
    expect(L.ffn_norm, GgmlType::F32, 1, c.dim);
    PrefillLayerWeights P;
    std::vector<char> qkv(L.wq.nbytes + L.wk.nbytes + L.wv.nbytes);
    std::memcpy(qkv.data(), L.wq.data, L.wq.nbytes);
    std::memcpy(qkv.data() + L.wq.nbytes, L.wk.data, L.wk.nbytes);
    std::memcpy(qkv.data() + L.wq.nbytes + L.wk.nbytes, L.wv.data, L.wv.nbytes);
    P.w_qkv = upload(qkv.data(), qkv.size());
    const size_t rb = L.w_gate.row_stride();
    std::vector<char> gu(2 * L.w_gate.nbytes);
    for (int64_t r = 0; r < c.hidden_dim; ++r) {
      std::memcpy(gu.data() + (2 * r) * rb, static_cast<const char*>(L.w_gate.data) + r * rb, rb);
      std::memcpy(gu.data() + (2 * r + 1) * rb, static_cast<const char*>(L.w_up.data) + r * rb, rb);
    }
    P.w_gate_up = upload(gu.data(), gu.size());
    P.w_o = upload(L.wo.data, L.wo.nbytes);
    P.w_down = upload(L.w_down.data, L.w_down.nbytes);
    P.attn_norm = static_cast<const float*>(upload(L.attn_norm.data, L.attn_norm.nbytes));
    P.ffn_norm = static_cast<const float*>(upload(L.ffn_norm.data, L.ffn_norm.nbytes));
    P.k_cache = upload(nullptr, kv_bytes);
    P.v_cache = upload(nullptr, kv_bytes);
    pw_.layers.push_back(P);
  }
}

}  // namespace smolrt::cuda
