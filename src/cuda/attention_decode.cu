// Split-context decode attention (see attention_decode.h). Latency-bound at decode sizes, so
// every loop has a compile-time trip count (template HD) and all loads of a 128-position
// sub-chunk (K and V together) are issued at once: one memory round trip and two barriers per
// sub-chunk, and contexts up to 128 positions need no split combine. Pass 1 scores 128 positions
// with 4 threads each (float4 loads of K, 2 shuffles); every warp redoes the softmax bookkeeping
// from shared memory (no block reduction); pass 2 accumulates V coalesced over head_dim.
#include "cuda/attention_decode.h"

#include <type_traits>

#include "core/error.h"
#include "cuda/attention_paged.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kAttnTabMax = 256;  // block-table entries a split stages in shared memory

// Where position t's K/V row is. kTable: table[t / page] * page + t % page (a paged pool's block
// table; page a power of two, so shifts, not the ~20-instruction divisions by a runtime page size
// that every row address of a sub-chunk paid). kRun: the pages are consecutive, so row
// run_base + t (no table staged). kFlat: cache_row(t, ring).
enum RowMode : int { kFlat, kTable, kRun };

// One block's work (head blockIdx.x, split blockIdx.y) for positions [0, n_pos); the kernel below
// reads n_pos and run_base and gives the shared memory. E: the caches' element type (float, or
// __half for an fp16 pool).
template <int HD, int MODE, typename E>
__device__ __forceinline__ void decode_block(float* out, const float* q, const E* k_cache,
                                             const E* v_cache, int n_pos, size_t run_base,
                                             int n_heads, int n_kv_heads, int n_splits_max,
                                             float* partials, int* counters, const int* tables,
                                             const int* seq, int stride, int page, int window,
                                             float scale_arg, int ring, int entry, float* sscore,
                                             float* sacc, int& last, int* stab) {
  constexpr int SUB = attn_sub(HD);
  constexpr int kTpp = kThreads / SUB;                // threads per scored position
  constexpr int DPT = HD / kTpp > 0 ? HD / kTpp : 1;  // pass-1 dims per thread
  constexpr int G = kThreads / HD;                    // pass-2 position groups
  constexpr int PPT = SUB / G > 0 ? SUB / G : 1;
  // Keys [lo, n_pos): the whole context, or the last `window` positions (sliding window).
  const int page_shift = __ffs(page) - 1;  // paged: a power of two (checked by the host)
  const int cur = n_pos - 1;
  const int lo = window > 0 && n_pos > window ? n_pos - window : 0;
  const int h = blockIdx.x, split = blockIdx.y, tid = threadIdx.x, lane = tid & 31;
  const int subs = (n_pos - lo + SUB - 1) / SUB;
  const int chunk = SUB * ((subs + n_splits_max - 1) / n_splits_max);
  const int n_split = (n_pos - lo + chunk - 1) / chunk;
  const int start = lo + split * chunk;
  if (start >= n_pos) {
    pdl_wait();  // every block waits, so completion stays transitive along the chain
    return;
  }
  const int end = min(n_pos, start + chunk);
  const int kv_dim = n_kv_heads * HD;
  const int kvh = h / (n_heads / n_kv_heads);
  // Scores in base 2 (scaled by log2(e)), as every attention kernel keeps them: exp2f, and the
  // split partials merge through merge_partials.
  const float scale = (scale_arg > 0.f ? scale_arg : rsqrtf((float)HD)) * 1.4426950408889634f;

  // Pass-1 role: position tid/kTpp of the sub-chunk, dims [j*DPT, j*DPT+DPT).
  const int pp = tid / kTpp, j = tid % kTpp;
  const bool has_dims = j * DPT < HD;
  // Pass-2 role: dim d, positions g, g+G, ...
  const int d = tid % HD, g = tid / HD;
  const E* kbase = k_cache + kvh * HD + j * DPT;
  const E* vbase = v_cache + kvh * HD + d;

  // Paged: the block table (host-staged like pos, so read before the PDL wait), entries [tb0,
  // tb0 + kAttnTabMax) staged in shared memory, so that finding a row is a shift and a shared
  // load: no branch and no dependent global load per row (either would serialize the sub-chunk's
  // loads). A table given directly (seq null: staged with the step) was read by the kernel from
  // its start at once (`entry`: this thread's), in parallel with pos, so the first K/V loads wait
  // for one memory round trip, not two; one found through *seq is read from this split's first
  // page. A split longer than the staged entries restages them (stage) between sub-chunks.
  int tb0 = 0;
  const int* table = nullptr;
  static_assert(kAttnTabMax <= kThreads, "one staged entry per thread");
  // Stages entries from page `from` (block-uniform; every thread calls it).
  auto stage = [&](int from) {
    tb0 = from;
    if (tid < kAttnTabMax && from + tid < stride) stab[tid] = table[from + tid];
    __syncthreads();
  };
  // Whether sub-chunk [c0, c0 + SUB)'s pages are past the staged ones.
  auto past = [&](int c0) { return ((min(c0 + SUB, end) - 1) >> page_shift) - tb0 >= kAttnTabMax; };
  if constexpr (MODE == kTable) {
    table = seq ? tables + (size_t)*seq * stride : tables;
    if (seq || past(start)) {
      stage(start >> page_shift);
    } else {
      if (tid < min(stride, kAttnTabMax)) stab[tid] = entry;
      __syncthreads();
    }
  }
  auto row = [&](int t) -> size_t {
    if constexpr (MODE == kRun) {
      return run_base + t;
    } else if constexpr (MODE == kTable) {
      // 32-bit: pool slots fit (KvPages checks), and the 64-bit shifts cost more per row.
      return (uint32_t(stab[(t >> page_shift) - tb0]) << page_shift) | uint32_t(t & (page - 1));
    } else {
      return (size_t)cache_row(t, ring);
    }
  };
  // K and V of one sub-chunk into registers (one memory round trip); position `skip` is left
  // for later.
  // fp16 pools: the rows stay fp16 in registers (K as half2 pairs where DPT allows 16-byte
  // loads) and are converted where they are used, so a sub-chunk's loads are all in flight
  // before the first conversion waits on one (converting at the load would serialize them).
  constexpr bool KH = std::is_same_v<E, __half> && DPT % 8 == 0;
  using KR = std::conditional_t<KH, __half2, float>;
  constexpr int KN = KH ? DPT / 2 : DPT;
  KR kreg[KN];
  E vr[PPT];
  auto load_k = [&](int t) {
    const E* kr = kbase + row(t) * kv_dim;
    if constexpr (KH) {
#pragma unroll
      for (int i = 0; i < DPT; i += 8) {
        const uint4 u = *reinterpret_cast<const uint4*>(kr + i);
        const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
        for (int e = 0; e < 4; ++e) kreg[i / 2 + e] = h[e];
      }
    } else if constexpr (std::is_same_v<E, float> && DPT % 4 == 0) {
#pragma unroll
      for (int i = 0; i < DPT; i += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(kr + i);
        kreg[i] = k4.x;
        kreg[i + 1] = k4.y;
        kreg[i + 2] = k4.z;
        kreg[i + 3] = k4.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < DPT; ++i) kreg[i] = to_f32(kr[i]);
    }
  };
  auto load_kv = [&](int c0, int skip) {
#pragma unroll
    for (int i = 0; i < PPT; ++i) {
      const int t = c0 + g + G * i;
      // The address of a row past the end is that of the last (a staged entry), so the load is
      // predicated, not branched around: the sub-chunk's table reads and loads then issue
      // together.
      const E* v = vbase + row(MODE == kTable ? min(t, end - 1) : t) * kv_dim;
      vr[i] = t < end && t != skip ? *v : E{};
    }
    const int t = c0 + pp;
    if (t < end && t != skip && has_dims) {
      load_k(t);
    } else {
#pragma unroll
      for (int i = 0; i < KN; ++i) kreg[i] = KR{};  // zero
    }
  };
  load_kv(start, cur);

  pdl_wait();
  pdl_trigger();
  float qr[DPT];
#pragma unroll
  for (int i = 0; i < DPT; ++i) qr[i] = has_dims ? q[h * HD + j * DPT + i] : 0.f;
  if (start + pp == cur && has_dims) load_k(cur);
#pragma unroll
  for (int i = 0; i < PPT; ++i) {
    if (start + g + G * i == cur) vr[i] = vbase[row(cur) * kv_dim];
  }

  float m_run = -INFINITY, l_run = 0.f, acc = 0.f;
  for (int c0 = start; c0 < end; c0 += SUB) {
    if (c0 != start) {
      // (The previous sub-chunk's last barrier passed: nobody reads the staged entries now.)
      if constexpr (MODE == kTable)
        if (past(c0)) stage(c0 >> page_shift);
      load_kv(c0, -1);
    }
    const int t = c0 + pp;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < KN; ++i) {
      if constexpr (KH) {
        const float2 f = __half22float2(kreg[i]);
        s += qr[2 * i] * f.x + qr[2 * i + 1] * f.y;
      } else {
        s += qr[i] * kreg[i];
      }
    }
#pragma unroll
    for (int o = 1; o < kTpp; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (j == 0) sscore[pp] = t < end ? s * scale : -INFINITY;
    __syncthreads();
    // Every warp redoes the (tiny) softmax bookkeeping over the sub-chunk's scores; each thread
    // then recomputes the p's it needs (no second barrier). Scores past the end are -inf: p = 0.
    float m_c = -INFINITY;
#pragma unroll
    for (int k = 0; k < SUB / 32; ++k) m_c = fmaxf(m_c, sscore[lane + 32 * k]);
    const float m_new = fmaxf(m_run, warp_max(m_c));
    const float corr = exp2f(m_run - m_new);
    float lsum = 0.f;
#pragma unroll
    for (int k = 0; k < SUB / 32; ++k) lsum += exp2f(sscore[lane + 32 * k] - m_new);
    l_run = l_run * corr + warp_sum(lsum);
    acc *= corr;
#pragma unroll
    for (int i = 0; i < PPT; ++i) acc += exp2f(sscore[g + G * i] - m_new) * to_f32(vr[i]);
    m_run = m_new;
    __syncthreads();  // sscore is rewritten by the next sub-chunk
  }
  sacc[tid] = acc;
  __syncthreads();
  float total = 0.f;
  if (tid < HD) {
#pragma unroll
    for (int k = 0; k < G; ++k) total += sacc[k * HD + tid];
  }

  float o = 0.f;  // this thread's (tid < HD) final output of head h
  if (n_split == 1) {
    o = total / l_run;
  } else {
    float* part = partials + ((size_t)h * n_splits_max + split) * (HD + 2);
    if (tid < HD) part[2 + tid] = total;
    if (tid == 0) {
      part[0] = m_run;
      part[1] = l_run;
    }
    __threadfence();  // partials visible device-wide before the counter says so
    __syncthreads();
    if (tid == 0) last = atomicAdd(&counters[h], 1) == n_split - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (tid < HD) {
      float mm = -INFINITY, den = 0.f, num = 0.f;
      merge_partials<kAttnMaxSplits>(partials + (size_t)h * n_splits_max * (HD + 2), n_split,
                                     HD + 2, 0, 2 + tid, mm, den, num);
      o = num / den;
    }
    if (tid == 0) counters[h] = 0;  // ready for the next launch
  }
  if (tid < HD) out[h * HD + tid] = o;
}

