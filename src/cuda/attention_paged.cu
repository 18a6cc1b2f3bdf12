// Paged multi-sequence attention (see attention_paged.h).
#include "cuda/attention_paged.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.cuh"
#include "cuda/launch.h"
#include "cuda/out_store.cuh"

namespace smolrt::cuda {
namespace {

constexpr int kTile = 32;      // positions per warp tile
constexpr int kWarps = 4;      // warps per block, one tile each at a time
constexpr int kWideWarps = 8;  // the wide build's (see launch_t)

// K and V tile rows in shared memory, fp16 whatever the pool's type, pitch head_dim + 8 halves:
// the 8 rows an mma fragment reads (32-bit K loads, ldmatrix on V) fall in distinct banks.
template <int HD>
constexpr int kPitch = HD + 8;
template <int HD, int W = kWarps>
constexpr size_t smem_bytes() {
  return size_t(W) * 2 * kTile * kPitch<HD> * 2;
}

// o += P V over one tile: P the A operand of each 16-key chunk (as the caller packed its rows), V
// the tile's rows in shared memory at pitch kPitch<HD> (ldmatrix .trans gives the B operand).
template <int HD>
__device__ __forceinline__ void pv_tile(float (&o)[HD / 8][4], const uint32_t (&pf)[kTile / 16][4],
                                        const __half* vt, int lane) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    const __half* vr = vt + (16 * kk + (lane & 15)) * kPitch<HD>;
    if constexpr (HD / 8 >= 2) {
#pragma unroll
      for (int dt = 0; dt < HD / 8; dt += 2) {
        // lanes 0-15: positions 16kk + (lane & 15) at columns 8dt; lanes 16-31: 8(dt+1)
        uint32_t b[4];
        ldmatrix_x4_trans(b, vr + (dt + (lane >> 4)) * 8);
        mma16816(o[dt], pf[kk], b[0], b[1]);
        mma16816(o[dt + 1], pf[kk], b[2], b[3]);
      }
    } else {
      uint32_t b[2];
      ldmatrix_x2_trans(b, vr);
      mma16816(o[0], pf[kk], b[0], b[1]);
    }
  }
}

// Folds the shared prefix's partials of (row, head h) (the shared pass's, over the row's
// first `skip` keys) into a softmax state of column d.
template <int HD>
__device__ __forceinline__ void fold_prefix(const PagedAttnArgs& a, int row, int h, int d, int skip,
                                            float& mm, float& den, float& num) {
  int per = 0;
  const int n = shared_splits(skip / kSharedTile, &per);
  merge_partials<kAttnSharedSplits>(
      a.shared.prefix + ((size_t)row * a.n_heads + h) * kAttnSharedSplits * (HD + 2), n, HD + 2, 0,
      2 + d, mm, den, num);
}

// Waits until the shared pass has written every split of (row, head h0 + g) for g < G: its
// blocks count each (row, head) pair they finish (attention_shared_body). Rows with a skip run in
// the launch that also holds the shared pass, in blocks indexed after all of its blocks; blocks
// are dispatched in index order (as CUB's single-pass scan also relies on), so the blocks waited
// for are resident or done and the wait ends. It leaves the counters zero for the next launch. A
// count that never arrives (a staging bug) traps instead of hanging the GPU.
template <int G>
__device__ __forceinline__ void wait_prefix(const PagedAttnArgs& a, int row, int h0, int skip) {
  if ((int)threadIdx.x < G) {
    int per = 0;
    const int want = shared_splits(skip / kSharedTile, &per);
    int* c = a.shared.counters + (size_t)row * a.n_heads + h0 + threadIdx.x;
    for (long spins = 0; ld_acquire(c) < want; ++spins) {
      if (spins == (1l << 24)) __trap();
      __nanosleep(64);
    }
    *c = 0;
  }
  __syncthreads();
  __threadfence();
}

