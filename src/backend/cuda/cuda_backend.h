// CudaBackend: batch-1 decode on one NVIDIA GPU. Weights live in one device allocation
// (device_weights.h); activations, the fp32 KV cache and every scratch buffer are carved out of a
// second allocation made once per session; only readback buffers are pinned host memory.
//
// One decode step = embed, 5 kernels per layer (RMSNorm+QKV+RoPE+KV append, split attention,
// Wo+residual, RMSNorm+gate/up+SiLU·up, down+residual), RMSNorm+lm_head with argmax stage 1, and
// argmax stage 2. The step is captured ONCE as a CUDA graph; the token and position are read from
// device memory (an 8-byte H2D copy before each replay, skipped for greedy continuations: the
// previous step's argmax leaves them there, and stores the id in pinned host memory), so nothing
// is re-captured per token; greedy decoding launches the next step before the host has read the
// current id (CudaOptions::speculate), so host latency overlaps GPU work.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/batch.h"

namespace smolrt {

// Switches of the CUDA backend. The defaults are what users run; the tests turn them to check
// each path against the other.
struct CudaOptions {
  // false: plain launches every step, and no graph replay of recurring prompt shapes in the
  // batched prefill (CudaPrefill::run_last): the tests' reference for graph replay.
  bool use_graph = true;
  // false: no Programmatic Dependent Launch (tests check both orders of launch).
  bool pdl = true;
  // Prompts: layer-major batched prefill (cuda_prefill.h) for models it supports; false runs one
  // decode step per token (the tests' reference for the batched path).
  bool batched_prefill = true;
  int prefill_chunk = 512;  // max tokens per prefill chunk (>= 1)
  // false: off. On: forward_token_greedy launches the next step right after the
  // current one, before the host has read the id (the next step reads its token/pos from the
  // device slots this step's argmax fills); a later call with exactly that (token, pos) adopts it,
  // anything else discards it (its writes are rewritten before use). The host's wake-up and launch
  // latency then overlap GPU work. The tests run both.
  bool speculate = true;
  // false: the prefill's residual GEMMs sum each output in one block in a fixed order
  // (bit-reproducible, for the tests that compare bits); on, they split K across blocks and add
  // atomically (faster, the last bits vary from run to run).
  bool split_k = true;
};

// Facts about a CUDA session, for benchmarks and reports.
struct CudaStats {
  double upload_ms = 0;      // weight repack + host-to-device copy
  size_t weight_bytes = 0;   // the weights' device allocation
  size_t scratch_bytes = 0;  // activations + KV cache + scratch allocation
  int kernels_per_step = 0;  // kernel nodes in the captured decode graph (0 before capture)
  // The model runs the batched prefill (cuda_prefill.h); false: prompts go token by token.
  bool batched_prefill = false;
  int prefill_graph_captures = 0;  // prompt shapes captured as CUDA graphs so far
  int prefill_graph_launches = 0;  // launches of captured prompt graphs (capture's own included)
};

class CudaBackendApi : public Backend {
 public:
  // Changing options drops the captured graph (re-captured on the next step).
  virtual void set_options(const CudaOptions& o) = 0;
  virtual const CudaOptions& options() const = 0;
  virtual CudaStats stats() const = 0;
  // Benchmark aid: GPU time (µs per decode step, CUDA events) of graphs holding only one kind of
  // kernel for all layers ("norm+qkv+rope+kv", "attention", ...) plus "all", at the current
  // position. Clobbers activations; the KV cache entry at position()-1 is rewritten.
  virtual std::vector<std::pair<std::string, double>> profile_parts(int reps) = 0;
};

// Throws Error when no GPU is present, when the GPU runs out of memory, or when a tensor's type
// has no CUDA kernel (naming the tensor and type).
std::unique_ptr<CudaBackendApi> make_cuda_backend_ex(const Model& m, const BackendOptions& opt,
                                                     const CudaOptions& copt);

// The multi-sequence engine with explicit switches (make_cuda_batch_backend takes the defaults);
// it honours use_graph, pdl, speculate and split_k.
std::unique_ptr<BatchBackend> make_cuda_batch_backend_ex(const Model& m, const BatchOptions& opt,
                                                         const CudaOptions& copt);

}  // namespace smolrt
