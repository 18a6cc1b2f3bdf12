// Q4_0 multi-token GEMM on tensor cores (see gemm.h).
//
// Fragment-order trick: a dot product does not care in which order k is summed, so each thread
// of a warp's lane quad (t4 = lane & 3) feeds the mma its own 8 contiguous weight bytes of a
// 64-column chunk (block t4/2, bytes 8*(t4&1)..+7), and the activations are stored in shared
// memory permuted to match (gemm_frag_pos, gemm.h). Then per k16 step a thread needs one
// register of nibbles per weight row and one 8-byte shared load per 8 tokens, and the weight loads
// are plain coalesced 8-byte reads of the split layout with no shared-memory round trip.
//
// Dequantization is exact in fp16: (0x6400 | q) is 1024 + q, minus 1032 gives q - 8 exactly, and
// one multiply by the fp16 scale rounds once: the same fp16 value as rounding (q-8)*d.
#include "cuda/gemm.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

constexpr int kChunk = 64;  // weight columns per chunk: two 32-column units, 16 weights per thread
// Chunks of weights per warp held in registers per round (more chunks in flight hide more
// memory latency, as far as the registers allow): fp16 input (a warp walks every chunk) 4; fp32
// input 4 for 16- and 32-token tiles, 2 for 8-token tiles (4 there would need enough registers
// to leave one block per SM). Formats whose 16 raw weights take more than 4 registers (Q4_0
// takes 3) hold half as many, or 1 with fp32 input (2 would spill).
template <GgmlType T, bool H, int NT>
constexpr int kRing = sizeof(typename QFormat<T>::Raw16) <= 16 ? (H || NT > 1 ? 4 : 2)
                                                               : (H ? 2 : 1);

struct Params {
  GemmArgs a;
  GemmOut o;
  int k;        // columns of the weights (= used activation columns)
  int nu;       // 32-column units per row
  int nchunks;  // 64-column chunks per row (the last may hold one unit)
  int mt0;      // first m-tile of this launch (QkvRope with mixed types: one launch per matrix)
  int mt_end;   // one past the last m-tile of this launch
  // QkvRope with V in a second type (gemm_kernel's TV): blocks from vb0 on take the m-tiles
  // from mt_v0 on (V's), the others those before it (Q's and K's).
  int vb0, mt_v0;
  int cps;  // chunks per K split (gridDim.z splits)
  int n;    // epilogue width: rows (Store/Accumulate), 2*rows (GatePair), q+k+v rows (QkvRope)
  int mw;   // warps side by side along the rows (16-row tiles per block)
};

// One weight row as a thread reads it (row `ok` false: reads nothing, weights are zero).
struct RowSrc {
  const void* q;
  const uint16_t* d;
  size_t row;
  bool ok;
};

__device__ __forceinline__ RowSrc row_src(const DevMat& m, int row) {
  return {m.q, m.d, (size_t)(row < m.rows ? row : 0), row < m.rows};
}

// Weight rows of m-tile mt for fragment rows g (A) and g + 8 (B). Store/Accumulate/QkvRope: rows
// 2g and 2g+1 of the tile, so a thread's accumulators hold adjacent output columns (a RoPE pair).
// GatePair: gate row and up row of the same output column 8*mt + g.
template <GemmEpilogue E>
__device__ __forceinline__ void tile_rows(const Params& p, int mt, int g, RowSrc& A, RowSrc& B) {
  if constexpr (E == GemmEpilogue::GatePair) {
    A = row_src(p.a.w0, mt * 8 + g);
    B = row_src(p.a.w1, mt * 8 + g);
  } else if constexpr (E == GemmEpilogue::QkvRope) {
    const int r0 = mt * 16, nq = p.a.w0.rows, nk = p.a.w1.rows;
    const DevMat& m = r0 < nq ? p.a.w0 : r0 < nq + nk ? p.a.w1 : p.a.w2;
    const int base = r0 < nq ? r0 : r0 < nq + nk ? r0 - nq : r0 - nq - nk;
    A = row_src(m, base + 2 * g);
    B = row_src(m, base + 2 * g + 1);
  } else {
    A = row_src(p.a.w0, mt * 16 + 2 * g);
    B = row_src(p.a.w0, mt * 16 + 2 * g + 1);
  }
}

// This thread's 16 weights of chunk c for rows A and B, raw (qformat.h load16): unit 2c + t4/2,
// columns 8(t4&1)+k and 16+8(t4&1)+k. Past the row's end: zero bytes, which decode to 0.
template <GgmlType T>
struct WFrag {
  typename QFormat<T>::Raw16 a, b;
};

template <GgmlType T>
__device__ __forceinline__ WFrag<T> fetch(const RowSrc& A, const RowSrc& B, int c, int nu, int t4) {
  using F = QFormat<T>;
  constexpr int upb = F::kLayout.block ? F::kLayout.qk / 32 : 1;
  WFrag<T> f;
  memset(&f, 0, sizeof f);
  const int u = 2 * c + (t4 >> 1);
  if (u < nu) {
    const int nbr = nu / upb;  // blocks per row
    const int blk = u / upb, j = u % upb, h = t4 & 1;
    if (A.ok) f.a = F::load16(A.q, A.d, A.row * nbr + blk, j, h);
    if (B.ok) f.b = F::load16(B.q, B.d, B.row * nbr + blk, j, h);
  }
  return f;
}