// One block per (row, KV head, split); see attention_paged.h. The body of the builds below, with
// W warps per block. Tensor cores (mma.sync m16n8k16, fp16 operands, fp32 accumulators): the G
// query heads of the KV head are rows 0..G-1 of the A operand (the other rows zero), so a 32-
// position tile is 4 x head_dim/16 mma for the scores and head_dim/8 x 2 for P V, far fewer
// instructions than a SIMT form, which is issue-bound. The score fragments (C layout) are
// re-packed in registers as P's A operand.
// Scores run in base 2 (the query is pre-scaled by log2(e)); q, K, V and P are rounded to fp16.
// The block is (block row bx, KV head kvh, split) of a grid of n_z splits.
template <int HD, int G, bool HALF, int W = kWarps>
__device__ __forceinline__ void attention_paged_body(const PagedAttnArgs& a, float* partials,
                                                     int* counters, int bx, int kvh, int split,
                                                     int n_z) {
  constexpr int P = kPitch<HD>;
  constexpr int KC = HD >= 16 ? HD / 16 : 1;    // 16-wide k chunks of q K^T (head_dim 8: one,
                                                // its upper half zero)
  constexpr int DT = HD / 8;                    // 8-wide output column tiles of P V
  constexpr int NT = kTile / 8;                 // 8-position score tiles per tile
  constexpr int SPR = HD / 8;                   // 8-element slices per K/V row
  constexpr int SPL = (kTile * SPR + 31) / 32;  // slices per lane per tile
  static_assert(G <= 8, "the query heads of a KV head are rows 0..7 of the mma's 16");
  extern __shared__ float4 smem4[];
  __shared__ __align__(16) __half sq[G][HD];  // the group's queries, scaled by scale * log2(e)
  __shared__ float sm[W][G], sl[W][G];
  __shared__ int last;
  const int row = a.rows ? a.rows[bx] : bx;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  __half* kt = reinterpret_cast<__half*>(smem4) + (size_t)warp * 2 * kTile * P;
  __half* vt = kt + kTile * P;
  if (row < 0) {
    detail::pdl_wait();  // every block waits, so completion stays transitive along the chain
    return;
  }

  // Before the PDL wait: what the host staged for the step (positions, block tables) and the K/V
  // rows of earlier steps, positions below row_first_new[row]; q and this step's rows (written by
  // the QKV GEMM) after it. So the table lookups and most of the first tile's loads overlap the
  // previous kernel's tail instead of trailing its completion.
  const int n_pos = a.row_pos[row] + 1;
  const int fresh = a.row_first_new ? a.row_first_new[row] : 0;
  // Keys [lo, n_pos): the whole context or the sliding window's last `window` positions, past the
  // shared prefix's keys; tiles are counted from the one holding lo (its positions before lo are
  // masked like those past the context).
  const int skip = a.shared.row_skip ? a.shared.row_skip[row] : 0;
  const int lo = max(skip, a.window > 0 && n_pos > a.window ? n_pos - a.window : 0);
  const int tile0 = lo / kTile;
  const int tiles = (n_pos + kTile - 1) / kTile - tile0;
  const int per = max(W, (tiles + n_z - 1) / n_z);
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
  // A tile's K and V rows into shared memory as fp16, 8 elements per copy (rows outside the
  // context: zeros). which: 0 = every row; 1 = the rows readable before the wait (earlier steps'
  // positions, and rows outside the context); 2 = the others. fp16 pool: cp.async; fp32 pool:
  // through registers, rounded on the store.
  auto load_kv = [&](int t0, int slot, int which) {
#pragma unroll
    for (int k = 0; k < SPL; ++k) {
      const int c = lane + 32 * k, r = c / SPR, e = (c % SPR) * 8;
      const int s = __shfl_sync(0xffffffffu, slot, r & 31);
      const bool early = s < 0 || t0 + r < fresh;
      if (c < kTile * SPR && (which == 0 || (which == 1) == early)) {
        const size_t off = (size_t)max(s, 0) * kv_dim + kvh * HD + e;
        if constexpr (HALF) {
          cp_async16(kt + r * P + e, static_cast<const __half*>(a.k_pool) + off, s >= 0 ? 16 : 0);
          cp_async16(vt + r * P + e, static_cast<const __half*>(a.v_pool) + off, s >= 0 ? 16 : 0);
        } else {
          uint4 hk = make_uint4(0u, 0u, 0u, 0u), hv = hk;
          if (s >= 0) {
            const float4* kp =
                reinterpret_cast<const float4*>(static_cast<const float*>(a.k_pool) + off);
            const float4* vp =
                reinterpret_cast<const float4*>(static_cast<const float*>(a.v_pool) + off);
            const float4 k0 = kp[0], k1 = kp[1], v0 = vp[0], v1 = vp[1];
            hk = make_uint4(pack_half2(k0.x, k0.y), pack_half2(k0.z, k0.w), pack_half2(k1.x, k1.y),
                            pack_half2(k1.z, k1.w));
            hv = make_uint4(pack_half2(v0.x, v0.y), pack_half2(v0.z, v0.w), pack_half2(v1.x, v1.y),
                            pack_half2(v1.z, v1.w));
          }
          *reinterpret_cast<uint4*>(kt + r * P + e) = hk;
          *reinterpret_cast<uint4*>(vt + r * P + e) = hv;
        }
      }
    }
  };
  const int first = split * per + warp;  // this warp's first tile (none when >= tile_end)
  int t0 = (tile0 + first) * kTile;
  int slot = first < tile_end ? slot_of(t0 + lane) : -1;
  if (first < tile_end) load_kv(t0, slot, 1);  // warp-uniform

  detail::pdl_wait();  // q and this step's K/V rows come from the QKV GEMM
  detail::pdl_trigger();
  if (first < tile_end) load_kv(t0, slot, 2);  // in flight during q's loads
  const float qscale = (a.scale > 0.f ? a.scale : rsqrtf((float)HD)) * 1.4426950408889634f;
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
    sq[i / HD][i % HD] =
        __float2half_rn(a.q[(size_t)row * a.ldq + (kvh * G + i / HD) * HD + i % HD] * qscale);
  __syncthreads();
  // This lane's A fragments of the queries: row g (head kvh*G + g), columns 2t4.. and 2t4+8..
  // of each 16-wide chunk; rows g+8 and g >= G are zero.
  uint32_t qf[KC][2];
#pragma unroll
  for (int c = 0; c < KC; ++c) {
    qf[c][0] = g < G ? *reinterpret_cast<const uint32_t*>(&sq[g < G ? g : 0][16 * c + 2 * t4]) : 0u;
    qf[c][1] = 0u;
    if constexpr (HD >= 16)
      qf[c][1] =
          g < G ? *reinterpret_cast<const uint32_t*>(&sq[g < G ? g : 0][16 * c + 2 * t4 + 8]) : 0u;
  }

  float m_run = -INFINITY, l_run = 0.f;  // row g: running max (a quad's lanes agree), this
                                         // lane's part of the running sum
  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  for (int tile = first; tile < tile_end; tile += W) {
    if (tile != first) {
      t0 = (tile0 + tile) * kTile;
      slot = slot_of(t0 + lane);
      load_kv(t0, slot, 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
    // Scores: s[j] holds row g at positions t0 + 8j + 2t4 (+1).
    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      const uint32_t af[4] = {qf[c][0], 0u, qf[c][1], 0u};
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const __half* kr = kt + (8 * j + g) * P + 16 * c + 2 * t4;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr);
        const uint32_t b1 = HD >= 16 ? *reinterpret_cast<const uint32_t*>(kr + 8) : 0u;
        mma16816(s[j], af, b0, b1);
      }
    }
    float mt = -INFINITY;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int p = t0 + 8 * j + 2 * t4 + e;
        if (p < lo || p >= n_pos) s[j][e] = -INFINITY;
        mt = fmaxf(mt, s[j][e]);
      }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float m_new = fmaxf(m_run, mt);  // finite: every tile holds a position of [lo, n_pos)
    const float al = exp2f(m_run - m_new);
    m_run = m_new;
    l_run *= al;
