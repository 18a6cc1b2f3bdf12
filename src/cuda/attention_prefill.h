// Causal grouped-query attention over a whole prompt chunk in one launch (flash-attention-style:
// key/value tiles of 64 staged in shared memory, online softmax, no score matrix in memory).
// head_dim 16/32/64: tensor cores (attention_prefill_tc.cu; Q, K, V and P rounded to fp16, fp32
// accumulation, ~1e-3 relative); head_dim 8: fp32 SIMT kernel.
//
// Query i of the chunk sits at absolute position start + i and attends to keys [0, start + i];
// keys [0, start) are already in the cache from earlier chunks or turns, keys
// [start, start + n_tokens) were written there by this chunk's QKV GEMM (gemm_q4 QkvRope).
#pragma once

#include <cuda_runtime.h>

namespace smolrt::cuda {

struct AttentionPrefillArgs {
  const float* q = nullptr;  // device [n_tokens][ldq]; head h at columns [h*head_dim, ...)
  int ldq = 0;
  const void* k_cache =
      nullptr;  // device [n_ctx][kv_dim] for this layer (kv_dim = n_kv_heads*head_dim)
  const void* v_cache = nullptr;  // same layout
  bool kv_half = true;            // cache element type: fp16 (true) or fp32
  float* out = nullptr;           // device [n_tokens][ldo]; head h at columns [h*head_dim, ...)
  int ldo = 0;
  int n_tokens = 0;                 // queries in this chunk (>= 1)
  int start = 0;                    // absolute position of query 0 (>= 0)
  int n_heads = 0, n_kv_heads = 0;  // query head h reads KV head h / (n_heads / n_kv_heads)
  int head_dim = 0;                 // 8, 16, 32 or 64 (anything else: Error; 128 would overflow
                                    // the 48 KB static shared-memory tile)
};

// Scale 1/sqrt(head_dim). Checks the arguments (smolrt::Error naming the field) and the launch.
void attention_prefill(const AttentionPrefillArgs& a, cudaStream_t stream);

// True when attention_prefill supports this head_dim (callers fall back to per-token attention).
bool attention_prefill_supports(int head_dim);

}  // namespace smolrt::cuda
