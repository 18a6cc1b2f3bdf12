// Split-context decode attention (see attention_decode.h). One thread per cached position scores
// q·k with float4 loads (q broadcast from shared memory, no shuffles on the critical path); the
// p·V pass is coalesced over head_dim.
#include "cuda/attention_decode.h"

#include <cfloat>

#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

constexpr int kThreads = kAttnChunk;

__device__ float block_reduce(float v, bool is_max, float* red) {
  v = is_max ? warp_max(v) : warp_sum(v);
  __syncthreads();  // red may still be read by a previous reduction
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

__global__ void __launch_bounds__(kThreads)
    attention_decode_kernel(float* out, const float* q, const float* k_cache, const float* v_cache,
                            const int* pos_ptr, int n_heads, int n_kv_heads, int head_dim,
                            int max_splits, float* partials, int* counters) {
  pdl_wait();
  pdl_trigger();
  __shared__ __align__(16) float sq[128];
  __shared__ float sp[kThreads];
  __shared__ float red[kThreads / 32];
  __shared__ float sacc[kThreads];
  __shared__ int last;

  const int n_pos = *pos_ptr + 1;
  const int h = blockIdx.x, split = blockIdx.y, tid = threadIdx.x;
  const int start = split * kAttnChunk;
  if (start >= n_pos) return;
  const int n = min(kAttnChunk, n_pos - start);
  const int n_split = (n_pos + kAttnChunk - 1) / kAttnChunk;
  const int kv_dim = n_kv_heads * head_dim;
  const int kvh = h / (n_heads / n_kv_heads);
  const float scale = rsqrtf((float)head_dim);

  if (tid < head_dim) sq[tid] = q[h * head_dim + tid];
  __syncthreads();

  // Pass 1: one position per thread.
  float score = -INFINITY;
  if (tid < n) {
    const float4* kr =
        reinterpret_cast<const float4*>(k_cache + (size_t)(start + tid) * kv_dim + kvh * head_dim);
    const float4* q4 = reinterpret_cast<const float4*>(sq);
    float acc = 0.f;
    for (int i = 0; i < head_dim / 4; ++i) {
      const float4 kk = kr[i], qq = q4[i];
      acc += qq.x * kk.x + qq.y * kk.y + qq.z * kk.z + qq.w * kk.w;
    }
    score = acc * scale;
  }
  const float m = block_reduce(score, true, red);
  const float p = tid < n ? expf(score - m) : 0.f;
  sp[tid] = p;
  const float l = block_reduce(p, false, red);  // its syncs also publish sp

  // Pass 2: acc[d] over this split's positions; groups of head_dim threads take every G-th one.
  const int d = tid % head_dim, g = tid / head_dim, G = kThreads / head_dim;
  float acc = 0.f;
  const float* vbase = v_cache + (size_t)start * kv_dim + kvh * head_dim + d;
  for (int t = g; t < n; t += G) acc += sp[t] * vbase[(size_t)t * kv_dim];
  sacc[tid] = acc;
  __syncthreads();
  if (tid < head_dim) {
    for (int k = 1; k < G; ++k) acc += sacc[k * head_dim + tid];
  }

  if (n_split == 1) {
    if (tid < head_dim) out[h * head_dim + tid] = acc / l;
    return;
  }
  float* part = partials + ((size_t)h * max_splits + split) * (head_dim + 2);
  if (tid < head_dim) part[2 + tid] = acc;
  if (tid == 0) {
    part[0] = m;
    part[1] = l;
  }
  __threadfence();  // partials visible device-wide before the counter says so
  __syncthreads();
  if (tid == 0) last = atomicAdd(&counters[h], 1) == n_split - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (tid < head_dim) {
    const float* ph = partials + (size_t)h * max_splits * (head_dim + 2);
    float mm = -INFINITY;
    for (int s = 0; s < n_split; ++s) mm = fmaxf(mm, __ldcg(ph + (size_t)s * (head_dim + 2)));
    float num = 0.f, den = 0.f;
    for (int s = 0; s < n_split; ++s) {
      const float* ps = ph + (size_t)s * (head_dim + 2);
      const float w = expf(__ldcg(ps) - mm);
      den += w * __ldcg(ps + 1);
      num += w * __ldcg(ps + 2 + tid);
    }
    out[h * head_dim + tid] = num / den;
  }
  if (tid == 0) counters[h] = 0;  // ready for the next launch
}

}  // namespace

void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const int* pos, int n_ctx, int n_heads, int n_kv_heads, int head_dim,
                      const AttnScratch& scratch, cudaStream_t s) {
  if (!out || !q || !k_cache || !v_cache || !pos || !scratch.partials || !scratch.counters) {
    fail("attention_decode: null pointer");
  }
  if (head_dim < 4 || head_dim > 128 || head_dim % 4 != 0 || kThreads % head_dim != 0) {
    fail("attention_decode: head_dim ", head_dim,
         " is not supported by the CUDA kernel (4, 8, 16, 32, 64 or 128)");
  }
  if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || n_ctx <= 0) {
    fail("attention_decode: n_heads ", n_heads, " / n_kv_heads ", n_kv_heads, " / n_ctx ", n_ctx);
  }
  const int max_splits = attn_max_splits(n_ctx);
  launch_kernel(attention_decode_kernel, dim3(n_heads, max_splits), dim3(kThreads), 0, s, out, q,
                k_cache, v_cache, pos, n_heads, n_kv_heads, head_dim, max_splits, scratch.partials,
                scratch.counters);
}

}  // namespace smolrt::cuda