#pragma unroll
    for (int i = 0; i < DT; ++i) o[i][0] *= al, o[i][1] *= al;
    uint32_t pf[NT / 2][4];  // P as the A operand of P V: 16-position chunks, rows g+8 zero
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float p0 = exp2f(s[j][0] - m_new), p1 = exp2f(s[j][1] - m_new);
      l_run += p0 + p1;
      pf[j >> 1][(j & 1) * 2] = pack_half2(p0, p1);
      pf[j >> 1][(j & 1) * 2 + 1] = 0u;
    }
    pv_tile<HD>(o, pf, vt, lane);
    __syncwarp();  // the tiles are rewritten by the next one
  }
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  // This block's state: the warps' states combined (a warp without a tile has m = -inf: weight
  // 0). The tiles are dead after the barrier: their shared memory holds the warps' outputs.
  __syncthreads();
  float* sacc = reinterpret_cast<float*>(smem4);  // [W][G][HD]
  if (g < G) {
    if (t4 == 0) sm[warp][g] = m_run, sl[warp][g] = l_run;
#pragma unroll
    for (int i = 0; i < DT; ++i)
      *reinterpret_cast<float2*>(&sacc[(warp * G + g) * HD + 8 * i + 2 * t4]) =
          make_float2(o[i][0], o[i][1]);
  }
  __syncthreads();
  const int h0 = kvh * G;
  if (n_split == 1 && skip > 0) wait_prefix<G>(a, row, h0, skip);
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    const int g = i / HD, d = i % HD;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) mm = fmaxf(mm, sm[w][g]);
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float wt = sm[w][g] == -INFINITY ? 0.f : exp2f(sm[w][g] - mm);
      den += wt * sl[w][g];
      num += wt * sacc[(w * G + g) * HD + d];
    }
    if (n_split == 1) {
      if (skip > 0) fold_prefix<HD>(a, row, h0 + g, d, skip, mm, den, num);
      store_out(a.out, a.out_h, (size_t)row * a.ldo + (h0 + g) * HD + d, num / den);
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
  if (skip > 0) wait_prefix<G>(a, row, h0, skip);
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    const int g = i / HD, d = i % HD;
    float mm = -INFINITY, num = 0.f, den = 0.f;
    merge_partials<kAttnPagedSplits>(
        partials + ((size_t)row * a.n_heads + h0 + g) * kAttnPagedSplits * (HD + 2), n_split,
        HD + 2, 0, 2 + d, mm, den, num);
    if (skip > 0) fold_prefix<HD>(a, row, h0 + g, d, skip, mm, den, num);
    store_out(a.out, a.out_h, (size_t)row * a.ldo + (h0 + g) * HD + d, num / den);
  }
}

