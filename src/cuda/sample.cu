// One block of 1024 threads does the whole pipeline: a decode step samples one token, and one
// launch with no host round trip beats a multi-kernel top-k for a 49k vocabulary. The logits are
// read from global memory once, as order-preserving uint32 keys, into shared memory (196 KB for
// SmolLM's 49152 tokens; Hopper gives a block up to 227 KB), the max coming along; every later
// pass (radix select, collection, softmax sums) then runs at shared-memory speed (a larger
// vocabulary's keys are in a global scratch row: there the passes are the cost, and are few).
// With a top-k cut the final walk over <= 1024 sorted candidates runs on thread 0 in the same
// order and float operations as cpu::sample, so the two agree bit for bit; with top-k off the cuts
// are a logit found by radix selects over integer weights (the same sums in any order) and the
// walk goes in id order over per-thread ranges, whose (double) sums round differently from the
// CPU's at a boundary.
#include "cuda/sample.h"

#include <algorithm>
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

// Step 5's weight of exp(l - l_max) = e: in units of 2^-32 (cpu::sample's p_weight).
__device__ __forceinline__ unsigned long long p_weight(float e) {
  return static_cast<unsigned long long>(e * 0x1p32f);
}
__device__ __forceinline__ unsigned long long key_weight(uint32_t k, float l_max) {
  return p_weight(expf(val_of(k) - l_max));
}
// Step 5's mass to reach: ceil(top_p * z), at most z.
__device__ __forceinline__ unsigned long long top_p_target(unsigned long long z, float top_p) {
  const auto t = static_cast<unsigned long long>(ceil(double(top_p) * double(z)));
  return t < z ? t : z;
}

// A bin's mass as kParts 32-bit sums of pieces of each weight (w <= 2^32): two 16-bit pieces
// hold vocabularies below 2^16 tokens, three 11-bit ones below 2^21 (kSampleMaxVocab). 32-bit
// shared atomics are native; 64-bit adds are compare-and-swap loops that stall under contention.
struct MassBins {
  uint32_t part[3][256];
  static constexpr __host__ __device__ int bits(int parts) { return parts == 2 ? 16 : 11; }
  template <int kParts>
  __device__ void add(uint32_t b, unsigned long long w) {
    constexpr unsigned long long kMask = (1ull << bits(kParts)) - 1;
#pragma unroll
    for (int j = 0; j < kParts; ++j) {
      const unsigned long long piece = w >> (j * bits(kParts));
      atomicAdd(&part[j][b], static_cast<uint32_t>(j + 1 < kParts ? piece & kMask : piece));
    }
  }
  template <int kParts>
  __device__ unsigned long long at(int b) const {
    unsigned long long m = 0;
#pragma unroll
    for (int j = 0; j < kParts; ++j)
      m += static_cast<unsigned long long>(part[j][b]) << (j * bits(kParts));
    return m;
  }
};

// Warp-scan block scans: their storage is a value per warp (the raking default's is a value per
// thread, shared memory the logits need).
template <typename T>
using Scan = cub::BlockScan<T, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;

struct Shared {
  union {
    typename cub::BlockReduce<KeyIdx, kThreads>::TempStorage reduce_ki;
    typename cub::BlockReduce<int, kThreads>::TempStorage reduce_i;
    typename Scan<int>::TempStorage scan;
    typename Scan<double>::TempStorage scan_d;
  } tmp;
  int hist[256];
  int cand_id[kThreads];
  uint32_t cand_key[kThreads];  // keys of the sorted candidates
  union {
    unsigned long long sort_key[kThreads];  // composite keys before ranking
    MassBins mass;                          // top-p's radix select (no top-k: no sort)
    double before[kThreads];                // the id-order walk: the weight before each range
  };
  float e_raw[kThreads];          // exp(l - l_max) per sorted candidate
  float e_temp[kThreads];         // exp((l - l_max) / temp)
  uint32_t thread_max[kThreads];  // each thread's largest key (top-k fast path)
  uint32_t thr;
  int n_cand;
  uint32_t prefix;
  int k_rem;
  unsigned long long mass_rem;
  KeyIdx best;
  double z;
  int valid;
};

