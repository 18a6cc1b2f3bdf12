// One block of 1024 threads does the whole pipeline: a decode step samples one token, and one
// launch with no host round trip beats a multi-kernel top-k for a 49k vocabulary. The logits are
// read from global memory once, as order-preserving uint32 keys, into shared memory (196 KB for
// SmolLM's 49152 tokens; Hopper gives a block up to 227 KB); every later pass (max, radix select,
// collection, softmax sums) then runs at shared-memory speed. The final walk over <= 1024 sorted
// candidates runs on thread 0 in the same order and float operations as cpu::sample, so the two
// agree bit for bit except where the block-wide softmax denominator (top-k off) rounds
// differently.
#include "cuda/sample.h"

#include <climits>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "core/cuda_check.h"
#include "core/error.h"

namespace smolrt::cuda {
namespace {

constexpr int kThreads = kSampleMaxCandidates;  // one candidate per thread in the sort

struct KeyIdx {
  uint32_t k;  // 0 = none
  int i;
};
struct BestOf {  // larger key wins; ties -> lower index
  __device__ KeyIdx operator()(const KeyIdx& a, const KeyIdx& b) const {
    return (a.k > b.k || (a.k == b.k && a.i < b.i)) ? a : b;
  }
};

// Order-preserving map float -> uint32 (larger float, larger key). NaN -> 0, below every float
// (key_of(-inf) = 0x007FFFFF), so "key != 0" means "valid".
__device__ __forceinline__ uint32_t key_of(float f) {
  if (isnan(f)) return 0u;
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float val_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

struct Shared {
  union {
    typename cub::BlockReduce<KeyIdx, kThreads>::TempStorage reduce_ki;
    typename cub::BlockReduce<float, kThreads>::TempStorage reduce_f;
    typename cub::BlockReduce<int, kThreads>::TempStorage reduce_i;
    typename cub::BlockScan<int, kThreads>::TempStorage scan;
    typename cub::BlockScan<float, kThreads>::TempStorage scan_f;
  } tmp;
  int hist[256];
  int cand_id[kThreads];
  uint32_t cand_key[kThreads];            // keys of the sorted candidates
  unsigned long long sort_key[kThreads];  // composite keys before ranking
  float e_raw[kThreads];                  // exp(l - l_max) per sorted candidate
  float e_temp[kThreads];                 // exp((l - l_max) / temp)
  uint32_t thread_max[kThreads];          // each thread's largest key (top-k fast path)
  uint32_t thr;
  int n_cand;
  uint32_t prefix;
  int k_rem;
  KeyIdx best;
  float z;
  int valid;
};

__device__ int select_top_k(const uint32_t* keys, int n, int k_eff, Shared& sh);
__device__ void pick_uncut(const uint32_t* keys, int n, float l_max, float inv_t, float u,
                           Shared& sh, int* out);
__device__ bool top_k_fast(const uint32_t* keys, int n, int k_eff, Shared& sh);

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits_base, int ld, int n,
                  const SampleRow* __restrict__ rows, SampleRow one,
                  const int* __restrict__ history, int* __restrict__ outs) {
  // This block's row: rows[blockIdx.x] (sample_rows), or the one passed by value (sample).
  const SampleRow r = rows != nullptr ? rows[blockIdx.x] : one;
  const float* __restrict__ logits = logits_base + (size_t)r.logits_row * ld;
  const SamplingParams p = r.p;
  const float u = r.u;
  const int* __restrict__ hist = history + r.hist_off;
  const int n_hist = r.n_hist;
  int* const out = outs + r.out;
  extern __shared__ uint32_t keys[];  // [n]
  __shared__ Shared sh;
  const int tid = threadIdx.x;

  // 1. logits -> keys: the one global pass, 16-byte loads (n % 4 handled by the tail loop).
  const int n4 = (reinterpret_cast<uintptr_t>(logits) % 16 == 0) ? n / 4 : 0;
  const float4* l4 = reinterpret_cast<const float4*>(logits);
#pragma unroll 4
  for (int i = tid; i < n4; i += kThreads) {
    const float4 v = __ldg(l4 + i);
    keys[4 * i] = key_of(v.x);
    keys[4 * i + 1] = key_of(v.y);
    keys[4 * i + 2] = key_of(v.z);
    keys[4 * i + 3] = key_of(v.w);
  }
  for (int i = 4 * n4 + tid; i < n; i += kThreads) keys[i] = key_of(__ldg(logits + i));
  __syncthreads();

  // 2. penalties: each distinct window token once (by its first occurrence) with its count.
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
      if (!first || keys[t] == 0u) continue;
      float l = val_of(keys[t]);
      l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
      l -= count * p.frequency_penalty + p.presence_penalty;
      keys[t] = key_of(l);
    }
    __syncthreads();
  }