// The 8 fp16 pairs (mma A-operand registers) of 16 raw weights (qformat.h pairs16), in the
// order the staged activations follow (gemm_frag_pos).
template <GgmlType T>
__device__ __forceinline__ void frag_pairs(const typename QFormat<T>::Raw16& r, uint32_t (&h2)[8]) {
  QFormat<T>::pairs16(r, h2);
}

// v * (s * w): the RMSNorm applied to staged activations (the GEMM's fp32 staging and act_to_f16
// round alike).
__device__ __forceinline__ float4 norm_scaled(float4 v, float s, float4 w) {
  v.x *= s * w.x, v.y *= s * w.y, v.z *= s * w.z, v.w *= s * w.w;
  return v;
}

// ---- epilogues ------------------------------------------------------------------------------
// QkvRope: RoPE frequency base^(-2i/rope_dim) of output columns (c, c+1), or -1 when they are not
// rotated (v, or past rope_dim). Fixed per thread, so computed once, not per token.
__device__ __forceinline__ float rope_freq(const GemmOut& o, int c) {
  const bool is_q = c < o.q_dim;
  const int cc = is_q ? c : (c - o.q_dim) % o.kv_dim;
  if (!is_q && c >= o.q_dim + o.kv_dim) return -1.f;
  const int i = (cc % o.head_dim) / 2;
  return 2 * i < o.rope_dim ? rope_inv_freq(i, o.rope_dim, o.rope_base) : -1.f;
}

// Output columns (c, c+1) of token t; c even; v1 ignored when c + 1 >= n. freq: rope_freq(c).
// Accumulate: res holds the residual y[t][c], y[t][c+1] when the kernel prefetched it.
template <GemmEpilogue E>
__device__ __forceinline__ void epi_pair(const GemmOut& o, int n, int t, int c, float v0, float v1,
                                         float freq, const float2* res) {
  if constexpr (E == GemmEpilogue::Store || E == GemmEpilogue::Accumulate) {
    float* y = o.y + (size_t)t * o.ldy + c;
    if constexpr (E == GemmEpilogue::Accumulate) {
      if (res) {
        v0 += res->x;
        v1 += res->y;
      } else {
        v0 += y[0];
        if (c + 1 < n) v1 += y[1];
      }
    }
    y[0] = v0;
    if (c + 1 < n) y[1] = v1;
  } else if constexpr (E == GemmEpilogue::GatePair) {
    const float h = gate_act(v0, o.act) * v1;
    const int j = c / 2;
    if (o.yh) {
      o.yh[(size_t)t * o.ldyh + (j & ~63) + gemm_frag_pos(j & 63)] =
          __half_as_ushort(__float2half_rn(h));
    } else {
      o.y[(size_t)t * o.ldy + j] = h;
    }
  } else {  // QkvRope
    const int pos = o.row_pos ? o.row_pos[t] : o.pos0 + t;
    const bool is_q = c < o.q_dim;
    const int cc = is_q ? c : (c - o.q_dim) % o.kv_dim;  // column inside q, k or v
    const bool is_v = !is_q && c >= o.q_dim + o.kv_dim;
    if (freq >= 0.f) {  // same angle expression as the decode path (qkv_finish.cu)
      const float theta = (float)pos * freq;
      float sn, cs;
      sincosf(theta, &sn, &cs);
      const float r0 = v0 * cs - v1 * sn, r1 = v0 * sn + v1 * cs;
      v0 = r0;
      v1 = r1;
    }
    if (is_q) {
      float* y = o.y + (size_t)t * o.ldy + cc;
      y[0] = v0;
      y[1] = v1;
    } else {
      void* cache = is_v ? o.v_cache : o.k_cache;
      const size_t off = (size_t)(o.row_slot ? o.row_slot[t] : pos) * o.kv_dim + cc;
      if (o.kv_half) {
        reinterpret_cast<__half2*>(cache)[off / 2] = __floats2half2_rn(v0, v1);
      } else {
        float* q = reinterpret_cast<float*>(cache) + off;
        q[0] = v0;
        q[1] = v1;
      }
    }
  }
}

// Accumulator fragment of n-tile j (c0,c1: row g, tokens 2t4, 2t4+1; c2,c3: row g+8) through
// the epilogue.
template <GemmEpilogue E>
__device__ __forceinline__ void epilogue(const Params& p, int mt, int t0, int j, int g, int t4,
                                         float freq, const float (&v)[4],
                                         const float2* res = nullptr) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int tl = 8 * j + 2 * t4 + h, tok = t0 + tl;
    if (tok >= p.a.t) continue;
    const float v0 = v[h], v1 = v[2 + h];
    int col;
    if constexpr (E == GemmEpilogue::GatePair) {
      if (mt * 8 + g >= p.a.w0.rows) continue;
      col = 2 * (mt * 8 + g);
    } else {
      col = mt * 16 + 2 * g;
      if (col >= p.n) continue;
    }
    if (E == GemmEpilogue::Accumulate && gridDim.z > 1) {
      float* y = p.o.y + (size_t)tok * p.o.ldy + col;
      atomicAdd(y, v0);
      if (col + 1 < p.n) atomicAdd(y + 1, v1);
    } else {
      epi_pair<E>(p.o, p.n, tok, col, v0, v1, freq, res ? res + h : nullptr);
    }
  }
}