__device__ int select_top_k(const uint32_t* keys, int n, int k_eff, Shared& sh);
template <int kParts>
__device__ void top_p_cut(const uint32_t* keys, int n, float l_max, float top_p, Shared& sh);
__device__ void pick_in_id_order(const uint32_t* keys, int n, float l_max, float inv_t, float u,
                                 uint32_t cut, uint32_t tie_key, int ties_in, int top_id,
                                 Shared& sh, int* out);
__device__ bool top_k_fast(const uint32_t* keys, int n, int k_eff, Shared& sh);

// The keys in shared memory (kSharedKeys: vocabularies up to sample_shared_vocab()) or in a
// global scratch row of the block's own (larger ones, read from L2). One block per SM either way
// (shared memory or the register file is full): registers need not leave room for a second.
template <bool kSharedKeys>
__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(const float* __restrict__ logits_base, int ld, int n,
                  const SampleRow* __restrict__ rows, SampleRow one,
                  const int* __restrict__ history, int* __restrict__ outs,
                  uint32_t* __restrict__ scratch) {
  // This block's row: rows[blockIdx.x] (sample_rows), or the one passed by value (sample).
  const SampleRow r = rows != nullptr ? rows[blockIdx.x] : one;
  const float* __restrict__ logits = logits_base + (size_t)r.logits_row * ld;
  const SamplingParams p = r.p;
  const float u = r.u;
  const int* __restrict__ hist = history + r.hist_off;
  const int n_hist = r.n_hist;
  int* const out = outs + r.out;
  extern __shared__ uint32_t shared_keys[];
  uint32_t* const keys = kSharedKeys ? shared_keys : scratch + size_t(blockIdx.x) * n;  // [n]
  __shared__ Shared sh;
  const int tid = threadIdx.x;

  // 1. logits -> keys: the one global pass, 16-byte loads (n % 4 handled by the tail loop). Each
  // thread's largest key (the lowest id of its ties: its ids ascend) and valid keys come along,
  // so a step without penalties reads its keys once less (in a scratch row, a pass over L2).
  KeyIdx mine{0u, INT_MAX};
  int valid = 0;
  auto see = [&](int i, uint32_t k) {
    valid += k != 0u;
    if (k > mine.k) mine = KeyIdx{k, i};
  };
  const int n4 = (reinterpret_cast<uintptr_t>(logits) % 16 == 0) ? n / 4 : 0;
  const float4* l4 = reinterpret_cast<const float4*>(logits);
#pragma unroll 4
  for (int i = tid; i < n4; i += kThreads) {
    const float4 v = __ldg(l4 + i);
    const uint32_t k0 = key_of(v.x), k1 = key_of(v.y), k2 = key_of(v.z), k3 = key_of(v.w);
    keys[4 * i] = k0;
    keys[4 * i + 1] = k1;
    keys[4 * i + 2] = k2;
    keys[4 * i + 3] = k3;
    see(4 * i, k0), see(4 * i + 1, k1), see(4 * i + 2, k2), see(4 * i + 3, k3);
  }
  for (int i = 4 * n4 + tid; i < n; i += kThreads) {
    const uint32_t k = key_of(__ldg(logits + i));
    keys[i] = k;
    see(i, k);
  }
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
    mine = KeyIdx{0u, INT_MAX}, valid = 0;  // the penalized keys' again
    for (int i = tid; i < n; i += kThreads) see(i, keys[i]);
  }

  // 3. max / argmax and the number of valid logits.
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
  // Greedy, all NaN (id 0), or an infinite top logit (core/sampling.h step 3): the argmax.
  if (p.greedy() || top.k == 0u || isinf(l_max)) {
    if (tid == 0) *out = top.k == 0u ? 0 : top.i;
    return;
  }

  // 4. top-k off: the cuts are a logit (top-p's, with its ties in id order, and min-p's) and the
  // walk goes in id order (core/sampling.h step 8).
  const int k_eff = p.top_k > 0 ? min(p.top_k, valid) : valid;
  if (k_eff == valid) {
    uint32_t cut = 1u, tie_key = 0u;  // 0: no tie cut (no valid key is 0)
    int ties_in = 0;
    if (p.top_p < 1.0f) {
      top_p_cut<kSharedKeys ? 2 : 3>(keys, n, l_max, p.top_p, sh);
      cut = tie_key = sh.prefix;
      ties_in = sh.k_rem;
    }
    if (p.min_p > 0.0f) cut = max(cut, key_of(l_max + logf(p.min_p)));
    pick_in_id_order(keys, n, l_max, 1.0f / p.temp, u, cut, tie_key, ties_in, top.i, sh, out);
    return;
  }
  if (k_eff > kSampleMaxCandidates) {
    if (tid == 0) *out = -1;
    return;
  }
  if (!top_k_fast(keys, n, k_eff, sh)) select_top_k(keys, n, k_eff, sh);
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
  const int m = k_eff;  // the fast top-k path collects a few extra
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
    unsigned long long z = 0;
    for (int i = 0; i < m; ++i) z += p_weight(sh.e_raw[i]);
    const unsigned long long target = top_p_target(z, p.top_p);
    unsigned long long cum = 0;
    for (keep = 0; keep < m && cum < target; ++keep) cum += p_weight(sh.e_raw[keep]);
  }
  if (p.min_p > 0.0f) {
    const float thr = l_max + logf(p.min_p);
    int k = 1;
    while (k < keep && lv(k) >= thr) ++k;
    keep = k;
  }
  double sum = 0.0;  // double sums and float probabilities, as cpu::candidates and cpu::sample
  for (int i = 0; i < keep; ++i) sum += sh.e_temp[i];
  double total = 0.0;
  for (int i = 0; i < keep; ++i) total += static_cast<float>(sh.e_temp[i] / sum);
  const double target = u * total;
  double cum = 0.0;
  int pick = ids[keep - 1];
  for (int i = 0; i < keep; ++i) {
    cum += static_cast<float>(sh.e_temp[i] / sum);
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
  Scan<int>(sh.tmp.scan).ExclusiveSum(my_ties, rank);
  __syncthreads();
  const int n_greater = k_eff - n_ties;
  for (int i = lo; i < hi && rank < n_ties; ++i) {
    if (keys[i] == kth) sh.cand_id[n_greater + rank++] = i;
  }
  __syncthreads();
  if (tid == 0) sh.n_cand = k_eff;
  return k_eff;
}

