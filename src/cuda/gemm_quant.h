// Multi-token GEMM over quantized weights for batched prefill: y[t][n] = sum_k W[n][k] * x'[t][k]
// for every token t of a batch, one pass over the weights for all tokens.
//
// Weights are raw GGUF blocks exactly as stored in the file (no repacking): W has `n` rows of
// `k` values, row r starts at byte r * (k/32) * sizeof(Block). Q4_0 for the layer matrices,
// Q8_0 for the tied lm_head / token_embd.
//
// Two paths, one dispatch place (gemm_quant.cu):
//   Small      : SIMT, 8 tokens per pass; each weight block is loaded once per 8 tokens and used
//                for all of them (fp32 math). Wins for tiny batches where the GEMM is launch- and
//                latency-bound.
//   TensorCore : Q4_0/Q8_0 tiles dequantized to fp16 in shared memory, activations converted to
//                fp16, WMMA m16n16k16 with fp32 accumulation. Weight rows 4-byte aligned
//                (k % 64 == 0 for Q4_0): gemm_pipe.cu, raw tiles copied with a 4-stage cp.async
//                pipeline, 64-row x 32-token tiles, 2 blocks/SM. Otherwise (or with
//                SMOLRT_GEMM_TC_V=1) gemm_tc.cu: register lookahead, 64-row x {32|64}-token tiles.
//   Auto       : TensorCore for t > kGemmSmallMaxTokens (chosen from bench/bench_prefill.cu).
//   Residual (Accumulate) GEMMs with too few tiles split K across blocks and add atomically.
//
// Fused prologue/epilogues (so RMSNorm, RoPE, the KV write and SiLU*up need no launch of their
// own):
//   norm_w != nullptr : x'[t] = x[t] / sqrt(mean(x[t]^2) + eps) * norm_w  (RMSNorm prologue), else
//   x'=x. Store      : y[t*ldy + n] = acc Accumulate : y[t*ldy + n] += acc           (residual:
//   attention output and down projections) SiluPair   : rows are interleaved (2j = gate_j, 2j+1 =
//   up_j);
//                y[t*ldy + j] = silu(acc[2j]) * acc[2j+1]   (n must be even)
//   QkvRope    : rows are [Wq (q_dim) ; Wk (kv_dim) ; Wv (kv_dim)] stacked; RoPE ("normal" GGUF
//                style, adjacent pairs, angle pos*base^(-2i/rope_dim), pos = pos0 + t) is applied
//                to the q and k parts; q goes to y[t*ldy + c], k to k_cache[(pos0+t)*kv_dim + c'],
//                v to v_cache[(pos0+t)*kv_dim + c'], the caches in fp16 or fp32.
#pragma once

#include <cuda_runtime.h>

#include "quant/formats.h"

namespace smolrt::cuda {

enum class GemmPath { Auto, Small, TensorCore };
enum class GemmEpilogue { Store, Accumulate, SiluPair, QkvRope };

// Largest batch the Auto path sends to the SIMT kernel. Measured on an H200 (bench_prefill, whole
// 30-layer prefill): SIMT wins at t=1 (19 vs ~27 us per layer), tensor cores from t~4-7 on.
constexpr int kGemmSmallMaxTokens = 4;
// Process-wide override of that crossover (bench_prefill sweeps it); t < 0 restores the default.
void set_gemm_small_max_tokens(int t);
int gemm_small_max_tokens();

struct GemmArgs {
  const void* w = nullptr;          // device, raw GGUF blocks, n rows x k cols
  GgmlType wtype = GgmlType::Q4_0;  // Q4_0 or Q8_0
  int n = 0;                        // output rows of W (= output features)
  int k = 0;                        // input features; multiple of 32
  const float* x = nullptr;         // device [t][ldx] activations (16-byte aligned)
  int ldx = 0;                      // multiple of 4, >= k
  int t = 0;                        // tokens in the batch (>= 1)
  const float* norm_w = nullptr;    // device [k] RMSNorm weight, or nullptr for no prologue
  float eps = 1e-5f;
};

struct GemmOut {
  float* y = nullptr;  // device [t][ldy]; Store/Accumulate: n cols, SiluPair: n/2, QkvRope: q_dim
  int ldy = 0;
  // QkvRope only:
  int q_dim = 0, kv_dim = 0, head_dim = 0, rope_dim = 0;
  float rope_base = 10000.f;
  int pos0 = 0;             // absolute position of token 0
  void* k_cache = nullptr;  // device [n_ctx][kv_dim] (this layer), fp16 if kv_half else fp32
  void* v_cache = nullptr;
  bool kv_half = true;
};

// Checks shapes and types (throws smolrt::Error naming the bad field), launches, checks the launch.
void gemm_quant(const GemmArgs& a, GemmEpilogue ep, const GemmOut& o, cudaStream_t stream,
                GemmPath path = GemmPath::Auto);

}  // namespace smolrt::cuda