// ---- shared-memory layout ---------------------------------------------------------------------
// fp32 input: [raw fp32 tile BN x kc | norm weight kc floats | fp16 tile BN x (kc + 16)]; the
// K-split reduction buffer (kred: warps along K) reuses the raw tile after the
// conversion. fp16 input (h): [reduction buffer if kred | fp16 tile]. The fp16 row pitch (kc + 16
// halves = 8 mod 32 words) puts the 8 token rows of a B-fragment load in distinct bank octets.
struct Layout {
  int kc, pitch, nw, xs, bytes;  // byte offsets; the raw tile is at 0
  __host__ __device__ Layout(int bn, int kc_, int nw_warps, int nt, bool h, bool kred) {
    kc = kc_;
    pitch = kc + 16;
    const int red = kred ? nw_warps * nt * 4 * 32 * 4 : 0;
    nw = h ? red : bn * kc * 4 > red ? bn * kc * 4 : red;
    xs = h ? red : nw + kc * 4;
    bytes = xs + bn * pitch * 2;
  }
};

// Block: MW x KW warps (MW = p.mw, KW = blockDim.x / 32 / MW, chosen at launch).
// Blocks per SM each instantiation is compiled for (__launch_bounds__ minimum; 0 = ptxas's
// choice). The QkvRope kernels get one block per SM (their grids fit one wave; ptxas's own
// choice spills the 8-token one), the 8-token residual kernel two; the others keep ptxas's
// choice, since gate_up and down need two blocks per SM and the 32-token tiles spill at two.
template <GemmEpilogue E, int NT, bool H>
constexpr int gemm_min_blocks() {
  if (E == GemmEpilogue::QkvRope) return 1;
  if (E == GemmEpilogue::Accumulate && NT == 1 && !H) return 2;
  return 0;
}