// Top-p's cut with top-k off (step 5 over every valid token): a radix select, 8 bits of the key
// per pass from the top, of the key where the weight sum in (key desc) order reaches the target.
// Returns it in sh.prefix and in sh.k_rem how many of the tokens at it enter, in id order (they
// weigh the same). Integer weights: the bins sum the same in any order, so the cut is
// deterministic and equals the CPU's for equal weights.
template <int kParts>
__device__ void top_p_cut(const uint32_t* keys, int n, float l_max, float top_p, Shared& sh) {
  const int tid = threadIdx.x;
  MassBins& mass = sh.mass;
  uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kThreads) {
#pragma unroll
      for (int j = 0; j < kParts; ++j) mass.part[j][b] = 0u;
    }
    __syncthreads();
    const uint32_t high_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    // Plain shared atomics: aggregating a warp's lanes of one bin first (ballot, two reductions)
    // cost more than the collisions it saves.
    for (int i = tid; i < n; i += kThreads) {
      const uint32_t k = keys[i];
      if (k == 0u || (k & high_mask) != (prefix & high_mask)) continue;
      const unsigned long long w = key_weight(k, l_max);
      if (w == 0) continue;
      const uint32_t b = (k >> shift) & 255u;
      mass.add<kParts>(b, w);
    }
    __syncthreads();
    if (tid < 32) {
      // Warp 0 picks the bin: lane l sums bins 255 - 8l down to 248 - 8l, a scan over the lanes
      // finds the one where the mass from the top reaches what is still to reach, and that lane
      // walks its eight bins.
      unsigned long long s = 0;
      for (int j = 0; j < 8; ++j) s += mass.at<kParts>(255 - 8 * tid - j);
      unsigned long long rem = sh.mass_rem;
      if (shift == 24) {  // the first pass bins every token: the target from their sum
        unsigned long long z = s;
        for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xFFFFFFFFu, z, o);
        rem = top_p_target(z, top_p);  // > 0: the top token weighs 2^32
      }
      unsigned long long incl = s;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long v = __shfl_up_sync(0xFFFFFFFFu, incl, o);
        if (tid >= o) incl += v;
      }
      // The bins under the prefix hold at least rem, so some lane reaches it.
      const unsigned reach = __ballot_sync(0xFFFFFFFFu, incl >= rem);
      if (tid == (reach != 0u ? __ffs(reach) - 1 : 31)) {
        rem -= incl - s;
        int d = 255 - 8 * tid;
        for (int j = 0; j < 7; ++j, --d) {
          const unsigned long long m = mass.at<kParts>(d);
          if (m >= rem) break;
          rem -= m;
        }
        sh.mass_rem = rem;
        sh.prefix = prefix | (static_cast<uint32_t>(d) << shift);
      }
    }
    __syncthreads();
    prefix = sh.prefix;
  }
  if (tid == 0) {
    const unsigned long long w = key_weight(prefix, l_max);
    sh.k_rem = static_cast<int>((sh.mass_rem + w - 1) / w);
  }
  __syncthreads();
}

