// Batched (layer-major) prefill for CudaBackend: the glue between the decode session and the
// prefill kernels of src/cuda/prefill_forward.h.
//
// Weights: the decode session's own device image (one allocation, split layout), read by the
// prefill GEMMs too: nothing is copied. The embedding (cuda::embed), the final norm +
// lm_head (the decode gemv, one launch per logits row) and the norm vectors are the decode
// kernels' and buffers as well.
//
// KV cache: the decode session's fp32 cache, [n_layers][2][n_ctx][kv_dim] (k then v per layer);
// prefill writes positions [pos0, pos0 + n) that decode then reads.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/device_weights.h"
#include "backend/cuda/prefill_forward.h"
#include "cuda/device_buffer.h"
#include "model/model.h"

namespace smolrt::cuda {

// Where the last token's logits go: the decode session's own buffer, so the GPU sampler works
// as after a decode step. (No argmax: every caller reads the logits or samples from them.)
struct PrefillLastOut {
  float* logits = nullptr;  // device [vocab]
  // Pinned host [vocab], or nullptr: the lm_head kernel then stores its rows straight into this
  // buffer (mapped into the device's address space) instead of out.logits, so no device-to-host
  // copy trails the prompt; out.logits is not written.
  float* host_logits = nullptr;
};

class CudaPrefill {
 public:
  // nullptr when the batched prefill cannot run this model (types or shapes the prefill kernels
  // do not support, e.g. stories260K or F32 weights): the caller keeps the token-by-token path.
  // dw: the decode weights (embedding, norms, lm_head are used from there; must outlive this).
  // k, v: each layer's fp32 decode KV cache; rings: per layer 0 (n_ctx rows) or the rows of a
  // sliding-window layer's ring cache (prefill_forward.h PrefillLayerWeights::ring).
  // dense: fp16 weight copies for the chunk GEMMs (device_weights.h), or nullptr; must outlive
  // this.
  static std::unique_ptr<CudaPrefill> create(const Model& m, const DeviceWeights& dw,
                                             const std::vector<void*>& k,
                                             const std::vector<void*>& v,
                                             const std::vector<int>& rings, int n_ctx,
                                             const DenseWeights* dense);

  // Tokens at positions [pos0, pos0 + n) in chunks of at most `chunk_size`; the caller has
  // validated the ids and pos0 + n <= n_ctx. Logits of the last token only, into
  // `out` (and out.host_logits when set); the stream is not synchronized.
  // graph: a one-chunk prompt whose (length, pos0) was seen before is captured once as a CUDA
  // graph (kept for the kGraphs most recent shapes) and replayed: benchmarks, fixed-length scoring
  // and regenerations skip ~160 launches. A first-seen shape runs eagerly (capturing would cost
  // more than it saves for a one-off prompt).
  void run_last(std::span<const int> tokens, int pos0, int chunk_size, const PrefillLastOut& out,
                const Launch& s, bool graph = true);
  // Same, returning the logits of every token, row-major [n][vocab] (synchronizes the stream).
  // The chunk is capped at kAllLogitsChunk so the logits workspace stays kAllLogitsChunk rows.
  std::vector<float> run_all(std::span<const int> tokens, int pos0, int chunk_size,
                             const Launch& s);

  static constexpr int kAllLogitsChunk = 128;
  static constexpr int kGraphs = 4;

  // With dense copies: chunks of `rows` rows or more take the dense GEMMs; rows 0 measures it
  // (cuda::measure_dense_rows, chunks of up to `chunk` rows). Call once before the first prompt.
  void set_dense_rows(int rows, int chunk, const Launch& s);

  // Destroys the captured prompt graphs (they bake in the options of the launches they recorded:
  // the caller calls this when those change).
  void drop_graphs();
  // Prompt graphs captured and launched (capture's own launch included) so far.
  int graph_captures() const { return captures_; }
  int graph_launches() const { return launches_; }

  ~CudaPrefill();
  CudaPrefill(const CudaPrefill&) = delete;
  CudaPrefill& operator=(const CudaPrefill&) = delete;

 private:
  CudaPrefill() = default;
  // The workspace for chunks of `tokens` rows (with the dense buffers when pw_.dense()).
  void reserve(int tokens, int logit_rows);
  bool dense_ = false;  // dense copies given to create()
  // Copies tokens into pinned staging memory (grown on demand) for async H2D chunk copies.
  const int* stage_tokens(std::span<const int> tokens, const Launch& s);
  // H2D ids of tokens [i0, i0 + m), embedding into ws_.x, the layers.
  void chunk(const int* host_ids, int i0, int m, int pos0, const Launch& s);
  // logits row = lm_head(output_norm(ws_.x row i)) with the decode gemv.
  void head_row(int i, float* logits, const Launch& s);
  // Same into out.logits, and the copy to out.host_logits.
  void head_last(int i, const PrefillLastOut& out, const Launch& s);

  const DeviceWeights* dw_ = nullptr;
  PrefillWeights pw_;
  PrefillWorkspace ws_;    // chunk activations, grown on demand, reused
  PinnedBuffer tok_host_;  // staging for token ids

  // Captured one-chunk prefills. A graph bakes in the workspace and staging buffers: any
  // reallocation of either drops them all (graphs_key_: workspace generation, staging address).
  struct Graph {
    int n = 0, pos0 = 0;
    float* host_logits = nullptr;  // baked into the graph's copy node
    cudaGraphExec_t exec = nullptr;
    long last_use = 0;
  };
  std::vector<Graph> graphs_;
  std::vector<std::pair<int, int>> seen_;  // recent eager (n, pos0) shapes
  std::pair<unsigned long, const void*> graphs_key_{0, nullptr};
  long uses_ = 0;
  int captures_ = 0, launches_ = 0;
  // The launches of a one-chunk prompt (H2D ids, embedding, layers, lm_head, the copy to
  // out.host_logits).
  void one_chunk(const int* host_ids, int n, int pos0, const PrefillLastOut& out, const Launch& s);
};

}  // namespace smolrt::cuda
