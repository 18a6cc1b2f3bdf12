// CudaBackend: batch-1 decode on one NVIDIA GPU. Weights live in one device allocation
// (device_weights.h); activations, the fp32 KV cache and every scratch buffer are carved out of a
// second allocation made once per session; only readback buffers are pinned host memory.
//
// One decode step = embed, 5 kernels per layer (RMSNorm+QKV+RoPE+KV append, split attention,
// Wo+residual, RMSNorm+gate/up+SiLU·up, down+residual), RMSNorm+lm_head, 2-stage argmax (4 per
// layer with CudaOptions::fused_wo). The step is captured ONCE as a CUDA graph; the token and
// position are read from device memory (an 8-byte H2D copy before each replay, skipped for greedy
// continuations: the previous step's argmax leaves them there, see CudaOptions::device_token), so
// nothing is re-captured per token; greedy decoding launches the next step before the host has
// read the current id (CudaOptions::speculate), so host latency overlaps GPU work.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace smolrt {

// Run-time switches of the CUDA backend (defaults from the environment, see cuda_options_from_env).
struct CudaOptions {
  // SMOLRT_CUDA_GRAPH=0: plain launches every step, and no graph replay of recurring prompt
  // shapes in the batched prefill (CudaPrefill::run_last).
  bool use_graph = true;
  bool fused_norm = true;  // SMOLRT_CUDA_FUSED_NORM=0: separate RMSNorm kernels before matvecs
  bool pdl = true;         // SMOLRT_CUDA_PDL=0: no Programmatic Dependent Launch
  // Prompts: layer-major batched prefill (cuda_prefill.h) for models it supports; false
  // (SMOLRT_CUDA_PREFILL=0) runs one decode step per token.
  bool batched_prefill = true;
  int prefill_chunk = 512;  // SMOLRT_PREFILL_CHUNK: max tokens per prefill chunk (>= 1)
  // SMOLRT_CUDA_L2_PREFETCH=1: bulk L2 prefetch of the next layer's weights; measured neutral on
  // H200 (2366 vs 2380 tok/s), so off by default.
  bool l2_prefetch = false;
  // SMOLRT_CUDA_DEVICE_TOKEN=0: off. On: the step's last kernel (argmax stage 2) writes the
  // greedy id into the device token slot and advances the device position slot, and stores the id
  // in pinned host memory; forward_token_greedy(t, p) then skips the H2D parameter copy (and the
  // D2H copy) when t/p are what the previous greedy step returned/left (the copy otherwise).
  bool device_token = true;
  // SMOLRT_CUDA_FUSED_ARGMAX=0: off. On: the lm_head matvec emits per-block argmax partials
  // (argmax stage 1 fused in), one small kernel reduces them.
  bool fused_argmax = true;
  // SMOLRT_CUDA_HEAD_BLOCKS: grid cap of the lm_head matvec (0 = the matvec default, 528), at most
  // 1056; 1056 measured 2411 vs 2394 tok/s on H200 (more bytes in flight), ~2 us/token.
  int head_blocks = 1056;
  // SMOLRT_CUDA_ARGMAX_IN_HEAD=1: on (with fused_argmax), the lm_head kernel's last block also
  // does argmax stage 2 (ticket counter), one kernel fewer per step. Off by default: measured
  // slower on H200 (419.1 vs 418.0 us/token; the fence + atomic of 1056 blocks costs more than
  // the launch it saves under PDL).
  bool argmax_in_head = false;
  // SMOLRT_CUDA_FUSED_WO=1: on (with fused_norm): the attention kernel also multiplies each
  // head's output by its Wo column slice and writes per-head partials; gate_up and down fold
  // x + partials in head order (deterministic), so the Wo matvec launch (30 per step) is gone.
  // Off by default: measured slower on H200 (2294 vs 2456 tok/s): the Wo math runs on only
  // n_heads SMs, and every gate_up block re-reads all partials (384 blocks x 20 KB of L2 reads).
  bool fused_wo = false;
  // SMOLRT_CUDA_WIDE_HEAD=0: off. On: lm_head-sized Q8_0 matrices use the wide matvec kernel
  // (cuda/gemv_head.h: every lane loads, next row group in flight); off: the generic one.
  // Measured 2456 vs 2441 tok/s on H200.
  bool wide_head = true;
  // SMOLRT_CUDA_HEAD_I8=0: off. On: the wide lm_head kernel multiplies its int8 weights by x
  // quantized per 32-column block to two int8 levels (DP4A; each x element within max|x|/64516 of
  // its block, see cuda/gemv_head.h) instead of dequantizing to fp32 (llama.cpp's matvec uses
  // one int8 level). Measured on H200: decode 2457 vs 2440 tok/s; synth logits vs CPU 2.4e-5
  // relative (fp32: 9e-7).
  bool head_int8 = true;
  // SMOLRT_CUDA_HOST_LOGITS=0: off. On: forward_prompt's lm_head stores the logits straight into
  // the pinned host buffer (mapped into the device's address space), so no 196 KB copy trails the
  // kernel. Measured on H200, `smolrt bench` pp32 medians of three runs each: 50,248 / 50,920 /
  // 50,961 vs 50,071 / 50,540 / 50,324 tok/s.
  bool host_direct_logits = true;
  // SMOLRT_CUDA_SPECULATE=0: off. On (with device_token): forward_token_greedy launches the next
  // step right after the current one, before the host has read the id (the next step reads its
  // token/pos from the device slots this step's argmax fills); a later call with exactly that
  // (token, pos) adopts it, anything else discards it (its writes are rewritten before use). The
  // host's wake-up and launch latency then overlap GPU work. Measured 2456 vs 2419 tok/s on H200.
  bool speculate = true;
  // SMOLRT_CUDA_HEAD_PREFETCH=K: the last K layers' gate_up and down kernels bulk-prefetch the
  // lm_head (2K slices) into L2 while the chain runs, so the lm_head reads L2 instead of HBM.
  // 0 = off. (Overrides l2_prefetch in those kernels.) Measured neutral on H200 (K = 2, 4, 8:
  // 2447-2455 vs 2456 tok/s): the lm_head is not HBM-bound.
  int head_prefetch_layers = 0;
  // SMOLRT_CUDA_FUSED_EMBED=1: on (with fused_norm): layer 0's QKV kernel reads the token's
  // embedding row itself and writes it to the residual stream (cuda/gemv.h, QkvArgs::embed): one
  // launch fewer. Off by default: measured +0.8% on H200 only together with an early PDL trigger
  // that was itself 7% slower (since removed); not yet timed with these defaults.
  bool fused_embed = false;
};
CudaOptions cuda_options_from_env();

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

}  // namespace smolrt