  // 3. max / argmax and the number of valid logits.
  KeyIdx mine{0u, INT_MAX};
  int valid = 0;
  for (int i = tid; i < n; i += kThreads) {
    const uint32_t k = keys[i];
    valid += k != 0u;
    if (k > mine.k) mine = KeyIdx{k, i};  // i ascends per thread: ties keep the lowest
  }
  sh.thread_max[tid] = mine.k;
  const KeyIdx best = cub::BlockReduce<KeyIdx, kThreads>(sh.tmp.reduce_ki).Reduce(mine, BestOf());
  if (tid == 0) sh.best = best;
  __syncthreads();
  valid = cub::BlockReduce<int, kThreads>(sh.tmp.reduce_i).Sum(valid);
  if (tid == 0) sh.valid = valid;
  __syncthreads();
  const KeyIdx top = sh.best;
  valid = sh.valid;
  const float l_max = val_of(top.k);
  if (p.greedy() || top.k == 0u || l_max == -INFINITY) {
    if (tid == 0) *out = top.k == 0u ? 0 : top.i;
    return;
  }

  // 4. the candidate set.
  const int k_eff = p.top_k > 0 ? min(p.top_k, valid) : valid;
  const bool use_top_k = k_eff < valid;
  if (!use_top_k && p.top_p >= 1.0f && p.min_p <= 0.0f) {  // nothing cut: walk ids in order
    pick_uncut(keys, n, l_max, 1.0f / p.temp, u, sh, out);
    return;
  }
  if (use_top_k && k_eff > kSampleMaxCandidates) {
    if (tid == 0) *out = -1;
    return;
  }
  bool nucleus = false;  // top-p alone over more than kThreads tokens: its set from the first ones
  if (use_top_k) {
    if (!top_k_fast(keys, n, k_eff, sh)) select_top_k(keys, n, k_eff, sh);
  } else {
    // No top-k cut: the top-p denominator is over every valid token; the candidates are the
    // tokens at or above the min-p cut (all of them when min-p is off).
    float part = 0.0f;
    for (int i = tid; i < n; i += kThreads) {
      if (keys[i] != 0u) part += expf(val_of(keys[i]) - l_max);
    }
    const float z = cub::BlockReduce<float, kThreads>(sh.tmp.reduce_f).Sum(part);
    if (tid == 0) {
      sh.z = z;
      sh.n_cand = 0;
    }
    __syncthreads();
    const uint32_t thr = p.min_p > 0.0f ? key_of(l_max + logf(p.min_p)) : 1u;
    for (int i = tid; i < n; i += kThreads) {
      if (keys[i] < thr || keys[i] == 0u) continue;
      const int slot = atomicAdd(&sh.n_cand, 1);
      if (slot < kThreads) sh.cand_id[slot] = i;
    }
    __syncthreads();
    if (sh.n_cand > kThreads) {
      if (p.top_p >= 1.0f || p.min_p > 0.0f) {
        if (tid == 0) *out = -1;
        return;
      }
      // Top-p alone: its set is a prefix of the sorted vocabulary, which a model's distribution
      // keeps short: take the first kThreads ids (the walk below says -1 if they do not reach
      // top_p). The barrier: every thread has read n_cand before the selection resets it.
      nucleus = true;
      __syncthreads();
      if (!top_k_fast(keys, n, kThreads, sh)) select_top_k(keys, n, kThreads, sh);
    }
  }
  __syncthreads();

