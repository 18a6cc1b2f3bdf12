// Paged multi-sequence attention (see attention_paged.h).
#include "cuda/attention_paged.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

constexpr int kTile = 32;      // positions per warp tile (one per lane when scoring)
constexpr int kWarps = 4;      // warps per block, one tile each at a time
constexpr int kWideWarps = 8;  // the wide build's (see launch_t)

// K tile rows in shared memory: the pool's element type, padded by 16 bytes per row so the
// lanes' row reads (lane = position) hit distinct banks.
template <int HD, bool HALF>
constexpr int k_ld() {
  return HALF ? HD + 8 : HD + 4;
}
template <int HD, bool HALF, int W = kWarps>
constexpr size_t smem_bytes() {
  return (HALF ? 2 : 4) * size_t(W) * kTile * k_ld<HD, HALF>();
}

// One block per (row, KV head, split); see attention_paged.h. The body of the builds below, with
// W warps per block.
template <int HD, int G, bool HALF, int W = kWarps>
__device__ __forceinline__ void attention_paged_body(const PagedAttnArgs& a, float* partials,
                                                     int* counters) {
  using E = typename std::conditional<HALF, __half, float>::type;
  constexpr int DPL = HD >= 32 ? HD / 32 : 1;              // output dims per lane
  constexpr int LD = k_ld<HD, HALF>();                     // K tile row pitch (elements)
  constexpr int EPC = 16 / sizeof(E);                      // elements per 16-byte chunk
  constexpr int CPR = HD / EPC;                            // chunks per K row
  constexpr int VR = 64 / DPL < kTile ? 64 / DPL : kTile;  // V rows loaded together
  extern __shared__ float4 smem4[];
  __shared__ float sq[G][HD];
  __shared__ float sp[W][G][kTile];
  __shared__ float sm[W][G], sl[W][G];
  __shared__ float sacc[W][G][HD];
  __shared__ int last;
  const int row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  E* kt = reinterpret_cast<E*>(smem4) + warp * kTile * LD;

  // Before the PDL wait: what the host staged for the step (positions, block tables) and the K/V
  // rows of earlier steps, positions below row_first_new[row]; q and this step's rows (written by
  // the QKV GEMM) after it. So the table lookups and most of the first tile's loads overlap the
  // previous kernel's tail instead of trailing its completion.
  const int n_pos = a.row_pos[row] + 1;
  const int fresh = a.row_first_new ? a.row_first_new[row] : 0;
  // Keys [lo, n_pos): the whole context or the sliding window's last `window` positions; tiles
  // are counted from the one holding lo (its positions before lo are masked like those past
  // the context).
  const int lo = a.window > 0 && n_pos > a.window ? n_pos - a.window : 0;
  const int tile0 = lo / kTile;
  const int tiles = (n_pos + kTile - 1) / kTile - tile0;
  const int per = max(W, (tiles + (int)gridDim.z - 1) / (int)gridDim.z);
  const int n_split = (tiles + per - 1) / per;
  if (split >= n_split) {
    detail::pdl_wait();  // every block waits, so completion stays transitive along the chain
    return;
  }
  const int tile_end = min(tiles, (split + 1) * per);
  const int* table = a.tables + (size_t)a.row_seq[row] * a.table_stride;
  const size_t kv_dim = (size_t)a.n_kv_heads * HD;
  const int ps = __ffs(a.page_size) - 1;  // a power of two (checked by the host)
  auto slot_of = [&](int t) {
    return t < lo || t >= n_pos ? -1 : (table[t >> ps] << ps) + (t & (a.page_size - 1));
  };
  // A tile's K rows into shared memory (cp.async, coalesced 16-byte chunks): which 0 = every row;
  // 1 = the rows readable before the wait (earlier steps' positions, and rows outside the
  // context: zeros); 2 = the others.
  auto load_k = [&](int t0, int slot, int which) {
#pragma unroll
    for (int k = 0; k < (kTile * CPR + 31) / 32; ++k) {
      const int c = lane + 32 * k, r = c / CPR, e = (c % CPR) * EPC;
      const int s = __shfl_sync(0xffffffffu, slot, r & 31);
      const bool early = s < 0 || t0 + r < fresh;
      if (c < kTile * CPR && (which == 0 || (which == 1) == early)) {
        const E* src =
            reinterpret_cast<const E*>(a.k_pool) + (size_t)max(s, 0) * kv_dim + kvh * HD + e;
        cp_async16(kt + r * LD + e, src, s >= 0 ? 16 : 0);
      }
    }
  };
  // V rows [j0, j0 + VR) straight into registers, lane = dimension (coalesced). Kept in the
  // pool's type and converted where used, so all of them are in flight before the first
  // conversion waits on one. (Loading them before the wait too took the fp16 kernel from 96 to
  // 128 registers.)
  E vv[VR][DPL];
  auto load_v = [&](int slot, int j0) {
#pragma unroll
    for (int jj = 0; jj < VR; ++jj) {
      const int sj = __shfl_sync(0xffffffffu, slot, (j0 + jj) & 31);
      const size_t vo = (size_t)sj * kv_dim + kvh * HD;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        vv[jj][i] = sj >= 0 && d < HD ? reinterpret_cast<const E*>(a.v_pool)[vo + d] : E{};
      }
    }
  };
  const int first = split * per + warp;  // this warp's first tile (none when >= tile_end)
  int t0 = (tile0 + first) * kTile;
  int slot = first < tile_end ? slot_of(t0 + lane) : -1;
  if (first < tile_end) load_k(t0, slot, 1);  // warp-uniform

  detail::pdl_wait();  // q and this step's K/V rows come from the QKV GEMM
  detail::pdl_trigger();
  if (first < tile_end) {  // the first tile's other loads, in flight during q's
    load_k(t0, slot, 2);
    load_v(slot, 0);
  }
  const float scale = a.scale > 0.f ? a.scale : rsqrtf((float)HD);
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
    sq[i / HD][i % HD] = a.q[(size_t)row * a.ldq + (kvh * G + i / HD) * HD + i % HD] * scale;
  __syncthreads();

  float m_run[G], l_run[G], acc[G][DPL];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m_run[g] = -INFINITY, l_run[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[g][i] = 0.f;
  }
  for (int tile = first; tile < tile_end; tile += W) {
    if (tile != first) {
      t0 = (tile0 + tile) * kTile;
      slot = slot_of(t0 + lane);
      load_k(t0, slot, 0);
      load_v(slot, 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
    // Scores: lane = position, its K row read once for every head of the group.
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.f;
#pragma unroll
    for (int i = 0; i < HD; i += EPC) {
      float k[EPC];
      const uint4 u = *reinterpret_cast<const uint4*>(kt + lane * LD + i);
      if constexpr (HALF) {
        const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __half22float2(h[e]);
          k[2 * e] = f.x, k[2 * e + 1] = f.y;
        }
      } else {
        const float* f = reinterpret_cast<const float*>(&u);
#pragma unroll
        for (int e = 0; e < 4; ++e) k[e] = f[e];
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int e = 0; e < EPC; ++e) s[g] += sq[g][i + e] * k[e];
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float sg = slot >= 0 ? s[g] : -INFINITY;
      // finite: every tile holds a position of [lo, n_pos)
      const float m_new = fmaxf(m_run[g], warp_max(sg));
      const float corr = expf(m_run[g] - m_new);
      const float p = slot >= 0 ? expf(sg - m_new) : 0.f;
      l_run[g] = l_run[g] * corr + warp_sum(p);
      m_run[g] = m_new;
      sp[warp][g][lane] = p;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[g][i] *= corr;
    }
    __syncwarp();
    // P·V: lane = output dimension; rows past the context have p = 0 and v = 0.
    const int nv = min(kTile, n_pos - t0);
    for (int j0 = 0; j0 < nv; j0 += VR) {
      if (j0 > 0) load_v(slot, j0);
#pragma unroll
      for (int jj = 0; jj < VR; ++jj) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float p = sp[warp][g][(j0 + jj) & 31];
#pragma unroll
          for (int i = 0; i < DPL; ++i) acc[g][i] += p * to_f32(vv[jj][i]);
        }
      }
    }
    __syncwarp();  // the K tile and sp are rewritten by the next tile
  }
  // This block's state: the warps' states combined (a warp without a tile has m = -inf: weight 0).
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) sm[warp][g] = m_run[g], sl[warp][g] = l_run[g];
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < DPL; ++i)
      if (lane + 32 * i < HD) sacc[warp][g][lane + 32 * i] = acc[g][i];
  }
  __syncthreads();
  const int h0 = kvh * G;
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    const int g = i / HD, d = i % HD;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) mm = fmaxf(mm, sm[w][g]);
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float wt = sm[w][g] == -INFINITY ? 0.f : expf(sm[w][g] - mm);
      den += wt * sl[w][g];
      num += wt * sacc[w][g][d];
    }
    if (n_split == 1) {
      a.out[(size_t)row * a.ldo + (h0 + g) * HD + d] = num / den;
    } else {
      float* part =
          partials + (((size_t)row * a.n_heads + h0 + g) * kAttnPagedSplits + split) * (HD + 2);
      part[2 + d] = num;
      if (d == 0) part[0] = mm, part[1] = den;
    }
  }
  if (n_split == 1) return;
  // The last block of this (row, KV head) to finish combines the splits' partials.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* cnt = counters + (size_t)row * a.n_kv_heads + kvh;
    last = atomicAdd(cnt, 1) == n_split - 1;
    if (last) *cnt = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    const int g = i / HD, d = i % HD;
    const float* ph = partials + ((size_t)row * a.n_heads + h0 + g) * kAttnPagedSplits * (HD + 2);
    float mm = -INFINITY;
    for (int sp_ = 0; sp_ < n_split; ++sp_) mm = fmaxf(mm, __ldcg(ph + sp_ * (HD + 2)));
    float num = 0.f, den = 0.f;
    for (int sp_ = 0; sp_ < n_split; ++sp_) {
      const float w = expf(__ldcg(ph + sp_ * (HD + 2)) - mm);
      den += w * __ldcg(ph + sp_ * (HD + 2) + 1);
      num += w * __ldcg(ph + sp_ * (HD + 2) + 2 + d);
    }
    a.out[(size_t)row * a.ldo + (h0 + g) * HD + d] = num / den;
  }
}