// One block's work: m-tiles mt_first + bx*MW .. (a warp past mt_end reads no weights and writes
// nothing), weights of type T.
template <GgmlType T, GemmEpilogue E, int NT, bool H>
__device__ __forceinline__ void gemm_body(const Params& p, int mt_first, int bx, int mt_end) {
  constexpr int BN = 8 * NT;
  const int NTH = blockDim.x, NW = NTH / 32, MW = p.mw, KW = NW / MW;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int mw = warp % MW, kw = warp / MW;
  const int mt = mt_first + bx * MW + mw;  // this warp's m-tile (16 weight rows)
  const bool mt_ok = mt < mt_end;
  const int t0 = blockIdx.y * BN;
  const int c0 = blockIdx.z * p.cps, c1 = min(p.nchunks, c0 + p.cps);
  const Layout L(BN, (c1 - c0) * kChunk, NW, NT, H, KW > 1);
  float* raw = reinterpret_cast<float*>(smem);
  float* nws = reinterpret_cast<float*>(smem + L.nw);
  __half* xs = reinterpret_cast<__half*>(smem + L.xs);
  const bool norm = !H && p.a.norm_w != nullptr;

  // Weights never depend on the previous kernel: the first round is in flight before the wait.
  RowSrc A, B;
  tile_rows<E>(p, mt, g, A, B);
  if (!mt_ok) A.ok = B.ok = false;
  const int my = c1 - c0 > kw ? (c1 - c0 - kw + KW - 1) / KW : 0;  // chunks c0+kw, +KW, ...
  constexpr int R = kRing<T, H, NT>;
  const int rounds = (my + R - 1) / R;
  WFrag<T> cur[R], nxt[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < my) cur[r] = fetch<T>(A, B, c0 + kw + KW * r, p.nu, t4);

  pdl_wait();  // x (and the residual y) come from the previous kernel
  pdl_trigger();

  // Residual GEMM whose K is not split across blocks, one n-tile per warp: fetch the residual this
  // warp will add now, so its latency overlaps the staging instead of trailing the math.
  float2 res[2] = {make_float2(0.f, 0.f), make_float2(0.f, 0.f)};
  bool have_res = false;
  if constexpr (E == GemmEpilogue::Accumulate) {
    if (gridDim.z == 1 && KW >= NT && kw < NT) {
      have_res = true;
      const int col = mt * 16 + 2 * g;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int tok = t0 + 8 * kw + 2 * t4 + h;
        if (tok < p.a.t && col < p.n) {
          const float* y = p.o.y + (size_t)tok * p.o.ldy + col;
          res[h].x = y[0];
          if (col + 1 < p.n) res[h].y = y[1];
        }
      }
    }
  }

  if constexpr (H) {
    // fp16 rows already in fragment order: copy them as they are. One warp along K (every warp
    // walks all chunks): one commit group per round of chunks (the last group takes the rest), so
    // the first round's math starts when it lands. Several: one group, all landed before the math.
    const bool by_round = KW == 1;
#pragma unroll
    for (int gi = 0; gi < 3; ++gi) {
      const int ca = by_round ? c0 + R * gi : gi == 0 ? c0 : c1;
      const int cb = !by_round || gi == 2 ? c1 : min(c1, ca + R);
      const int per = (cb - ca) * (kChunk / 8);  // 16-byte pieces per token row
      for (int i = tid; i < BN * per; i += NTH) {
        const int r = i / per, col = (ca - c0) * kChunk + (i % per) * 8, tok = t0 + r;
        const bool ok = tok < p.a.t;
        cp_async16(xs + r * L.pitch + col,
                   ok ? p.a.xh + (size_t)tok * p.a.ldh + c0 * kChunk + col : p.a.xh, ok ? 16 : 0);
      }
      cp_async_commit();
    }
    if (!by_round) {  // block-uniform
      cp_async_wait<0>();
      __syncthreads();
    }
  } else {
    // Stage the block's activations: raw fp32 (and the norm weight) by cp.async, then convert to
    // fp16 in fragment order. 16 threads per token row: thread `sub` owns column group 4*sub of
    // every chunk, so its fragment position is fixed; fixed-order sum of squares (shuffles).
    const int kbase = c0 * kChunk, q4 = L.kc / 4, sub = tid & 15;
    for (int r = tid >> 4; r < BN; r += NTH >> 4) {
      const int tok = t0 + r;
      for (int q = sub; q < q4; q += 16) {
        const int kk = kbase + 4 * q;
        const bool ok = tok < p.a.t && kk < p.k;
        cp_async16(raw + r * L.kc + 4 * q, ok ? p.a.x + (size_t)tok * p.a.ldx + kk : p.a.x,
                   ok ? 16 : 0);
      }
    }
    if (norm)
      for (int q = tid; q < q4; q += NTH) {
        const bool ok = kbase + 4 * q < p.k;
        cp_async16(nws + 4 * q, ok ? p.a.norm_w + kbase + 4 * q : p.a.norm_w, ok ? 16 : 0);
      }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    const int fp = gemm_frag_pos(4 * sub);
    for (int r = tid >> 4; r < BN; r += NTH >> 4) {  // warp-uniform: a warp covers 2 whole rows
      const float* src = raw + r * L.kc + 4 * sub;
      __half* dst = xs + r * L.pitch + fp;
      // RMSNorm: the row's scale first (fixed-order sum of squares), then x * scale * w goes to
      // fp16, so only normalized values are rounded: a residual stream past the fp16 range
      // (gemma3's reaches ~1e5, times norm weights up to ~1e3) stays finite.
      float sc = 1.f;
      if (norm) {
        float ss = 0.f;
#pragma unroll 4
        for (int m = 0; m < L.kc / kChunk; ++m) {
          const float4 v = *reinterpret_cast<const float4*>(src + m * kChunk);
          ss += sum_sq(v);
        }
#pragma unroll
        for (int o = 1; o < 16; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        sc = rsqrtf(ss / (float)p.k + p.a.eps);
      }
#pragma unroll 4
      for (int m = 0; m < L.kc / kChunk; ++m) {
        float4 v = *reinterpret_cast<const float4*>(src + m * kChunk);
        if (norm) {
          const float4 w = *reinterpret_cast<const float4*>(nws + 4 * sub + m * kChunk);
          v = norm_scaled(v, sc, w);
        }
        uint2 u;  // elements k, k+2 | k+1, k+3 (the B register order)
        u.x = pack_half2(v.x, v.z);
        u.y = pack_half2(v.y, v.w);
        *reinterpret_cast<uint2*>(dst + m * kChunk) = u;
      }
    }
    __syncthreads();
  }

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const __half* xb = xs + g * L.pitch + t4 * 4;
  for (int round = 0; round < rounds; ++round) {
    if (H && KW == 1) {  // this round's commit group (and every thread's copies) has landed
      if (round == 0) {
        cp_async_wait<2>();
      } else if (round == 1) {
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    }
    if (round + 1 < rounds) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int i = (round + 1) * R + r;
        if (i < my) nxt[r] = fetch<T>(A, B, c0 + kw + KW * i, p.nu, t4);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int i = round * R + r;
      if (i >= my) break;
      uint32_t ha[8], hb[8];
      frag_pairs<T>(cur[r].a, ha);
      frag_pairs<T>(cur[r].b, hb);
      const __half* xc = xb + (kw + KW * i) * kChunk;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t af[4] = {ha[2 * s], hb[2 * s], ha[2 * s + 1], hb[2 * s + 1]};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint2 bv = *reinterpret_cast<const uint2*>(xc + 8 * j * L.pitch + s * 16);
          mma16816(acc[j], af, bv.x, bv.y);
        }
      }
    }
    if (round + 1 < rounds) {
#pragma unroll
      for (int r = 0; r < R; ++r) cur[r] = nxt[r];
    }
  }

  float freq = -1.f;
  if constexpr (E == GemmEpilogue::QkvRope) freq = rope_freq(p.o, mt * 16 + 2 * g);
  if (KW > 1) {        // add the K-split warps' tiles in a fixed order (block-uniform branch)
    float* red = raw;  // [NW][NT][4][32]; raw is dead since the conversion barrier
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[((warp * NT + j) * 4 + e) * 32 + lane] = acc[j][e];
    __syncthreads();
    for (int j = kw; j < NT; j += KW) {
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      for (int w = 0; w < KW; ++w)
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] += red[(((w * MW + mw) * NT + j) * 4 + e) * 32 + lane];
      if (mt_ok) epilogue<E>(p, mt, t0, j, g, t4, freq, v, have_res ? res : nullptr);
    }
  } else {
#pragma unroll
    for (int j = 0; j < NT; ++j)  // have_res: NT = KW = 1, the residual of tile j = 0
      if (mt_ok) epilogue<E>(p, mt, t0, j, g, t4, freq, acc[j], have_res ? res : nullptr);
  }
}