// The latency build: 4 warps, no minimum of blocks per SM (~120 registers at head_dim 64: 4
// blocks per SM; its 37 KB of shared memory would allow 6).
template <int HD, int G, bool HALF>
__global__ void __launch_bounds__(32 * kWarps)
    attention_paged_kernel(const PagedAttnArgs a, float* partials, int* counters) {
  attention_paged_body<HD, G, HALF>(a, partials, counters, blockIdx.x, blockIdx.y, blockIdx.z,
                                    gridDim.z);
}

// The narrow build: 2 warps per block, for grids past one resident wave of the latency build
// (e.g. 256 sequences x 3 KV heads = 768 blocks, of which 528 are resident at 4 per SM on 132
// SMs): more, smaller blocks fit per SM, so the grid needs fewer waves (most of all for
// head_dim 256, where the latency build fits one block per SM).
constexpr int kNarrowWarps = 2;
template <int HD, int G, bool HALF>
__global__ void __launch_bounds__(32 * kNarrowWarps)
    attention_paged_narrow_kernel(const PagedAttnArgs a, float* partials, int* counters) {
  attention_paged_body<HD, G, HALF, kNarrowWarps>(a, partials, counters, blockIdx.x, blockIdx.y,
                                                  blockIdx.z, gridDim.z);
}

