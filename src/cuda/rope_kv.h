// RoPE of Q and K plus the KV-cache append, in one launch (the unfused/debug path; the fast path
// does the same in the QKV matvec epilogue, gemv.h).
//
// KV cache: fp32, [n_ctx][kv_dim] per layer for K and for V. fp32 was chosen over fp16 so GPU
// and CPU (fp32 oracle) match to ~1e-6 per element; at decode positions below ~1000 the KV bytes
// read per token are far below the 86 MB of weights, so fp16 would buy little there.
#pragma once

#include <cuda_runtime.h>

namespace smolrt::cuda {

// q: [n_heads*head_dim] rotated in place; k, v: [kv_dim] (k read, not modified); writes the
// rotated k to k_cache[*pos*kv_dim ..] and v to v_cache[*pos*kv_dim ..]. pos: device pointer.
void rope_qk_kv_append(float* q, const float* k, const float* v, float* k_cache, float* v_cache,
                       const int* pos, int n_heads, int n_kv_heads, int head_dim, int rope_dim,
                       float rope_base, cudaStream_t s);

}  // namespace smolrt::cuda