// T: the weights' type. QkvRope with V in another type TV (a K-quant mixture's attn_v): blocks
// from p.vb0 on do V's m-tiles with TV, the others Q's and K's with T; the branch is
// block-uniform, so each block runs one type's code (its barriers and registers) and the grid
// stays one full launch.
template <GgmlType T, GemmEpilogue E, int NT, bool H, GgmlType TV = T>
__global__ void __launch_bounds__(512, gemm_min_blocks<E, NT, H>()) gemm_kernel(const Params p) {
  if constexpr (TV != T) {
    if ((int)blockIdx.x >= p.vb0) {
      gemm_body<TV, E, NT, H>(p, p.mt_v0, (int)blockIdx.x - p.vb0, p.mt_end);
      return;
    }
    gemm_body<T, E, NT, H>(p, p.mt0, (int)blockIdx.x, p.mt_v0);
  } else {
    gemm_body<T, E, NT, H>(p, p.mt0, (int)blockIdx.x, p.mt_end);
  }
}

// ---- host ---------------------------------------------------------------------------------------

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

void check_mat(const DevMat& m, const char* name, int k) {
  if (!gemm_takes(m.type) || !m.q || (dev_layout(m.type).block && !m.d))
    fail("gemm: ", name, " has type ", type_name(m.type),
         ", which the prefill GEMM does not take (block formats, f16, bf16)");
  if (m.rows <= 0 || m.cols != k)
    fail("gemm: ", name, " is ", m.rows, " x ", m.cols, ", expected ", k, " columns");
  if (!aligned16(m.q)) fail("gemm: ", name, " quants must be 16-byte aligned");
}

void check_args(const GemmArgs& a, GemmEpilogue ep, const GemmOut& o) {
  const int k = a.w0.cols;
  if (k <= 0 || k % 32 != 0) fail("gemm: k=", k, " must be a positive multiple of 32");
  if (ep == GemmEpilogue::GatePair && a.w1.type != a.w0.type)
    fail("gemm: GatePair gate (", type_name(a.w0.type), ") and up (", type_name(a.w1.type),
         ") must share one type");
  check_mat(a.w0, "w0", k);
  if (ep == GemmEpilogue::GatePair || ep == GemmEpilogue::QkvRope) check_mat(a.w1, "w1", k);
  if (ep == GemmEpilogue::QkvRope) check_mat(a.w2, "w2", k);
  if (a.t <= 0) fail("gemm: empty batch t=", a.t);
  if (a.xh) {
    if (a.norm_w) fail("gemm: fp16 input (xh) is normalized by act_to_f16, not by the GEMM");
    if (!aligned16(a.xh) || a.ldh % 64 != 0 || a.ldh < (k + 63) / 64 * 64)
      fail("gemm: xh must be 16-byte aligned with ldh=", a.ldh, " a multiple of 64 covering k=", k);
  } else {
    if (!a.x || !aligned16(a.x)) fail("gemm: activations must be non-null and 16-byte aligned");
    if (a.norm_w && !aligned16(a.norm_w)) fail("gemm: norm weight must be 16-byte aligned");
    if (a.ldx < k || a.ldx % 4 != 0)
      fail("gemm: ldx=", a.ldx, " must be >= k=", k, " and a multiple of 4");
  }
  if (!o.y && !(ep == GemmEpilogue::GatePair && o.yh)) fail("gemm: null output pointer");
  switch (ep) {
    case GemmEpilogue::Store:
    case GemmEpilogue::Accumulate:
      if (o.ldy < a.w0.rows) fail("gemm: ldy=", o.ldy, " < rows=", a.w0.rows);
      break;
    case GemmEpilogue::GatePair:
      if (a.w1.rows != a.w0.rows)
        fail("gemm: GatePair gate has ", a.w0.rows, " rows but up has ", a.w1.rows);
      if (o.yh ? o.ldyh % 64 != 0 || o.ldyh < (a.w0.rows + 63) / 64 * 64 : o.ldy < a.w0.rows)
        fail("gemm: GatePair output pitch ", o.yh ? o.ldyh : o.ldy, " does not fit ", a.w0.rows,
             " columns", o.yh ? " (fp16: a multiple of 64)" : "");
      break;
    case GemmEpilogue::QkvRope:
      if (o.head_dim <= 0 || o.head_dim % 2 || o.q_dim % o.head_dim || o.kv_dim % o.head_dim)
        fail("gemm: QkvRope head_dim=", o.head_dim, " must be even and divide q_dim=", o.q_dim,
             " and kv_dim=", o.kv_dim);
      if (o.q_dim % 16 || o.kv_dim % 16)
        fail("gemm: QkvRope q_dim=", o.q_dim, " and kv_dim=", o.kv_dim, " must be multiples of 16");
      if (o.rope_dim < 0 || o.rope_dim > o.head_dim)
        fail("gemm: rope_dim=", o.rope_dim, " must be in [0, head_dim=", o.head_dim, "]");
      if (a.w0.rows != o.q_dim || a.w1.rows != o.kv_dim || a.w2.rows != o.kv_dim)
        fail("gemm: QkvRope matrices have ", a.w0.rows, "/", a.w1.rows, "/", a.w2.rows,
             " rows, expected q_dim=", o.q_dim, " and kv_dim=", o.kv_dim);
      if (!o.k_cache || !o.v_cache || o.pos0 < 0) fail("gemm: QkvRope needs KV caches");
      if (o.ldy < o.q_dim) fail("gemm: ldy=", o.ldy, " < q_dim=", o.q_dim);
      break;
  }
}