// The wide build: 8 warps per block with half the splits, for steps whose grid then fits one
// resident wave of it (2 blocks per SM at 128 registers for SmolLM's heads): a split's tiles
// (up to 8) are then one per warp of one block, and a context of up to 8 tiles needs no split
// combine (the partials' fence, counter and second pass). Past one wave it is slower than the
// other builds, so it runs only within one wave. Only for the head shapes it was tuned on
// (G x head_dim <= 512) and where its 8 warps' K/V
// tiles fit a block's shared memory (not from head_dim 256 on: gemma3-4b's 2 heads per KV head).
template <int HD, int G>
constexpr bool kWideBuild = (G * HD <= 512) &&
                            (smem_bytes<HD, kWideWarps>() <= (size_t)kMaxBlockSmem);
template <int HD, int G, bool HALF>
__global__ void __launch_bounds__(32 * kWideWarps)
    attention_paged_wide_kernel(const PagedAttnArgs a, float* partials, int* counters) {
  static_assert(kWideBuild<HD, G>, "instantiated only where launch_t may take it");
  attention_paged_body<HD, G, HALF, kWideWarps>(a, partials, counters, blockIdx.x, blockIdx.y,
                                                blockIdx.z, gridDim.z);
}

// Cascade attention's shared pass (see attention_paged.h): one block per (query block, KV head,
// split). The block's 4 warps take 16 query rows each (row r of the group: member r / G, query head
// kvh * G + r % G) as the full 16 rows of the mma, against each 32-key tile of the split, staged
// for all of them in shared memory, kSharedStages tiles in flight: a split of up to that many
// tiles (a 1,024-key prefix in 8 splits) is wholly copied before the PDL wait, during the QKV
// GEMM. The shared keys all precede every member's position and come in whole tiles: no mask.
constexpr int kSharedWarps = kSharedQueryRows / 16;
constexpr int kSharedStages = 4;
static_assert(kTile == kSharedTile, "a row's skip is a whole number of attention_paged tiles");
template <int HD>
constexpr size_t shared_smem_bytes() {
  return size_t(kSharedStages) * 2 * kTile * kPitch<HD> * 2;  // K and V tiles, fp16
}