// The position comes from the host copy that precedes the whole step or from the previous step's
// last kernel (argmax hand-off), complete before this step's first kernel passes its wait; so do
// a paged pool's consecutive-pages flag and table (host-staged): all are read first, together,
// before the PDL wait. Cached K/V rows before the position were written by earlier steps and may
// be read before the wait too; only q and the current position's K/V row come from the previous
// kernel. PAGED: a block table (the row mode picked per launch from *consec), else kFlat.
template <int HD, bool PAGED, typename E>
__global__ void __launch_bounds__(kThreads)
    attention_decode_kernel(float* out, const float* q, const E* k_cache, const E* v_cache,
                            const int* pos_ptr, int n_heads, int n_kv_heads, int n_splits_max,
                            float* partials, int* counters, const int* tables, const int* seq,
                            const int* consec, int stride, int page, int window, float scale_arg,
                            int ring) {
  __shared__ float sscore[attn_sub(HD)];
  __shared__ float sacc[kThreads];
  __shared__ int last, stab[kAttnTabMax];
  const int n_pos = *pos_ptr + 1;
  // A table given directly: this thread's entry of its start, loaded with pos.
  int entry = 0;
  if (PAGED && !seq && threadIdx.x < min(stride, kAttnTabMax)) entry = tables[threadIdx.x];
  auto block = [&](auto mode, size_t base) {
    decode_block<HD, decltype(mode)::value, E>(out, q, k_cache, v_cache, n_pos, base, n_heads,
                                               n_kv_heads, n_splits_max, partials, counters, tables,
                                               seq, stride, page, window, scale_arg, ring, entry,
                                               sscore, sacc, last, stab);
  };
  if constexpr (PAGED) {
    const bool run = consec && *consec != 0;
    const size_t base =
        consec ? (size_t)tables[seq ? (size_t)*seq * stride : 0] << (__ffs(page) - 1) : 0;
    if (run)
      block(std::integral_constant<int, kRun>{}, base);
    else
      block(std::integral_constant<int, kTable>{}, 0);
  } else {
    block(std::integral_constant<int, kFlat>{}, 0);
  }
}