// mw x kw warps per block (<= 16), z K splits across blocks.
template <GgmlType T, GemmEpilogue E, int NT, bool H, GgmlType TV = T>
void launch(Params p, int mtiles, int mw, int kw, int z, const Launch& s) {
  constexpr int BN = 8 * NT;
  const int nw = mw * kw;
  int gx = (mtiles + mw - 1) / mw;
  const int gy = (p.a.t + BN - 1) / BN;
  p.mt_end = p.mt0 + mtiles;
  if constexpr (TV != T) {  // Q's and K's tiles, then V's, each rounded up to whole blocks
    p.vb0 = (p.mt_v0 - p.mt0 + mw - 1) / mw;
    gx = p.vb0 + (p.mt_end - p.mt_v0 + mw - 1) / mw;
  }
  p.mw = mw;
  p.cps = (p.nchunks + z - 1) / z;
  z = (p.nchunks + p.cps - 1) / p.cps;
  const int smem = Layout(BN, p.cps * kChunk, nw, NT, H, kw > 1).bytes;
  if (smem > kMaxBlockSmem)
    fail("gemm: k=", p.k, " needs ", smem, " bytes of shared memory for ", BN,
         " tokens per block (limit ", kMaxBlockSmem, ")");
  auto kern = gemm_kernel<T, E, NT, H, TV>;
  static bool configured = false;  // per instantiation, once
  if (!configured) {
    configure_prefill_kernel(kern, kMaxBlockSmem);
    configured = true;
  }
  launch_kernel(kern, dim3(gx, gy, z), dim3(32 * nw), (size_t)smem, s, p);
}

// Tile shapes.
// fp32 input (small batches, latency-bound): warps along K, one per 64-column chunk where the
// chunks allow (up to 16 warps), spread the block's staging and conversion over many threads.
// Every block stages the whole activation tile of its K range, so blocks of one 16-row tile
// would re-read it from L2 once per tile: row tiles are grouped (mw) until the blocks' total
// staging traffic is at most the staging budget. The token tile shrinks when a row would not fit
// in shared memory.
// fp16 input: the same shapes below kGemmF16MinTokens (copied, not converted); from there on
// 4 row tiles side by side, 64 tokens per block, so each weight chunk feeds 8 mma per
// dequantization, and kLargeChunksInFlight / kRing warps along K (their tiles summed in shared
// memory), so that each tile has eight weight chunks in flight across its warps, more than one
// warp along K could hold in registers.
constexpr int kLargeChunksInFlight = 8;

// Residual GEMMs also split K across blocks (at most kMaxKw warps along K, more blocks to fill the
// SMs) and add atomically when the launch allows it (Launch::split_k); otherwise every output is
// summed by one block in a fixed order and results are bit-identical from run to run.
constexpr int kMaxKw = 12;

// Warps per block at most (fp32/small-batch shapes): 16, the fastest of the block sizes tried
// on small prompts.
constexpr int kMaxWarps = 16;
// Staging budget of the small-batch tiles (bytes of fp16 activations in flight per wave).
constexpr double kStageBudget = 4096.0 * 1024.0;

template <GgmlType T, GemmEpilogue E, bool H, GgmlType TV = T>
void dispatch_small(const Params& p, int mtiles, bool split, const Launch& s) {
  const int t = p.a.t;
  // One 8-token tile per block up to 32 tokens (more blocks, less staging per SM), 32-token
  // tiles beyond.
  int nt = t <= 32 ? 1 : 4;
  const int gy = (t + 8 * nt - 1) / (8 * nt);
  const double tile_bytes = 8.0 * nt * p.k * (H ? 2 : 4);  // a block's staging, all K splits
  int mw = 1;
  while (mw < 8 && mw * 2 <= mtiles && (mtiles + mw - 1) / mw * gy * tile_bytes > kStageBudget)
    mw *= 2;
  const int z = split ? (p.nchunks + kMaxKw - 1) / kMaxKw : 1;
  const int cps = (p.nchunks + z - 1) / z;
  const int kw = std::max(1, std::min({cps, split ? kMaxKw : kMaxWarps, kMaxWarps / mw}));
  auto fits = [&](int n) {
    return Layout(8 * n, cps * kChunk, mw * kw, n, H, kw > 1).bytes <= kMaxBlockSmem;
  };
  if (nt == 1 || !fits(2)) return launch<T, E, 1, H, TV>(p, mtiles, mw, kw, z, s);
  if (nt == 2 || !fits(4)) return launch<T, E, 2, H, TV>(p, mtiles, mw, kw, z, s);
  return launch<T, E, 4, H, TV>(p, mtiles, mw, kw, z, s);
}

