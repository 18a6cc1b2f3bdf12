// One block of 1024 threads does the whole pipeline: a decode step samples one token, and one
// launch with no host round trip beats a multi-kernel top-k for a 49k vocabulary (the logits are
// 196 KB: a few L2-resident passes). The final walk over <= 1024 sorted candidates runs on
// thread 0 in the same order and float operations as cpu::sample, so the two agree bit for bit
// except where the block-wide softmax denominator (top-k off) rounds differently.
#include "cuda/sample.h"

#include <cfloat>
#include <climits>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "core/cuda_check.h"
#include "core/error.h"

namespace smolrt::cuda {
namespace {

constexpr int kThreads = kSampleMaxCandidates;  // one candidate per thread in the sort

struct ValIdx {
  float v;
  int i;  // INT_MAX = none
};
struct BestOf {
  __device__ ValIdx operator()(const ValIdx& a, const ValIdx& b) const {
    if (a.i == INT_MAX) return b;
    if (b.i == INT_MAX) return a;
    return (a.v > b.v || (a.v == b.v && a.i < b.i)) ? a : b;
  }
};

// Order-preserving map of a (non-NaN) float to uint32: larger float -> larger key.
__device__ __forceinline__ uint32_t key_of(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct Shared {
  union {
    typename cub::BlockReduce<ValIdx, kThreads>::TempStorage reduce_vi;
    typename cub::BlockReduce<float, kThreads>::TempStorage reduce_f;
    typename cub::BlockReduce<int, kThreads>::TempStorage reduce_i;
    typename cub::BlockScan<int, kThreads>::TempStorage scan;
    typename cub::BlockRadixSort<unsigned long long, kThreads, 1, int>::TempStorage sort;
  } tmp;
  int hist[256];
  int cand_id[kThreads];
  int n_cand;
  uint32_t prefix;
  int k_rem;
  ValIdx best;
  float z;
  int count;
};

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int n, SamplingParams p, float u, const int* hist,
                  int n_hist, float* work, int* out) {
  __shared__ Shared sh;
  const int tid = threadIdx.x;

  // 1. penalized copy. __syncthreads orders the block's global writes.
  for (int i = tid; i < n; i += kThreads) work[i] = logits[i];
  __syncthreads();
  if (p.has_penalties()) {
    for (int j = tid; j < n_hist; j += kThreads) {
      const int t = hist[j];
      bool first = true;
      int count = 0;
      for (int q = 0; q < n_hist; ++q) {
        if (hist[q] == t) {
          if (q < j) first = false;
          ++count;
        }
      }
      if (!first) continue;  // each distinct token once, by its first occurrence
      float l = work[t];
      l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
      l -= count * p.frequency_penalty + p.presence_penalty;
      work[t] = l;
    }
    __syncthreads();
  }

  // 2. max / argmax and the number of valid (non-NaN) logits.
  ValIdx mine{0.0f, INT_MAX};
  int valid = 0;
  for (int i = tid; i < n; i += kThreads) {
    const float l = work[i];
    if (isnan(l)) continue;
    ++valid;
    mine = BestOf()(mine, ValIdx{l, i});
  }
  ValIdx best = cub::BlockReduce<ValIdx, kThreads>(sh.tmp.reduce_vi).Reduce(mine, BestOf());
  if (tid == 0) sh.best = best;
  __syncthreads();
  const int n_valid_part = valid;
  valid = cub::BlockReduce<int, kThreads>(sh.tmp.reduce_i).Sum(n_valid_part);
  if (tid == 0) sh.count = valid;
  __syncthreads();
  best = sh.best;
  valid = sh.count;
  const float l_max = best.v;
  if (p.greedy() || best.i == INT_MAX || l_max == -INFINITY) {
    if (tid == 0) *out = best.i == INT_MAX ? 0 : best.i;
    return;
  }

  // 3. the candidate set.
  const int k_eff = p.top_k > 0 ? min(p.top_k, valid) : valid;
  const bool use_top_k = k_eff < valid;
  if (use_top_k && k_eff > kSampleMaxCandidates) {
    if (tid == 0) *out = -1;
    return;
  }
  if (tid == 0) sh.n_cand = 0;
  if (use_top_k) {
    // Radix select (8 bits per pass, most significant first) of the k-th largest key.
    if (tid == 0) {
      sh.prefix = 0;
      sh.k_rem = k_eff;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += kThreads) sh.hist[b] = 0;
      __syncthreads();
      const uint32_t prefix = sh.prefix;
      const uint32_t high_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
      for (int i = tid; i < n; i += kThreads) {
        const float l = work[i];
        if (isnan(l)) continue;
        const uint32_t k = key_of(l);
        if ((k & high_mask) == (prefix & high_mask)) atomicAdd(&sh.hist[(k >> shift) & 255u], 1);
      }
      __syncthreads();
      if (tid == 0) {
        int rem = sh.k_rem;
        int d = 255;
        for (; d > 0; --d) {
          if (sh.hist[d] >= rem) break;
          rem -= sh.hist[d];
        }
        sh.k_rem = rem;
        sh.prefix = prefix | (static_cast<uint32_t>(d) << shift);
      }
      __syncthreads();
    }
    const uint32_t kth = sh.prefix;
    const int n_ties = sh.k_rem;  // how many tokens with key == kth enter (lowest ids first)
    for (int i = tid; i < n; i += kThreads) {
      const float l = work[i];
      if (!isnan(l) && key_of(l) > kth) sh.cand_id[atomicAdd(&sh.n_cand, 1)] = i;
    }
    // Ties in id order: each thread scans a contiguous chunk; a block scan ranks the ties.
    const int chunk = (n + kThreads - 1) / kThreads;
    const int lo = tid * chunk, hi = min(n, lo + chunk);
    int my_ties = 0;
    for (int i = lo; i < hi; ++i) my_ties += (!isnan(work[i]) && key_of(work[i]) == kth);
    int rank;
    cub::BlockScan<int, kThreads>(sh.tmp.scan).ExclusiveSum(my_ties, rank);
    __syncthreads();
    const int n_greater = k_eff - n_ties;
    for (int i = lo; i < hi && rank < n_ties; ++i) {
      if (!isnan(work[i]) && key_of(work[i]) == kth) sh.cand_id[n_greater + rank++] = i;
    }
    __syncthreads();
    if (tid == 0) sh.n_cand = k_eff;
  } else {
    // No top-k cut: the top-p denominator is over every valid token; the candidates are the
    // tokens at or above the min-p cut (all of them when min-p is off).
    float part = 0.0f;
    for (int i = tid; i < n; i += kThreads) {
      const float l = work[i];
      if (!isnan(l)) part += expf(l - l_max);
    }
    const float z = cub::BlockReduce<float, kThreads>(sh.tmp.reduce_f).Sum(part);
    if (tid == 0) sh.z = z;
    const float thr = p.min_p > 0.0f ? l_max + logf(p.min_p) : -INFINITY;
    __syncthreads();
    for (int i = tid; i < n; i += kThreads) {
      const float l = work[i];
      if (isnan(l) || !(l >= thr)) continue;
      const int slot = atomicAdd(&sh.n_cand, 1);
      if (slot < kThreads) sh.cand_id[slot] = i;
    }
    __syncthreads();
    if (sh.n_cand > kThreads) {
      if (tid == 0) *out = -1;
      return;
    }
  }
  __syncthreads();

