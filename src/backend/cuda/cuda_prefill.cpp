// CudaPrefill: the PrefillWeights view of the decode weights and the chunk loop over
// prefill_forward.
#include "backend/cuda/cuda_prefill.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cuda/prefill_model.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/embed.h"
#include "cuda/gemv.h"

namespace smolrt::cuda {

std::unique_ptr<CudaPrefill> CudaPrefill::create(const Model& m, const DeviceWeights& dw,
                                                 const std::vector<void*>& k,
                                                 const std::vector<void*>& v,
                                                 const std::vector<int>& rings, int n_ctx,
                                                 const DenseWeights* dense) {
  if (!prefill_fits(m.config, m.weights) || dw.layers.size() != m.weights.layers.size())
    return nullptr;
  const ModelConfig& c = m.config;
  std::unique_ptr<CudaPrefill> p(new CudaPrefill());
  p->dw_ = &dw;
  p->pw_ = prefill_view(c, dw, n_ctx, /*kv_half=*/false, k, v);  // the decode cache is fp32
  if (rings.size() != p->pw_.layers.size()) fail("CudaPrefill: one ring size per layer");
  for (size_t l = 0; l < rings.size(); ++l) p->pw_.layers[l].ring = rings[l];
  p->pw_.token_embd = DevMat{};  // embedded by chunk() (ids staged from pinned memory)
  if (dense) {
    for (size_t l = 0; l < p->pw_.layers.size(); ++l) p->pw_.layers[l].dense = dense->layers[l];
    p->pw_.dense_output = dense->output;
    p->dense_ = true;
  }
  return p;
}

const int* CudaPrefill::stage_tokens(std::span<const int> tokens, const Launch& s) {
  // The previous call's async copies may still read the staging buffer.
  CUDA_CHECK(cudaStreamSynchronize(s.stream));
  const size_t need = tokens.size() * sizeof(int);
  if (tok_host_.size() < need) tok_host_ = PinnedBuffer(std::max(need, size_t{4096}), "prompt ids");
  int* h = static_cast<int*>(tok_host_.get());
  std::copy(tokens.begin(), tokens.end(), h);
  return h;
}

void CudaPrefill::chunk(const int* host_ids, int i0, int m, int pos0, const Launch& s) {
  const int dim = pw_.cfg.dim;
  CUDA_CHECK(cudaMemcpyAsync(ws_.tokens, host_ids + i0, sizeof(int) * m, cudaMemcpyHostToDevice,
                             s.stream));
  embed(dw_->token_embd, ws_.tokens, m, ws_.x, dim, s, pw_.cfg.embed_scale);
  prefill_forward(pw_, ws_, m, pos0 + i0, /*logit_rows=*/0, s);
}

void CudaPrefill::head_row(int i, float* logits, const Launch& s) {
  gemv(dw_->output, ws_.x + (size_t)i * pw_.cfg.dim, dw_->output_norm, pw_.cfg.norm_eps, logits,
       /*accumulate=*/false, s);
}

void CudaPrefill::set_dense_rows(int rows, int chunk, const Launch& s) {
  if (!dense_) return;
  if (rows > 0) {
    pw_.dense_rows = rows;
    return;
  }
  pw_.dense_rows = 1;  // reserve() adds the dense buffers
  reserve(chunk, 1);
  pw_.dense_rows = measure_dense_rows(pw_, ws_, chunk, s);
}

void CudaPrefill::reserve(int tokens, int logit_rows) {
  if (pw_.dense())
    ws_.reserve_dense(pw_.cfg, tokens, logit_rows);
  else
    ws_.reserve(pw_.cfg, tokens, logit_rows);
}

CudaPrefill::~CudaPrefill() {
  drop_graphs();
}

void CudaPrefill::drop_graphs() {
  for (Graph& g : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

void CudaPrefill::one_chunk(const int* host_ids, int n, int pos0, const PrefillLastOut& out,
                            const Launch& s) {
  chunk(host_ids, 0, n, pos0, s);
  head_last(n - 1, out, s);
}

void CudaPrefill::head_last(int i, const PrefillLastOut& out, const Launch& s) {
  head_row(i, out.host_logits != nullptr ? out.host_logits : out.logits, s);
}

void CudaPrefill::run_last(std::span<const int> tokens, int pos0, int chunk_size,
                           const PrefillLastOut& out, const Launch& s, bool graph) {
  const int n = (int)tokens.size();
  if (n <= 0 || chunk_size <= 0) fail("batched prefill: empty prompt or chunk size ", chunk_size);
  const int cs = std::min(chunk_size, n);
  reserve(cs, 1);
  const int* h = stage_tokens(tokens, s);
  if (graph && n <= cs) {
    const std::pair<unsigned long, const void*> key{ws_.generation(), h};
    if (key != graphs_key_) {  // a graph would read or write freed buffers
      drop_graphs();
      seen_.clear();
      graphs_key_ = key;
    }
    ++uses_;
    for (Graph& g : graphs_)
      if (g.n == n && g.pos0 == pos0 && g.host_logits == out.host_logits) {
        g.last_use = uses_;
        ++launches_;
        CUDA_CHECK(cudaGraphLaunch(g.exec, s.stream));
        return;
      }
    const std::pair<int, int> shape{n, pos0};
    if (std::find(seen_.begin(), seen_.end(), shape) != seen_.end()) {
      cudaGraph_t cg = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
      try {
        one_chunk(h, n, pos0, out, s);
      } catch (...) {
        cudaStreamEndCapture(s.stream, &cg);
        if (cg) cudaGraphDestroy(cg);
        throw;
      }
      CUDA_CHECK(cudaStreamEndCapture(s.stream, &cg));
      Graph g;
      g.n = n, g.pos0 = pos0, g.host_logits = out.host_logits, g.last_use = uses_;
      const cudaError_t e = cudaGraphInstantiate(&g.exec, cg, 0);
      cudaGraphDestroy(cg);
      CUDA_CHECK(e);
      if ((int)graphs_.size() == kGraphs) {  // evict the least recently used
        auto lru = std::min_element(
            graphs_.begin(), graphs_.end(),
            [](const Graph& x, const Graph& y) { return x.last_use < y.last_use; });
        cudaGraphExecDestroy(lru->exec);
        graphs_.erase(lru);
      }
      graphs_.push_back(g);
      ++captures_, ++launches_;
      CUDA_CHECK(cudaGraphLaunch(g.exec, s.stream));
      return;
    }
    seen_.push_back(shape);
    if ((int)seen_.size() > 2 * kGraphs) seen_.erase(seen_.begin());
    one_chunk(h, n, pos0, out, s);
    return;
  }
  int m = 0;
  for (int i0 = 0; i0 < n; i0 += cs) {
    m = std::min(cs, n - i0);
    chunk(h, i0, m, pos0, s);
  }
  // Last token: the decode step's own lm_head, into the decode buffers.
  head_last(m - 1, out, s);
}

std::vector<float> CudaPrefill::run_all(std::span<const int> tokens, int pos0, int chunk_size,
                                        const Launch& s) {
  const int n = (int)tokens.size();
  if (n <= 0 || chunk_size <= 0) fail("batched prefill: empty prompt or chunk size ", chunk_size);
  const int cs = std::min({chunk_size, n, kAllLogitsChunk});
  reserve(cs, cs);
  const int* h = stage_tokens(tokens, s);
  const size_t V = pw_.cfg.vocab_size;
  std::vector<float> all((size_t)n * V);
  for (int i0 = 0; i0 < n; i0 += cs) {
    const int m = std::min(cs, n - i0);
    chunk(h, i0, m, pos0, s);
    // One decode gemv per row (the lm_head is read m times): the all-logits path serves tests
    // and scoring, not generation, and stays bit-compatible with the decode lm_head.
    for (int i = 0; i < m; ++i) head_row(i, ws_.logits + (size_t)i * V, s);
    // Stream order keeps the next chunk's lm_head from overwriting ws_.logits before this copy.
    CUDA_CHECK(cudaMemcpyAsync(all.data() + (size_t)i0 * V, ws_.logits, sizeof(float) * m * V,
                               cudaMemcpyDeviceToHost, s.stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(s.stream));
  return all;
}

}  // namespace smolrt::cuda