template <GgmlType T, GemmEpilogue E, GgmlType TV = T>
void dispatch_t(const Params& p, int mtiles, const Launch& s) {
  const bool split = E == GemmEpilogue::Accumulate && !p.a.norm_w && s.split_k;
  const int t = p.a.t;
  if (p.a.xh && t >= kGemmF16MinTokens) {
    int z = 1;
    const int blocks = (mtiles + 3) / 4 * ((t + 63) / 64);
    if (split) z = std::min(p.nchunks, std::max(1, (sm_count() + blocks - 1) / blocks));
    // kw warps along K fit in shared memory (their partial tiles summed there when kw > 1).
    const auto fits = [&](int kw) {
      return Layout(64, (p.nchunks + z - 1) / z * kChunk, 4 * kw, 8, true, kw > 1).bytes <=
             kMaxBlockSmem;
    };
    while (split && !fits(1)) ++z;
    // Warps along K: kLargeChunksInFlight / the format's ring, so each 16-row tile keeps the same
    // number of weight chunks in flight whatever its format (fewer where the K range or shared
    // memory does not allow it). A 64-token tile of a long row (k above ~1,700) that may not
    // split K (Store, GatePair, QkvRope) fits with none: the small-batch shapes then, whose token
    // tile shrinks to fit.
    const int cps = (p.nchunks + z - 1) / z;
    for (int kw = kLargeChunksInFlight / kRing<T, true, 8>; kw >= 1; kw /= 2)
      if (kw <= cps && fits(kw)) return launch<T, E, 8, true, TV>(p, mtiles, 4, kw, z, s);
  }
  if (p.a.xh) return dispatch_small<T, E, true, TV>(p, mtiles, split, s);
  return dispatch_small<T, E, false, TV>(p, mtiles, split, s);
}

// The one dispatch place from the weight type to the kernel template (qformat.h's table).
template <GemmEpilogue E>
void dispatch(const Params& p, GgmlType type, int mtiles, const Launch& s) {
  dispatch_format(type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    if constexpr (T != GgmlType::F32) dispatch_t<T, E>(p, mtiles, s);
  });
}

// act_to_f16: one block of kActThreads per row. NV > 0: the row's float4s (and the norm weight's)
// are loaded into registers at once, NV per thread, covering ldh; one memory round trip and one
// block reduction, then the stores. NV = 0 (rows wider than kActMaxNV float4s per thread): rolled
// loops. A block per row (not a warp) fills the SMs, and loading the row at once costs one
// memory round trip instead of one per loop trip.
constexpr int kActThreads = 128, kActMaxNV = 8;

template <int NV, bool kFrag>
__global__ void __launch_bounds__(kActThreads)
    act_f16_kernel(const float* x, int ldx, int k, const float* nw, float eps, uint16_t* out,
                   int ldh) {
  __shared__ float red[kActThreads / 32];
  // Fragment order fills the pad columns [k, ldh) with zeros (the GEMM reads whole 64-column
  // chunks); row-major rows end at k (the dense GEMM reads k columns).
  const int tok = blockIdx.x, tid = threadIdx.x, q4 = k / 4, qh = kFrag ? ldh / 4 : q4;
  const float4* xr = reinterpret_cast<const float4*>(x + (size_t)tok * ldx);
  const float4* w4 = reinterpret_cast<const float4*>(nw);
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  constexpr int R = NV > 0 ? NV : 1;
  float4 v[R], w[R];
  if constexpr (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {  // the norm weight does not depend on the previous kernel
      const int q = tid + i * kActThreads;
      w[i] = nw && q < q4 ? w4[q] : zero;
    }
  }
  pdl_wait();  // x comes from the previous kernel
  pdl_trigger();
  float ss = 0.f;
  if constexpr (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int q = tid + i * kActThreads;
      v[i] = q < q4 ? xr[q] : zero;
      ss += sum_sq(v[i]);
    }
  } else if (nw) {
    for (int q = tid; q < q4; q += kActThreads) {
      const float4 u = xr[q];
      ss += sum_sq(u);
    }
  }
  float scale = 1.f;
  if (nw) {
    ss = warp_sum(ss);
    if ((tid & 31) == 0) red[tid >> 5] = ss;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kActThreads / 32; ++i) total += red[i];
    scale = rsqrtf(total / (float)k + eps);
  }
  auto put = [&](int q, float4 u, float4 wq) {
    if (nw) u = norm_scaled(u, scale, wq);
    const int c = 4 * q;
    uint2 h;
    if constexpr (kFrag) {  // fragment order: k, k+2 | k+1, k+3
      h.x = pack_half2(u.x, u.z);
      h.y = pack_half2(u.y, u.w);
      *reinterpret_cast<uint2*>(out + (size_t)tok * ldh + (c & ~63) + gemm_frag_pos(c & 63)) = h;
    } else {
      h.x = pack_half2(u.x, u.y);
      h.y = pack_half2(u.z, u.w);
      *reinterpret_cast<uint2*>(out + (size_t)tok * ldh + c) = h;
    }
  };
  if constexpr (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int q = tid + i * kActThreads;
      if (q < qh) put(q, v[i], w[i]);  // past k: zeros (the pad columns)
    }
  } else {
    for (int q = tid; q < qh; q += kActThreads)
      put(q, q < q4 ? xr[q] : zero, nw && q < q4 ? w4[q] : zero);
  }
}

}  // namespace

