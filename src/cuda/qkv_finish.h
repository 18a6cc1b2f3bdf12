// What happens to the raw Q, K, V projections of a token before attention, for every architecture
// switch of ModelConfig (model/model.h): + biases (qwen2), per-head RMSNorm of Q and K (gemma3),
// RoPE — "normal" (pairs 2i, 2i+1) or NeoX (pairs i, i + rope_dim/2), base per layer, llama3
// frequency factors — then Q back in place and K, V into the KV cache. One launch for n tokens.
//
// The plain llama case (no bias, no norm, normal RoPE without factors) is fused into the QKV
// matvec/GEMM epilogues instead (gemv.h, gemm.h): this kernel is the path for the other
// families and the decode step's debug path. CPU twin: cpu::qkv_finish (one token; the caller
// writes K and V to its cache).
#pragma once

#include <cuda_runtime.h>

#include "cuda/launch.h"

namespace smolrt::cuda {

struct QkvFinishArgs {
  int n = 1;                 // tokens (rows)
  float* q = nullptr;        // device [n][ldq]: raw Q in, finished Q out (head h at h*head_dim)
  int ldq = 0;               // >= n_heads * head_dim
  const float* k = nullptr;  // device [n][ldkv]: raw K and V projections
  const float* v = nullptr;
  int ldkv = 0;  // >= n_kv_heads * head_dim
  // KV cache of this layer, rows of n_kv_heads * head_dim elements (fp16 when kv_half).
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  bool kv_half = false;
  // Row i's position: row_pos[i] (device), else pos0 + i. Its K/V go to cache row row_slot[i]
  // when set (a paged pool's slot), else to its position.
  const int* row_pos = nullptr;
  const int* row_slot = nullptr;
  int pos0 = 0;
  // ring > 0 (without row_slot): the cache is a ring of `ring` rows, position p at row p % ring
  // (a sliding-window layer's cache: see attention_decode.h).
  int ring = 0;
  // Optional (nullptr = absent): biases [q_dim], [kv_dim], [kv_dim]; norm weights [head_dim].
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;
  float eps = 1e-6f;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;  // head_dim even, <= 256
  int rope_dim = 0;                               // even, <= head_dim
  float rope_base = 10000.f;                      // this layer's base
  bool neox = false;
  const float* freq_factors = nullptr;  // device [rope_dim / 2]: angle_i /= factor_i; or nullptr
};

void qkv_finish(const QkvFinishArgs& a, const Launch& s);

}  // namespace smolrt::cuda