  // 4. sort candidates by (logit desc, id asc): key = (float key << 32) | ~id, descending.
  const int m = sh.n_cand;
  unsigned long long sk[1] = {0ull};
  int sv[1] = {-1};
  if (tid < m) {
    const int id = sh.cand_id[tid];
    sk[0] = (static_cast<unsigned long long>(key_of(work[id])) << 32) |
            static_cast<unsigned long long>(~static_cast<uint32_t>(id));
    sv[0] = id;
  }
  __syncthreads();
  cub::BlockRadixSort<unsigned long long, kThreads, 1, int>(sh.tmp.sort).SortDescending(sk, sv);
  __syncthreads();
  if (tid < m) sh.cand_id[tid] = sv[0];
  __syncthreads();

  // 5. top-p, min-p, temperature and the pick: sequential, as in cpu::candidates/cpu::sample.
  if (tid != 0) return;
  const int* ids = sh.cand_id;
  int keep = m;
  if (p.top_p < 1.0f) {
    float z = 0.0f;
    if (use_top_k) {
      for (int i = 0; i < m; ++i) z += expf(work[ids[i]] - l_max);
    } else {
      z = sh.z;
    }
    float cum = 0.0f;
    for (int i = 0; i < m; ++i) {
      cum += expf(work[ids[i]] - l_max) / z;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const float thr = l_max + logf(p.min_p);
    int k = 1;
    while (k < keep && work[ids[k]] >= thr) ++k;
    keep = k;
  }
  const float inv_t = 1.0f / p.temp;
  float sum = 0.0f;
  for (int i = 0; i < keep; ++i) sum += expf((work[ids[i]] - l_max) * inv_t);
  float total = 0.0f;
  for (int i = 0; i < keep; ++i) total += expf((work[ids[i]] - l_max) * inv_t) / sum;
  const float target = u * total;
  float cum = 0.0f;
  int pick = ids[keep - 1];
  for (int i = 0; i < keep; ++i) {
    cum += expf((work[ids[i]] - l_max) * inv_t) / sum;
    if (cum > target) {
      pick = ids[i];
      break;
    }
  }
  *out = pick;
}

}  // namespace

void sample(const float* logits, int n, const SamplingParams& p, float u, const int* history,
            int n_hist, float* work, int* out, cudaStream_t s) {
  if (!logits || !work || !out || n <= 0 || n_hist < 0 || (n_hist > 0 && !history)) {
    fail("cuda::sample: null pointer or bad size (n=", n, ", n_hist=", n_hist, ")");
  }
  sample_kernel<<<1, kThreads, 0, s>>>(logits, n, p, u, history, n_hist, work, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace smolrt::cuda