// The latency build: no minimum of blocks per SM (ptxas takes 96 registers for the fp16 kernel at
// head_dim 64; declaring a minimum of 1 made it take 160).
template <int HD, int G, bool HALF>
__global__ void __launch_bounds__(32 * kWarps)
    attention_paged_kernel(const PagedAttnArgs a, float* partials, int* counters) {
  attention_paged_body<HD, G, HALF>(a, partials, counters);
}

// The occupancy build: 6 blocks per SM (80 registers), for grids past one resident wave of the
// latency build. Measured on an H100 (synth SmolLM-135M, fp16 pool, 256 sequences: 768 blocks,
// 660 resident at 5 per SM): see launch_t. Only where shared memory lets 6 blocks in (head_dim
// <= 64) and for the fp16 pool (the fp32 pool's 6-per-SM build lost: 3.18 vs 2.82 ms per step).
template <int HD, bool HALF>
constexpr bool kOccBuild = (HALF && HD <= 64);
template <int HD, int G, bool HALF>
__global__ void __launch_bounds__(32 * kWarps, kAttnPagedWavePerSm)
    attention_paged_occ_kernel(const PagedAttnArgs a, float* partials, int* counters) {
  static_assert(kOccBuild<HD, HALF>, "instantiated only where launch_t may take it");
  attention_paged_body<HD, G, HALF>(a, partials, counters);
}