  // 5. order candidates by (logit desc, id asc): each thread ranks one candidate against all
  // (m <= 1024 compares from shared memory; cheaper than a block radix sort at k = 40).
  // Composite key (float key << 32) | ~id is unique, so ranks are a permutation.
  const int n_sort = sh.n_cand;
  unsigned long long mine_key = 0ull;
  int mine_id = -1;
  if (tid < n_sort) {
    mine_id = sh.cand_id[tid];
    mine_key = (static_cast<unsigned long long>(keys[mine_id]) << 32) |
               static_cast<unsigned long long>(~static_cast<uint32_t>(mine_id));
    sh.sort_key[tid] = mine_key;
  }
  __syncthreads();
  if (tid < n_sort) {
    int rank = 0;
    for (int j = 0; j < n_sort; ++j) rank += sh.sort_key[j] > mine_key;
    sh.cand_id[rank] = mine_id;
    sh.cand_key[rank] = static_cast<uint32_t>(mine_key >> 32);
  }
  __syncthreads();
  // The fast top-k path collects a few extra.
  const int m = use_top_k ? k_eff : (nucleus ? kThreads : n_sort);
  // Per-candidate exponentials in parallel; thread 0 then sums them in order like the CPU.
  const float inv_t = 1.0f / p.temp;
  if (tid < m) {
    const float d = val_of(sh.cand_key[tid]) - l_max;
    sh.e_raw[tid] = expf(d);
    sh.e_temp[tid] = expf(d * inv_t);
  }
  __syncthreads();

  // 6. top-p, min-p, temperature and the pick: sequential, as in cpu::candidates/cpu::sample.
  if (tid != 0) return;
  const int* ids = sh.cand_id;
  auto lv = [&](int i) { return val_of(sh.cand_key[i]); };
  int keep = m;
  if (p.top_p < 1.0f) {
    float z = 0.0f;
    if (use_top_k) {
      for (int i = 0; i < m; ++i) z += sh.e_raw[i];
    } else {
      z = sh.z;
    }
    float cum = 0.0f;
    bool reached = false;
    for (int i = 0; i < m && !reached; ++i) {
      cum += sh.e_raw[i] / z;
      reached = cum >= p.top_p;
      keep = i + 1;
    }
    if (nucleus && !reached) {  // the top-p set passes kThreads tokens: the host samples
      *out = -1;
      return;
    }
  }
  if (p.min_p > 0.0f) {
    const float thr = l_max + logf(p.min_p);
    int k = 1;
    while (k < keep && lv(k) >= thr) ++k;
    keep = k;
  }
  float sum = 0.0f;
  for (int i = 0; i < keep; ++i) sum += sh.e_temp[i];
  float total = 0.0f;
  for (int i = 0; i < keep; ++i) total += sh.e_temp[i] / sum;
  const float target = u * total;
  float cum = 0.0f;
  int pick = ids[keep - 1];
  for (int i = 0; i < keep; ++i) {
    cum += sh.e_temp[i] / sum;
    if (cum > target) {
      pick = ids[i];
      break;
    }
  }
  *out = pick;
}