// Step 8's walk in id order over exp((l - l_max) * inv_t) of the kept tokens: keys >= cut, and
// of the keys equal to tie_key (when not 0) only the first ties_in. Each thread sums a
// contiguous range of ids in one pass (the tie key's tokens counted, not summed: they weigh the
// same, and a scan of the counts says how many of each range's are kept), a block scan gives
// each range's start, and the first range whose next range starts past the target walks its ids
// in order as cpu::sample does (so the two agree but for rounding at a boundary); its last kept id
// of nonzero weight if rounding leaves no crossing. (That range always holds one: a range of no
// weight ends where the one before it does. top_id, the argmax, which every cut keeps, stands in
// regardless.)
__device__ void pick_in_id_order(const uint32_t* keys, int n, float l_max, float inv_t, float u,
                                 uint32_t cut, uint32_t tie_key, int ties_in, int top_id,
                                 Shared& sh, int* out) {
  const int tid = threadIdx.x;
  const int per = (n + kThreads - 1) / kThreads;
  const int lo = min(n, tid * per), hi = min(n, lo + per);
  const bool ties = tie_key != 0u && tie_key >= cut;  // block-uniform: a min-p cut may pass it
  double part = 0.0;  // double: a float sum over a vocabulary drifts by whole token widths
  int my_ties = 0;
  for (int i = lo; i < hi; ++i) {
    const uint32_t k = keys[i];
    if (k == 0u || k < cut) continue;
    if (ties && k == tie_key) {
      ++my_ties;
      continue;
    }
    part += expf((val_of(k) - l_max) * inv_t);
  }
  int tie_rank = 0;  // kept-candidate tokens at tie_key before this range
  if (ties) {
    Scan<int>(sh.tmp.scan).ExclusiveSum(my_ties, tie_rank);
    __syncthreads();  // the scan's storage is reused below
    const int in = max(0, min(my_ties, ties_in - tie_rank));
    part += static_cast<double>(expf((val_of(tie_key) - l_max) * inv_t)) * in;
  }
  double before;
  Scan<double>(sh.tmp.scan_d).ExclusiveSum(part, before);
  sh.before[tid] = before;
  if (tid == kThreads - 1) sh.z = before + part;
  if (tid == 0) sh.n_cand = INT_MAX;
  __syncthreads();
  const double target = u * sh.z;
  const double end = tid + 1 < kThreads ? sh.before[tid + 1] : INFINITY;
  if (target < end) atomicMin(&sh.n_cand, tid);
  __syncthreads();
  if (tid != sh.n_cand) return;
  double cum = before;
  int rank = tie_rank, last = -1;
  for (int i = lo; i < hi; ++i) {
    const uint32_t k = keys[i];
    if (k == 0u || k < cut || (ties && k == tie_key && rank++ >= ties_in)) continue;
    const float e = expf((val_of(k) - l_max) * inv_t);
    if (e <= 0.0f) continue;
    last = i;
    if ((cum += e) > target) {
      *out = i;
      return;
    }
  }
  *out = last >= 0 ? last : top_id;
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

int sample_shared_vocab() {
  static const int max_vocab = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes attr{};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, sample_kernel<true>));
    const int bytes = optin - static_cast<int>(attr.sharedSizeBytes);
    CUDA_CHECK(cudaFuncSetAttribute(sample_kernel<true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    // MassBins' two 16-bit pieces (the shared-keys kernel's) sum at most 65,535 weights.
    return std::min(bytes / static_cast<int>(sizeof(uint32_t)), 65535);
  }();
  return max_vocab;
}