template <int HD, int G, bool HALF>
__device__ __forceinline__ void attention_shared_body(const PagedAttnArgs& a, int slot, int kvh,
                                                      int split) {
  constexpr int P = kPitch<HD>;
  constexpr int KC = HD >= 16 ? HD / 16 : 1;  // 16-wide k chunks (head_dim 8: its upper half zero)
  constexpr int DT = HD / 8;
  constexpr int NT = kTile / 8;
  constexpr int SPR = HD / 8;  // 8-element slices per K/V row
  constexpr int T = 32 * kSharedWarps;
  constexpr int SPT = (kTile * SPR + T - 1) / T;  // slices per thread per tile
  extern __shared__ float4 smem4[];
  __half* const stage0 = reinterpret_cast<__half*>(smem4);  // [stages][K tile, V tile][kTile][P]
  if (slot >= a.shared.blocks[0]) {
    detail::pdl_wait();  // every block waits, so completion stays transitive along the chain
    return;
  }
  const int e = a.shared.blocks[1 + slot];
  const int* grp = a.shared.groups + (e >> 16) * kSharedGroupInts;
  const int keys = grp[1], m0 = grp[2], n_members = grp[3];
  int per = 0;
  const int n_split = shared_splits(keys / kTile, &per);
  if (split >= n_split) {
    detail::pdl_wait();
    return;
  }
  const int t_begin = split * per, t_end = min(keys / kTile, t_begin + per);
  const int* table = a.tables + (size_t)grp[0] * a.table_stride;
  const size_t kv_dim = (size_t)a.n_kv_heads * HD;
  const int ps = __ffs(a.page_size) - 1;
  // Tile t of the split's keys into stage st, by all the block's threads.
  auto load = [&](int t, int st) {
    __half* kt = stage0 + (size_t)st * 2 * kTile * P;
    __half* vt = kt + kTile * P;
#pragma unroll
    for (int k = 0; k < SPT; ++k) {
      const int c = threadIdx.x + T * k;
      if (c >= kTile * SPR) break;
      const int r = c / SPR, el = (c % SPR) * 8, key = t * kTile + r;
      const size_t off =
          (size_t)((table[key >> ps] << ps) + (key & (a.page_size - 1))) * kv_dim + kvh * HD + el;
      if constexpr (HALF) {
        cp_async16(kt + r * P + el, static_cast<const __half*>(a.k_pool) + off, 16);
        cp_async16(vt + r * P + el, static_cast<const __half*>(a.v_pool) + off, 16);
      } else {
        const float4* kp =
            reinterpret_cast<const float4*>(static_cast<const float*>(a.k_pool) + off);
        const float4* vp =
            reinterpret_cast<const float4*>(static_cast<const float*>(a.v_pool) + off);
        const float4 k0 = kp[0], k1 = kp[1], v0 = vp[0], v1 = vp[1];
        *reinterpret_cast<uint4*>(kt + r * P + el) =
            make_uint4(pack_half2(k0.x, k0.y), pack_half2(k0.z, k0.w), pack_half2(k1.x, k1.y),
                       pack_half2(k1.z, k1.w));
        *reinterpret_cast<uint4*>(vt + r * P + el) =
            make_uint4(pack_half2(v0.x, v0.y), pack_half2(v0.z, v0.w), pack_half2(v1.x, v1.y),
                       pack_half2(v1.z, v1.w));
      }
    }
  };
  // The first stages' tiles (written by earlier steps) before the wait; one copy group per stage,
  // empty past the split's end, so the wait below counts groups alike everywhere.
#pragma unroll
  for (int i = 0; i < kSharedStages; ++i) {
    if (t_begin + i < t_end) load(t_begin + i, i);
    cp_async_commit();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  const int qr = (e & 0xffff) * kSharedQueryRows + warp * 16;  // the warp's first query row
  const bool active = qr < n_members * G;                      // warp-uniform
  // The warp's rows g and g + 8: their q row (-1: past the group; the host's staging, read
  // before the wait) and query head.
  int qrow[2], head[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = qr + g + 8 * i;
    qrow[i] = r < n_members * G ? a.shared.members[m0 + r / G] : -1;
    head[i] = kvh * G + r % G;
  }
  detail::pdl_wait();  // q comes from the QKV GEMM
  detail::pdl_trigger();
  // A fragments of q, scaled by scale * log2(e): {row g, row g+8} x {columns 2t4.., 2t4+8..} of
  // each 16-wide chunk.
  const float qscale = (a.scale > 0.f ? a.scale : rsqrtf((float)HD)) * 1.4426950408889634f;
  uint32_t qf[KC][4];
#pragma unroll
  for (int c = 0; c < KC; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = j & 1, col = 16 * c + 2 * t4 + (j >> 1) * 8;
      qf[c][j] = 0u;
      if (qrow[i] >= 0 && col < HD) {
        const float2 v = *reinterpret_cast<const float2*>(a.q + (size_t)qrow[i] * a.ldq +
                                                          (size_t)head[i] * HD + col);
        qf[c][j] = pack_half2(v.x * qscale, v.y * qscale);
      }
    }

  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  for (int t = t_begin; t < t_end; ++t) {
    const int st = (t - t_begin) % kSharedStages;
    cp_async_wait<kSharedStages - 1>();  // tile t's group and those before it
    __syncthreads();
    const __half* kt = stage0 + (size_t)st * 2 * kTile * P;
    const __half* vt = kt + kTile * P;
    if (active) {
      float s[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
      for (int c = 0; c < KC; ++c)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const __half* kr = kt + (8 * j + g) * P + 16 * c + 2 * t4;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr);
          const uint32_t b1 = HD >= 16 ? *reinterpret_cast<const uint32_t*>(kr + 8) : 0u;
          mma16816(s[j], qf[c], b0, b1);
        }
      float al[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mt = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; ++j) mt = fmaxf(mt, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float m_new = fmaxf(m_run[i], mt);
        al[i] = exp2f(m_run[i] - m_new);
        m_run[i] = m_new;
        l_run[i] *= al[i];
      }
#pragma unroll
      for (int i = 0; i < DT; ++i)
        o[i][0] *= al[0], o[i][1] *= al[0], o[i][2] *= al[1], o[i][3] *= al[1];
      uint32_t pf[NT / 2][4];  // P as the A operand of P V: 16-key chunks
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float p0 = exp2f(s[j][2 * i] - m_run[i]), p1 = exp2f(s[j][2 * i + 1] - m_run[i]);
          l_run[i] += p0 + p1;
          pf[j >> 1][(j & 1) * 2 + i] = pack_half2(p0, p1);
        }
      pv_tile<HD>(o, pf, vt, lane);
    }
    __syncthreads();  // every warp is done with stage st: refill it
    if (t + kSharedStages < t_end) load(t + kSharedStages, st);
    cp_async_commit();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
    if (qrow[i] < 0) continue;
    float* part = a.shared.prefix +
                  (((size_t)qrow[i] * a.n_heads + head[i]) * kAttnSharedSplits + split) * (HD + 2);
    if (t4 == 0) part[0] = m_run[i], part[1] = l_run[i];
#pragma unroll
    for (int d = 0; d < DT; ++d)
      *reinterpret_cast<float2*>(part + 2 + 8 * d + 2 * t4) =
          make_float2(o[d][2 * i], o[d][2 * i + 1]);
  }
  // Each pair counted once its quad's partials are out (wait_prefix).
  __threadfence();
  __syncwarp();
  if (t4 == 0)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (qrow[i] >= 0) atomicAdd(a.shared.counters + (size_t)qrow[i] * a.n_heads + head[i], 1);
}

