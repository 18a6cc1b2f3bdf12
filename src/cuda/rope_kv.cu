// RoPE + KV append: one thread per (2i, 2i+1) pair of Q and K and per V element pair.
#include "cuda/rope_kv.h"

#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

__global__ void rope_kv_kernel(float* q, const float* k, const float* v, float* k_cache,
                               float* v_cache, const int* pos_ptr, int q_pairs, int kv_pairs,
                               int head_dim, int rope_dim, float base) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int pos = *pos_ptr;
  const int kv_dim = kv_pairs * 2;
  if (t < q_pairs + kv_pairs) {
    const bool is_q = t < q_pairs;
    const int r = 2 * (is_q ? t : t - q_pairs);
    float a = is_q ? q[r] : k[r], b = is_q ? q[r + 1] : k[r + 1];
    const int i = (r % head_dim) / 2;
    if (2 * i < rope_dim) {
      const float theta = (float)pos * rope_inv_freq(i, rope_dim, base);
      float sn, cs;
      sincosf(theta, &sn, &cs);
      const float na = a * cs - b * sn, nb = a * sn + b * cs;
      a = na;
      b = nb;
    }
    float* dst = is_q ? q + r : k_cache + (size_t)pos * kv_dim + r;
    dst[0] = a;
    dst[1] = b;
  } else if (t < q_pairs + 2 * kv_pairs) {
    const int r = 2 * (t - q_pairs - kv_pairs);
    v_cache[(size_t)pos * kv_dim + r] = v[r];
    v_cache[(size_t)pos * kv_dim + r + 1] = v[r + 1];
  }
}

}  // namespace

void rope_qk_kv_append(float* q, const float* k, const float* v, float* k_cache, float* v_cache,
                       const int* pos, int n_heads, int n_kv_heads, int head_dim, int rope_dim,
                       float rope_base, cudaStream_t s) {
  if (!q || !k || !v || !k_cache || !v_cache || !pos) fail("rope_qk_kv_append: null pointer");
  if (head_dim <= 0 || head_dim % 2 || rope_dim % 2 || rope_dim > head_dim || n_heads <= 0 ||
      n_kv_heads <= 0) {
    fail("rope_qk_kv_append: bad head_dim ", head_dim, " / rope_dim ", rope_dim);
  }
  const int q_pairs = n_heads * head_dim / 2, kv_pairs = n_kv_heads * head_dim / 2;
  const int n = q_pairs + 2 * kv_pairs;
  launch_kernel(rope_kv_kernel, dim3((n + 127) / 128), dim3(128), 0, s, q, k, v, k_cache, v_cache,
                pos, q_pairs, kv_pairs, head_dim, rope_dim, rope_base);
}

}  // namespace smolrt::cuda