size_t sample_scratch_words(int n, int rows) {
  return n <= sample_shared_vocab() ? 0 : size_t(n) * size_t(rows);
}

namespace {
void launch(const char* what, const float* logits, int ld, int n, const SampleRow* rows,
            const SampleRow& one, int count, const int* history, int* out, uint32_t* scratch,
            const Launch& s) {
  if (n > kSampleMaxVocab) {
    fail(what, ": a vocabulary of ", n, " tokens exceeds the GPU sampler's ", kSampleMaxVocab,
         "; sample on the host instead");
  }
  if (n <= sample_shared_vocab()) {
    sample_kernel<true><<<count, kThreads, n * sizeof(uint32_t), s.stream>>>(
        logits, ld, n, rows, one, history, out, nullptr);
  } else {
    if (!scratch) {
      fail(what, ": a vocabulary of ", n, " tokens needs a scratch of sample_scratch_words()");
    }
    sample_kernel<false>
        <<<count, kThreads, 0, s.stream>>>(logits, ld, n, rows, one, history, out, scratch);
  }
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void sample(const float* logits, int n, const SamplingParams& p, float u, const int* history,
            int n_hist, int* out, uint32_t* scratch, const Launch& s) {
  if (!logits || !out || n <= 0 || n_hist < 0 || (n_hist > 0 && !history)) {
    fail("cuda::sample: null pointer or bad size (n=", n, ", n_hist=", n_hist, ")");
  }
  SampleRow one;
  one.p = p, one.u = u, one.n_hist = n_hist;
  launch("cuda::sample", logits, n, n, nullptr, one, 1, history, out, scratch, s);
}

void sample_rows(const float* logits, int ld, int n, const SampleRow* rows, int count,
                 const int* history, int* out, uint32_t* scratch, const Launch& s) {
  if (count == 0) return;
  if (!logits || !rows || !out || n <= 0 || ld < n || count < 0) {
    fail("cuda::sample_rows: null pointer or bad size (n=", n, ", ld=", ld, ", rows=", count, ")");
  }
  launch("cuda::sample_rows", logits, ld, n, rows, SampleRow{}, count, history, out, scratch, s);
}

}  // namespace smolrt::cuda