// Exact top-k (k <= kThreads) into sh.cand_id[0..k): radix select of the k-th largest key
// (8 bits per pass, most significant first), then every larger key, then the ties at the k-th
// key in id order (lowest ids first), ranked by a block scan over contiguous id chunks.
__device__ int select_top_k(const uint32_t* keys, int n, int k_eff, Shared& sh) {
  const int tid = threadIdx.x;
  if (tid == 0) {
    sh.prefix = 0;
    sh.k_rem = k_eff;
    sh.n_cand = 0;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    const uint32_t high_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    for (int i = tid; i < n; i += kThreads) {
      const uint32_t k = keys[i];
      const bool in = k != 0u && (k & high_mask) == (prefix & high_mask);
      // Logits crowd into few buckets: aggregate per warp (one atomic per distinct bucket)
      // instead of 32 colliding shared atomics.
      const uint32_t bin = in ? (k >> shift) & 255u : 256u;
      const unsigned group = __match_any_sync(__activemask(), bin);
      if (in && (threadIdx.x & 31) == __ffs(group) - 1) atomicAdd(&sh.hist[bin], __popc(group));
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
  const int n_ties = sh.k_rem;  // how many tokens with key == kth enter
  const int chunk = (n + kThreads - 1) / kThreads;
  const int lo = min(n, tid * chunk), hi = min(n, lo + chunk);
  int my_ties = 0;
  for (int i = lo; i < hi; ++i) {
    const uint32_t k = keys[i];
    if (k > kth) sh.cand_id[atomicAdd(&sh.n_cand, 1)] = i;
    my_ties += k == kth;
  }
  int rank;
  cub::BlockScan<int, kThreads>(sh.tmp.scan).ExclusiveSum(my_ties, rank);
  __syncthreads();
  const int n_greater = k_eff - n_ties;
  for (int i = lo; i < hi && rank < n_ties; ++i) {
    if (keys[i] == kth) sh.cand_id[n_greater + rank++] = i;
  }
  __syncthreads();
  if (tid == 0) sh.n_cand = k_eff;
  return k_eff;
}

struct MaxInt {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

// Step 8 when steps 4-6 cut nothing (core/sampling.h): the walk in id order over
// exp((l - l_max) * inv_t). Each thread sums a contiguous range of ids, a block scan gives each
// range's start, and the first range whose next range starts past the target walks its ids in
// order as cpu::sample does (so the two agree but for rounding at a boundary); its last id of
// nonzero weight (or the last one overall) if rounding leaves no crossing.
__device__ void pick_uncut(const uint32_t* keys, int n, float l_max, float inv_t, float u,
                           Shared& sh, int* out) {
  const int tid = threadIdx.x;
  const int per = (n + kThreads - 1) / kThreads;
  const int lo = min(n, tid * per), hi = min(n, lo + per);
  float part = 0.0f;
  int last = -1;  // the range's last id of nonzero weight
  for (int i = lo; i < hi; ++i) {
    if (keys[i] == 0u) continue;
    const float e = expf((val_of(keys[i]) - l_max) * inv_t);
    part += e;
    if (e > 0.0f) last = i;
  }
  float before;
  cub::BlockScan<float, kThreads>(sh.tmp.scan_f).ExclusiveSum(part, before);
  sh.e_raw[tid] = before;
  if (tid == kThreads - 1) sh.z = before + part;
  __syncthreads();  // the scan's storage is reused below
  const int last_valid = cub::BlockReduce<int, kThreads>(sh.tmp.reduce_i).Reduce(last, MaxInt());
  if (tid == 0) {
    sh.valid = last_valid;
    sh.n_cand = INT_MAX;
  }
  __syncthreads();
  const float target = u * sh.z;
  const float end = tid + 1 < kThreads ? sh.e_raw[tid + 1] : INFINITY;
  if (target < end) atomicMin(&sh.n_cand, tid);
  __syncthreads();
  if (tid != sh.n_cand) return;
  float cum = before;
  for (int i = lo; i < hi; ++i) {
    if (keys[i] == 0u) continue;
    cum += expf((val_of(keys[i]) - l_max) * inv_t);
    if (cum > target) {
      *out = i;
      return;
    }
  }
  *out = last >= 0 ? last : sh.valid;
}

// Top-k in two shared-memory passes for the usual case: T = the k-th largest of the threads'
// maxima (a bitonic sort of 1024 values), so at least k keys are >= T; when at most kThreads keys
// are, collect them all into sh.cand_id (sh.n_cand = their count); the rank sort then orders
// them and the caller keeps the first k. Exact, ties included. Returns false (nothing written)
// when T is 0 or too many keys reach it; the radix select handles those.
__device__ bool top_k_fast(const uint32_t* keys, int n, int k_eff, Shared& sh) {
  const int tid = threadIdx.x;
  // Bitonic sort of the 1024 thread maxima, descending (55 compare-exchange steps).
  uint32_t* tm = sh.thread_max;
  for (int size = 2; size <= kThreads; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      const int j = tid ^ stride;
      if (j > tid) {
        const uint32_t a = tm[tid], b = tm[j];
        if ((tid & size) == 0 ? a < b : a > b) {
          tm[tid] = b;
          tm[j] = a;
        }
      }
    }
  }
  __syncthreads();  // the last compare-exchange's writes before thread 0 reads the k-th
  if (tid == 0) {
    sh.thr = tm[k_eff - 1];
    sh.n_cand = 0;
  }
  __syncthreads();
  const uint32_t thr = sh.thr;
  if (thr == 0u) return false;  // block-uniform
  int cnt = 0;
  for (int i = tid; i < n; i += kThreads) cnt += keys[i] >= thr;
  cnt = cub::BlockReduce<int, kThreads>(sh.tmp.reduce_i).Sum(cnt);
  if (tid == 0) sh.valid = cnt;
  __syncthreads();
  if (sh.valid > kThreads) return false;  // block-uniform
  for (int i = tid; i < n; i += kThreads) {
    if (keys[i] >= thr) sh.cand_id[atomicAdd(&sh.n_cand, 1)] = i;
  }
  __syncthreads();
  return true;
}

}  // namespace

int sample_max_vocab() {
  static const int max_vocab = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes attr{};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, sample_kernel));
    const int bytes = optin - static_cast<int>(attr.sharedSizeBytes);
    CUDA_CHECK(
        cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return bytes / static_cast<int>(sizeof(uint32_t));
  }();
  return max_vocab;
}