// The wide build: 8 warps per block with half the splits, for steps whose grid then fits one
// resident wave of it (2 blocks per SM at 128 registers for SmolLM's heads): a split's tiles
// (up to 8) are then one per warp of one block, and a context of up to 8 tiles needs no split
// combine (the partials' fence, counter and second pass). Measured on an H200 (run z60, synth
// SmolLM-135M, 100-token prompts + 128 decode steps, bench-batch, ms per step; every launch on
// the wide build): 8 sequences 0.787 -> 0.716, 64 sequences 1.088 -> 1.025; past one wave of it
// it lost (128 sequences 1.372 -> 1.456, 256 1.979 -> 2.238, 64 sequences of 400-token prompts
// 1.255 -> 1.42, prefill 250k -> 200k tok/s), so it runs only within one wave. Only where its
// static shared memory (W x G x head_dim partial accumulators) stays small.
template <int HD, int G>
constexpr bool kWideBuild = (G * HD <= 512);
template <int HD, int G, bool HALF>
__global__ void __launch_bounds__(32 * kWideWarps)
    attention_paged_wide_kernel(const PagedAttnArgs a, float* partials, int* counters) {
  static_assert(kWideBuild<HD, G>, "instantiated only where launch_t may take it");
  attention_paged_body<HD, G, HALF, kWideWarps>(a, partials, counters);
}

// Blocks of a build resident at once on the whole GPU (one wave).
template <typename K>
long wave_of(K kern, int threads, int smem) {
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem));
  return (long)std::max(per_sm, 1) * sm_count();
}