// Cascade attention in one launch (attention_paged with shared.row_skip): the shared pass's blocks
// first, (block slot, KV head, split) slot-major so the staged slots come before the spare ones,
// then attention_paged's (row, KV head, split) in the latency build's 4 warps, whose combining
// blocks wait for their rows' shared partials (wait_prefix). The two kinds of work overlap: the
// suffix of each row (a few tiles past the shared keys) runs beside the shared tiles.
static_assert(kSharedWarps == kWarps, "one block size serves both passes");
template <int HD, int G, bool HALF>
__global__ void __launch_bounds__(32 * kWarps)
    attention_cascade_kernel(const PagedAttnArgs a, float* partials, int* counters) {
  const int shared = a.shared.max_blocks * a.n_kv_heads * kAttnSharedSplits;
  if ((int)blockIdx.x < shared) {
    const int b = blockIdx.x, split = b % kAttnSharedSplits,
              kvh = b / kAttnSharedSplits % a.n_kv_heads;
    attention_shared_body<HD, G, HALF>(a, b / (kAttnSharedSplits * a.n_kv_heads), kvh, split);
  } else {
    const int b = blockIdx.x - shared, kvh = b / a.n % a.n_kv_heads;
    attention_paged_body<HD, G, HALF>(a, partials, counters, b % a.n, kvh, b / (a.n * a.n_kv_heads),
                                      a.splits);
  }
}

// Blocks of a build resident at once on the whole GPU (one wave).
template <typename K>
long wave_of(K kern, int threads, int smem) {
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem));
  return (long)std::max(per_sm, 1) * sm_count();
}