void sample(const float* logits, int n, const SamplingParams& p, float u, const int* history,
            int n_hist, int* out, const Launch& s) {
  if (!logits || !out || n <= 0 || n_hist < 0 || (n_hist > 0 && !history)) {
    fail("cuda::sample: null pointer or bad size (n=", n, ", n_hist=", n_hist, ")");
  }
  if (n > sample_max_vocab()) {
    fail("cuda::sample: a vocabulary of ", n, " tokens exceeds the GPU sampler's ",
         sample_max_vocab(), " (shared memory); sample on the host instead");
  }
  SampleRow one;
  one.p = p, one.u = u, one.n_hist = n_hist;
  sample_kernel<<<1, kThreads, n * sizeof(uint32_t), s.stream>>>(logits, n, n, nullptr, one,
                                                                 history, out);
  CUDA_CHECK_LAUNCH();
}

void sample_rows(const float* logits, int ld, int n, const SampleRow* rows, int count,
                 const int* history, int* out, const Launch& s) {
  if (count == 0) return;
  if (!logits || !rows || !out || n <= 0 || ld < n || count < 0) {
    fail("cuda::sample_rows: null pointer or bad size (n=", n, ", ld=", ld, ", rows=", count, ")");
  }
  if (n > sample_max_vocab()) {
    fail("cuda::sample_rows: a vocabulary of ", n, " tokens exceeds the GPU sampler's ",
         sample_max_vocab(), " (shared memory); sample on the host instead");
  }
  sample_kernel<<<count, kThreads, n * sizeof(uint32_t), s.stream>>>(logits, ld, n, rows,
                                                                     SampleRow{}, history, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace smolrt::cuda