template <int HD, int G, bool HALF>
void launch_t(const PagedAttnArgs& a, cudaStream_t s) {
  auto* kern = attention_paged_kernel<HD, G, HALF>;
  constexpr int smem = (int)smem_bytes<HD, HALF>();
  constexpr int smem_wide = (int)smem_bytes<HD, HALF, kWideWarps>();
  // Once per instantiation: the kernels configured, and one resident wave of the latency build
  // (past it the occupancy build runs, where there is one) and of the wide build.
  struct Waves {
    long latency = 0, wide = 0;
  };
  static const Waves waves = [] {
    Waves w;
    configure_prefill_kernel(attention_paged_kernel<HD, G, HALF>, smem);
    w.latency = wave_of(attention_paged_kernel<HD, G, HALF>, 32 * kWarps, smem);
    if constexpr (kOccBuild<HD, HALF>)
      configure_prefill_kernel(attention_paged_occ_kernel<HD, G, HALF>, smem);
    if constexpr (kWideBuild<HD, G>) {
      configure_prefill_kernel(attention_paged_wide_kernel<HD, G, HALF>, smem_wide);
      w.wide = wave_of(attention_paged_wide_kernel<HD, G, HALF>, 32 * kWideWarps, smem_wide);
    }
    return w;
  }();
  const long pairs = (long)a.n * a.n_kv_heads;
  if constexpr (kWideBuild<HD, G>) {
    const int z = a.splits / 2;
    if (z >= 1 && pairs * z <= waves.wide)
      return launch_kernel_pdl(s != nullptr, attention_paged_wide_kernel<HD, G, HALF>,
                               dim3(a.n, a.n_kv_heads, z), dim3(32 * kWideWarps), smem_wide, s, a,
                               a.partials, a.counters);
  }
  if constexpr (kOccBuild<HD, HALF>) {
    if (pairs * a.splits > waves.latency) kern = attention_paged_occ_kernel<HD, G, HALF>;
  }
  launch_kernel_pdl(s != nullptr, kern, dim3(a.n, a.n_kv_heads, a.splits), dim3(32 * kWarps), smem,
                    s, a, a.partials, a.counters);
}

template <int HD, int G>
void launch_g(const PagedAttnArgs& a, cudaStream_t s) {
  if (a.kv_half) {
    launch_t<HD, G, true>(a, s);
  } else {
    launch_t<HD, G, false>(a, s);
  }
}

template <int HD>
void launch_hd(const PagedAttnArgs& a, cudaStream_t s) {
  switch (a.n_heads / a.n_kv_heads) {
    case 1:
      return launch_g<HD, 1>(a, s);
    case 2:
      return launch_g<HD, 2>(a, s);
    case 3:
      return launch_g<HD, 3>(a, s);
    case 4:
      return launch_g<HD, 4>(a, s);
    case 5:
      return launch_g<HD, 5>(a, s);
    case 6:
      return launch_g<HD, 6>(a, s);
    case 7:
      return launch_g<HD, 7>(a, s);
    case 8:
      return launch_g<HD, 8>(a, s);
  }
}

}  // namespace

bool attention_paged_supports(int head_dim, int group) {
  return (head_dim == 8 || head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 ||
          head_dim == 256) &&
         group >= 1 && group <= kAttnPagedMaxGroup;
}

int attn_paged_splits(int max_pos, int pairs, int sms) {
  const int tiles = max_pos / kTile + 1;  // of positions [0, max_pos]
  int z = 1;
  while (z < kAttnPagedSplits && z * kWarps < tiles) z *= 2;
  while (z > 1 && (long)pairs * z > (long)kAttnPagedWavePerSm * sms) z /= 2;
  return z;
}

void attention_paged(const PagedAttnArgs& a, cudaStream_t s) {
  if (!a.q || !a.k_pool || !a.v_pool || !a.out || !a.row_pos || !a.row_seq || !a.tables ||
      !a.partials || !a.counters)
    fail("attention_paged: null pointer");
  if (a.n <= 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 ||
      !is_pow2(a.page_size) || a.table_stride <= 0 || a.window < 0 || a.splits < 1 ||
      a.splits > kAttnPagedSplits)
    fail("attention_paged: bad shape (rows ", a.n, ", heads ", a.n_heads, "/", a.n_kv_heads,
         ", page size ", a.page_size, " (a power of two), splits ", a.splits, ")");
  if (!attention_paged_supports(a.head_dim, a.n_heads / a.n_kv_heads))
    fail("attention_paged: head_dim ", a.head_dim, " with ", a.n_heads / a.n_kv_heads,
         " query heads per KV head is not supported (head_dim 8..256, powers of two; at most ",
         kAttnPagedMaxGroup, " heads per KV head)");
  if (a.ldq < a.n_heads * a.head_dim || a.ldo < a.n_heads * a.head_dim)
    fail("attention_paged: ldq/ldo smaller than n_heads * head_dim");
  switch (a.head_dim) {
    case 8:
      return launch_hd<8>(a, s);
    case 16:
      return launch_hd<16>(a, s);
    case 32:
      return launch_hd<32>(a, s);
    case 64:
      return launch_hd<64>(a, s);
    case 128:
      return launch_hd<128>(a, s);
    case 256:
      return launch_hd<256>(a, s);
  }
}

}  // namespace smolrt::cuda