// The cascade launch's grid: every block slot of the staged list for every KV head and split,
// then attention_paged's blocks.
template <int HD, int G, bool HALF>
void launch_cascade(const PagedAttnArgs& a, const Launch& s) {
  constexpr int smem = (int)std::max(smem_bytes<HD>(), shared_smem_bytes<HD>());
  static const bool configured = [] {
    configure_prefill_kernel(attention_cascade_kernel<HD, G, HALF>, smem);
    return true;
  }();
  (void)configured;
  const long blocks =
      ((long)a.shared.max_blocks * kAttnSharedSplits + (long)a.n * a.splits) * a.n_kv_heads;
  launch_kernel(attention_cascade_kernel<HD, G, HALF>, dim3((unsigned)blocks), dim3(32 * kWarps),
                smem, s, a, a.partials, a.counters);
}

template <int HD, int G, bool HALF>
void launch_t(const PagedAttnArgs& a, const Launch& s) {
  if (a.shared.row_skip) return launch_cascade<HD, G, HALF>(a, s);
  constexpr int smem = (int)smem_bytes<HD>();
  constexpr int smem_wide = (int)smem_bytes<HD, kWideWarps>();
  constexpr int smem_narrow = (int)smem_bytes<HD, kNarrowWarps>();
  // Once per instantiation: the kernels configured, and one resident wave of the latency build
  // (past it the narrow build runs) and of the wide build.
  struct Waves {
    long latency = 0, wide = 0;
  };
  static const Waves waves = [] {
    Waves w;
    configure_prefill_kernel(attention_paged_kernel<HD, G, HALF>, smem);
    w.latency = wave_of(attention_paged_kernel<HD, G, HALF>, 32 * kWarps, smem);
    configure_prefill_kernel(attention_paged_narrow_kernel<HD, G, HALF>, smem_narrow);
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
      return launch_kernel(attention_paged_wide_kernel<HD, G, HALF>, dim3(a.n, a.n_kv_heads, z),
                           dim3(32 * kWideWarps), smem_wide, s, a, a.partials, a.counters);
  }
  if (pairs * a.splits > waves.latency)
    return launch_kernel(attention_paged_narrow_kernel<HD, G, HALF>,
                         dim3(a.n, a.n_kv_heads, a.splits), dim3(32 * kNarrowWarps), smem_narrow, s,
                         a, a.partials, a.counters);
  launch_kernel(attention_paged_kernel<HD, G, HALF>, dim3(a.n, a.n_kv_heads, a.splits),
                dim3(32 * kWarps), smem, s, a, a.partials, a.counters);
}

template <int HD, int G>
void launch_g(const PagedAttnArgs& a, const Launch& s) {
  if (a.kv_half) {
    launch_t<HD, G, true>(a, s);
  } else {
    launch_t<HD, G, false>(a, s);
  }
}

template <int HD>
void launch_hd(const PagedAttnArgs& a, const Launch& s) {
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
  return head_dim >= 8 && head_dim <= 256 && is_pow2(head_dim) && group >= 1 &&
         group <= kAttnPagedMaxGroup;
}

int attn_paged_splits(int max_pos, int pairs, int sms) {
  const int tiles = max_pos / kTile + 1;  // of positions [0, max_pos]
  int z = 1;
  while (z < kAttnPagedSplits && z * kWarps < tiles) z *= 2;
  while (z > 1 && (long)pairs * z > (long)kAttnPagedWavePerSm * sms) z /= 2;
  return z;
}

void attention_paged(const PagedAttnArgs& a, const Launch& s) {
  if (!a.out == !a.out_h) fail("attention_paged: set exactly one of out (fp32) and out_h (fp16)");
  if (!a.q || !a.k_pool || !a.v_pool || !a.row_pos || !a.row_seq || !a.tables || !a.partials ||
      !a.counters)
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
  const SharedPrefix& sp = a.shared;
  if (sp.row_skip && (!sp.prefix || !sp.counters || !sp.groups || !sp.members || !sp.blocks ||
                      sp.max_blocks <= 0 || a.window != 0))
    fail(
        "attention_paged: cascade attention (row_skip) needs the shared pass's partials, "
        "counters, groups, members and block slots (",
        sp.max_blocks, "), and no sliding window");
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