template <int HD>
void launch_hd(float* out, const float* q, const void* k, const void* v, const int* pos, int n_ctx,
               int n_heads, int n_kv_heads, const AttnScratch& sc, const AttnPages& pg,
               const Launch& s, int window, float scale, int ring) {
  const int splits = attn_splits(n_ctx, HD);
  auto go = [&](auto kern, auto* kc, auto* vc) {
    launch_kernel(kern, dim3(n_heads, splits), dim3(kThreads), 0, s, out, q, kc, vc, pos, n_heads,
                  n_kv_heads, splits, sc.partials, sc.counters, pg.tables, pg.seq, pg.consecutive,
                  pg.stride, pg.page, window, scale, ring);
  };
  const auto* kh = static_cast<const __half*>(k);
  const auto* vh = static_cast<const __half*>(v);
  const auto* kf = static_cast<const float*>(k);
  const auto* vf = static_cast<const float*>(v);
  if (!pg.tables) return go(attention_decode_kernel<HD, false, float>, kf, vf);
  if (pg.half) return go(attention_decode_kernel<HD, true, __half>, kh, vh);
  go(attention_decode_kernel<HD, true, float>, kf, vf);
}

}  // namespace

void attention_decode(float* out, const float* q, const void* k_cache, const void* v_cache,
                      const int* pos, int n_ctx, int n_heads, int n_kv_heads, int head_dim,
                      const AttnScratch& scratch, const Launch& s, const AttnPages& pages,
                      int window, float scale, int ring) {
  if (pages.tables && (!is_pow2(pages.page) || pages.stride <= 0))
    fail(
        "attention_decode: a block table needs its stride and a page size that is a power of two "
        "(got ",
        pages.page, ")");
  if ((pages.half || pages.consecutive) && !pages.tables)
    fail("attention_decode: fp16 caches and consecutive pages are a paged pool's only");
  if (!out || !q || !k_cache || !v_cache || !pos || !scratch.partials || !scratch.counters) {
    fail("attention_decode: null pointer");
  }
  if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || n_ctx <= 0 || window < 0) {
    fail("attention_decode: n_heads ", n_heads, " / n_kv_heads ", n_kv_heads, " / n_ctx ", n_ctx,
         " / window ", window);
  }
  if (ring < 0 || (ring > 0 && (pages.tables || window <= 0 || ring <= window))) {
    fail("attention_decode: ring ", ring, " needs a window below it (", window,
         ") and no block table");
  }
  auto go = [&](auto hd) {
    launch_hd<decltype(hd)::value>(out, q, k_cache, v_cache, pos, n_ctx, n_heads, n_kv_heads,
                                   scratch, pages, s, window, scale, ring);
  };
  switch (head_dim) {
    case 4:
      return go(std::integral_constant<int, 4>{});
    case 8:
      return go(std::integral_constant<int, 8>{});
    case 16:
      return go(std::integral_constant<int, 16>{});
    case 32:
      return go(std::integral_constant<int, 32>{});
    case 64:
      return go(std::integral_constant<int, 64>{});
    case 128:
      return go(std::integral_constant<int, 128>{});
    case 256:
      return go(std::integral_constant<int, 256>{});
    default:
      fail("attention_decode: head_dim ", head_dim,
           " is not supported by the CUDA kernel (4, 8, 16, 32, 64, 128 or 256)");
  }
}

}  // namespace smolrt::cuda