void gemm(const GemmArgs& a, GemmEpilogue ep, const GemmOut& o, const Launch& stream) {
  check_args(a, ep, o);
  Params p;
  p.a = a;
  p.o = o;
  p.k = a.w0.cols;
  p.nu = p.k / 32;
  p.nchunks = (p.k + kChunk - 1) / kChunk;
  p.mt0 = 0;
  const GgmlType t = a.w0.type;
  switch (ep) {
    case GemmEpilogue::Store:
      p.n = a.w0.rows;
      return dispatch<GemmEpilogue::Store>(p, t, (p.n + 15) / 16, stream);
    case GemmEpilogue::Accumulate:
      p.n = a.w0.rows;
      return dispatch<GemmEpilogue::Accumulate>(p, t, (p.n + 15) / 16, stream);
    case GemmEpilogue::GatePair:
      p.n = 2 * a.w0.rows;
      return dispatch<GemmEpilogue::GatePair>(p, t, (a.w0.rows + 7) / 8, stream);
    case GemmEpilogue::QkvRope: {
      p.n = a.w0.rows + a.w1.rows + a.w2.rows;
      if (a.w1.type == t && a.w2.type == t)
        return dispatch<GemmEpilogue::QkvRope>(p, t, p.n / 16, stream);
      const GgmlType tv = a.w2.type;
      if (a.w1.type == t && dev_layout(t).block && (tv == GgmlType::Q6_K || tv == GgmlType::Q8_0)) {
        // Q and K of one type, V in a K-quant mixture's wider type: one launch (two-type kernel).
        p.mt_v0 = (a.w0.rows + a.w1.rows) / 16;
        dispatch_format(t, [&](auto tag) {
          constexpr GgmlType T = decltype(tag)::value;
          if constexpr (QFormat<T>::kLayout.block) {
            if (tv == GgmlType::Q6_K) {
              dispatch_t<T, GemmEpilogue::QkvRope, GgmlType::Q6_K>(p, p.n / 16, stream);
            } else {
              dispatch_t<T, GemmEpilogue::QkvRope, GgmlType::Q8_0>(p, p.n / 16, stream);
            }
          }
        });
        return;
      }
      // Other mixes of types: one launch per matrix over its own m-tiles.
      const DevMat* ms[3] = {&a.w0, &a.w1, &a.w2};
      int mt = 0;
      for (const DevMat* m : ms) {
        p.mt0 = mt;
        dispatch<GemmEpilogue::QkvRope>(p, m->type, m->rows / 16, stream);
        mt += m->rows / 16;
      }
      return;
    }
  }
}

void act_to_f16(const float* x, int ldx, int t, int k, const float* norm_w, float eps,
                uint16_t* out, int ldh, const Launch& s, F16Order order) {
  const bool frag = order == F16Order::kFragment;
  if (!x || !out || t <= 0 || k <= 0 || k % 4 || ldx < k || ldx % 4 || ldh % (frag ? 64 : 8) ||
      ldh < k || !aligned16(x) || !aligned16(out) || (norm_w && !aligned16(norm_w)))
    fail("act_to_f16: bad arguments t=", t, " k=", k, " ldx=", ldx, " ldh=", ldh);
  auto go = [&](auto kern) {
    static bool configured = false;  // per instantiation, once
    if (!configured) {
      configure_prefill_kernel(kern, 0);
      configured = true;
    }
    launch_kernel(kern, dim3(t), dim3(kActThreads), 0, s, x, ldx, k, norm_w, eps, out, ldh);
  };
  auto pick = [&](auto frag_tag) {
    constexpr bool F = decltype(frag_tag)::value;
    const int cover = F ? ldh : k;                                       // columns written
    const int per_thread = (cover / 4 + kActThreads - 1) / kActThreads;  // float4s per thread
    if (per_thread <= 1) return go(act_f16_kernel<1, F>);
    if (per_thread <= 2) return go(act_f16_kernel<2, F>);
    if (per_thread <= 4) return go(act_f16_kernel<4, F>);
    if (per_thread <= kActMaxNV) return go(act_f16_kernel<kActMaxNV, F>);
    go(act_f16_kernel<0, F>);
  };
  if (frag)
    pick(std::true_type{});
  else
    pick(std::false_type{});
}

}  // namespace smolrt::cuda
