// Decode matrix-vector kernels (see gemv.h). At decode sizes these are latency-bound: weights are
// fetched into registers before the PDL wait, x is staged once per block through padded shared
// memory (coalesced global loads, conflict-free float4 reads), and each warp's slice of x then
// lives in registers for the whole dot product. Every weight format goes through the same kernel:
// what differs per format is its QFormat description (qformat.h).
#include "cuda/gemv.h"

#include <climits>
#include <cstddef>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/argmax_block.cuh"
#include "cuda/device_common.cuh"
#include "cuda/gemv_head.h"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

enum class Epi { Plain, Qkv, GateUp };

struct GemvParams {
  DevMat m0, m1, m2;  // Plain: m0. Qkv: q, k, v. GateUp: gate, up.
  int off1, off2;     // Qkv: first row of K and of V in the concatenated [Q; K; V] row space
  int n_items;        // work items (each produces two rows)
  int slices;         // SLICED kernels: warps per item, each a pass of the columns (1..8)
  const float* x;
  const float* norm_w;
  float eps;
  ResidualIn res;  // a pending residual update of x (all null: none)
  float* out0;
  float* out1;
  float* out2;
  int accumulate;
  int head_dim, rope_dim, kv_dim, rope;
  int kv_half;  // Qkv with rope: out1/out2 are fp16 caches
  int act;      // GateUp: gate_act's activation (0 SiLU, 1 GELU-tanh)
  float rope_base;
  const int* pos;
  const int* slot;  // Qkv: K/V cache row (nullptr: the position)
  float* part_v;    // Plain: per-block argmax partials (nullptr: none), see gemv_argmax
  int* part_i;
};

// Threads per block, fixed: the staging loops' trip counts derive from it. Small matrices get fewer
// blocks than SMs, which is fine: at decode sizes they are latency-bound, not bandwidth-bound.
// 256 runs the whole decode step fastest: some kernels alone are faster with other sizes, but the
// chain of mixed kernels is what a step pays for.
constexpr int kBlock = 256;
constexpr int kMaxBlocks = 132 * 4;

template <GgmlType T>
constexpr bool is_block() {
  return QFormat<T>::kLayout.block;
}
// 32-column units per block of the format (1, or 8 for the K-quants' 256-weight super-blocks).
template <GgmlType T>
constexpr int units_per_block() {
  return QFormat<T>::kLayout.qk / 32;
}
// Columns one pass covers with NX register floats of x per lane.
template <int NX>
constexpr int pass_cols() {
  return 32 * NX;
}

// Shared-memory slot of column c. Block formats pad every 32-column unit to 36 floats, so the
// float4 reads of lanes owning consecutive units (144 B apart) hit distinct banks.
template <GgmlType T>
__device__ __forceinline__ int xs_index(int c) {
  if constexpr (is_block<T>()) {
    return (c >> 5) * 36 + (c & 31);
  } else {
    return c;
  }
}

template <GgmlType T>
__host__ __device__ constexpr size_t xs_bytes(int cols) {
  const size_t n = is_block<T>() ? (size_t)(cols / 32) * 36 : (size_t)cols;
  return (n * sizeof(float) + 15) & ~size_t{15};
}
static_assert(xs_bytes<GgmlType::Q4_0>(kGemvMaxCols) <= kMaxBlockSmem,
              "kGemvMaxCols: the padded fp32 x must fit one block's shared memory");

// The int8 path (qformat.h XQ): kernels whose weight types both describe unit pairs (the
// K-quants: load_pair / idot_pair) may take x quantized per 32-column unit to two int8 levels and
// run their dot products on DP4A (I8, chosen per launch from the rows per block: kI8MinRows).
// A lane takes a pair of units per row, the two that share their quant bytes, so a pass covers
// 2,048 columns (NX = 64) and x stays in shared memory, read per item. The fp32 path spends
// several instructions per weight unpacking and multiplying, so wide K-quant matrices are
// issue-bound there rather than memory-bound.
template <GgmlType T>
constexpr bool has_pairs() {
  return requires {
    QFormat<T>::kPairStep;
  };
}
template <GgmlType T, GgmlType TV>
constexpr bool kI8 = has_pairs<T>() && has_pairs<TV>();
constexpr int kI8Nx = 64;  // the int8 path's pass: 32 lanes x 2 units

// The quantized x in shared memory, per 32-column unit: hi words 0..7, lo words 8..15, scale, sum,
// 2 words of padding (80 bytes, so the 16-byte reads of 8 lanes owning consecutive units hit
// distinct banks).
constexpr int kXqWords = 20;
size_t xq_bytes(int cols) {
  return (size_t)(cols / 32) * kXqWords * sizeof(uint32_t);
}

// RMSNorm scale 1/sqrt(mean(x^2) + eps) from each thread's partial sum of squares: warp sums,
// then one shared-memory pass over the NT/32 warp totals. Every thread of the block must call it.
template <int NT>
__device__ __forceinline__ float block_rms_scale(float ss, float* red, int lane, int cols,
                                                 float eps) {
  ss = warp_sum(ss);
  if (lane == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < NT / 32; ++k) total += red[k];
  return rsqrtf(total / (float)cols + eps);
}

// Per-float4 pieces of the staging, each in one fixed order of operations (with sum_sq,
// device_common.cuh): v + r * s * w (a pending residual update, s its RMSNorm scale); v * s * w
// (the fused RMSNorm).
__device__ __forceinline__ float4 add_scaled(float4 v, float4 r, float s, float4 w) {
  v.x += r.x * s * w.x, v.y += r.y * s * w.y, v.z += r.z * s * w.z, v.w += r.w * s * w.w;
  return v;
}
__device__ __forceinline__ float4 scaled(float4 v, float s, float4 w) {
  return make_float4(v.x * s * w.x, v.y * s * w.y, v.z * s * w.z, v.w * s * w.w);
}

// kB float4s p[c0 + b * nt] (zero past n4) into registers, all loads issued before any use.
template <int kB, int nt>
__device__ __forceinline__ void load_batch(float4 (&r)[kB], const float4* p, int c0, int n4) {
#pragma unroll
  for (int b = 0; b < kB; ++b)
    r[b] = c0 + b * nt < n4 ? p[c0 + b * nt] : make_float4(0.f, 0.f, 0.f, 0.f);
}

// The block stages x (normalized when norm_w is set: one block reduction) in shared memory. All
// threads must call this. One-pass kernels (WIDE false, cols <= pass_cols<NX>()) unroll the
// global loads of x and norm_w with a fixed trip count so they are all in flight at once: a rolled
// loop here costs one L2 round trip per iteration, which dominated small matrices. Wider matrices
// take a rolled loop and normalize in a second sweep over shared memory.
// With a pending residual update (ri.res set), the staged x is x + rmsnorm(res)·res_norm (one more
// block reduction, over res), which block 0 also writes to ri.x_out.
template <GgmlType T, int NX, bool WIDE>
__device__ __forceinline__ void stage_x(float* xs, const float* x, const float* norm_w, float eps,
                                        int cols, int lane, const ResidualIn& ri) {
  __shared__ float red[kBlock / 32], red_res[kBlock / 32];
  constexpr int nt = kBlock;
  const bool vec = is_block<T>() || cols % 4 == 0;  // float4 loads (block formats: always)
  const bool upd = ri.res != nullptr, writer = upd && blockIdx.x == 0;
  if (WIDE || !vec) {
    // Rolled loops over the columns, their global loads issued kB float4s per thread at a time
    // (one memory round trip per batch, not per trip).
    constexpr int kB = 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* r4 = reinterpret_cast<const float4*>(ri.res);
    const float4* rw4 = reinterpret_cast<const float4*>(ri.res_norm);
    const float4* w4 = reinterpret_cast<const float4*>(norm_w);
    const int n4 = cols / 4;
    float rs = 0.f;  // the update's RMSNorm scale
    if (upd) {
      float ss = 0.f;
      if (vec) {
        for (int c0 = threadIdx.x; c0 < n4; c0 += kB * nt) {
          float4 r[kB];
          load_batch<kB, nt>(r, r4, c0, n4);
#pragma unroll
          for (int b = 0; b < kB; ++b) ss += sum_sq(r[b]);
        }
      } else {
        for (int c = threadIdx.x; c < cols; c += nt) ss += ri.res[c] * ri.res[c];
      }
      rs = block_rms_scale<nt>(ss, red_res, lane, cols, eps);
    }
    float ss = 0.f;
    if (vec) {
      for (int c0 = threadIdx.x; c0 < n4; c0 += kB * nt) {
        float4 v[kB], r[kB], w[kB];
        load_batch<kB, nt>(v, x4, c0, n4);
        if (upd) {
          load_batch<kB, nt>(r, r4, c0, n4);
          load_batch<kB, nt>(w, rw4, c0, n4);
        }
#pragma unroll
        for (int b = 0; b < kB; ++b) {
          const int c4 = c0 + b * nt;
          if (c4 >= n4) break;
          if (upd) {
            v[b] = add_scaled(v[b], r[b], rs, w[b]);
            if (writer) reinterpret_cast<float4*>(ri.x_out)[c4] = v[b];
          }
          ss += sum_sq(v[b]);
          *reinterpret_cast<float4*>(xs + xs_index<T>(4 * c4)) = v[b];
        }
      }
    } else {
      for (int c = threadIdx.x; c < cols; c += nt) {
        float v = x[c];
        if (upd) {
          v += ri.res[c] * rs * ri.res_norm[c];
          if (writer) ri.x_out[c] = v;
        }
        ss += v * v;
        xs[xs_index<T>(c)] = v;
      }
    }
    if (norm_w != nullptr) {
      const float scale = block_rms_scale<nt>(ss, red, lane, cols, eps);
      if (vec) {
        for (int c0 = threadIdx.x; c0 < n4; c0 += kB * nt) {
          float4 w[kB];
          load_batch<kB, nt>(w, w4, c0, n4);
#pragma unroll
          for (int b = 0; b < kB; ++b) {
            const int c4 = c0 + b * nt;
            if (c4 >= n4) break;
            float4* d = reinterpret_cast<float4*>(xs + xs_index<T>(4 * c4));
            *d = scaled(*d, scale, w[b]);
          }
        }
      } else {
        for (int c = threadIdx.x; c < cols; c += nt)
          xs[xs_index<T>(c)] = xs[xs_index<T>(c)] * scale * norm_w[c];
      }
    }
    __syncthreads();
    return;
  }
  // cols <= 32*NX over kBlock threads: at most ceil(8*NX / kBlock) float4 per thread.
  constexpr int MV = (NX * 32 / 4 + kBlock - 1) / kBlock;
  const int n4 = cols / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const float4* w4 = reinterpret_cast<const float4*>(norm_w);
  float4 v[MV], w[MV];
  const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < MV; ++i) {
    const int c4 = threadIdx.x + i * nt;
    v[i] = c4 < n4 ? x4[c4] : z;
    if (norm_w != nullptr) w[i] = c4 < n4 ? w4[c4] : z;
  }
  if (upd) {
    float4 r[MV], rw[MV];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < MV; ++i) {
      const int c4 = threadIdx.x + i * nt;
      r[i] = c4 < n4 ? reinterpret_cast<const float4*>(ri.res)[c4] : z;
      rw[i] = c4 < n4 ? reinterpret_cast<const float4*>(ri.res_norm)[c4] : z;
      ss += sum_sq(r[i]);
    }
    const float rs = block_rms_scale<nt>(ss, red_res, lane, cols, eps);
#pragma unroll
    for (int i = 0; i < MV; ++i) {
      v[i] = add_scaled(v[i], r[i], rs, rw[i]);
      const int c4 = threadIdx.x + i * nt;
      if (writer && c4 < n4) reinterpret_cast<float4*>(ri.x_out)[c4] = v[i];
    }
  }
  if (norm_w != nullptr) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < MV; ++i) ss += sum_sq(v[i]);
    const float scale = block_rms_scale<nt>(ss, red, lane, cols, eps);
#pragma unroll
    for (int i = 0; i < MV; ++i) v[i] = scaled(v[i], scale, w[i]);
  }
#pragma unroll
  for (int i = 0; i < MV; ++i) {
    const int c4 = threadIdx.x + i * nt;
    if (c4 < n4) *reinterpret_cast<float4*>(xs + xs_index<T>(4 * c4)) = v[i];
  }
  __syncthreads();
}

// This lane's slice of pass `ps` of x into registers (block formats: units ps*32*NU + lane + 32k,
// 32 slots each; float formats: columns ps*pass + lane + 32j). Zeros past the end.
template <GgmlType T, int NX>
__device__ __forceinline__ void load_xr(float (&xr)[NX], const float* xs, int ps, int cols,
                                        int lane) {
  if constexpr (is_block<T>()) {
    const int nu = cols / 32;
#pragma unroll
    for (int k = 0; k < NX / 32; ++k) {
      const int u = ps * NX + lane + 32 * k;
      const float4* src = reinterpret_cast<const float4*>(xs + u * 36);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 f = u < nu ? src[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        xr[k * 32 + 4 * i + 0] = f.x;
        xr[k * 32 + 4 * i + 1] = f.y;
        xr[k * 32 + 4 * i + 2] = f.z;
        xr[k * 32 + 4 * i + 3] = f.w;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < NX; ++j) {
      const int c = ps * pass_cols<NX>() + lane + 32 * j;
      xr[j] = c < cols ? xs[c] : 0.f;
    }
  }
}

// The staged x (stage_x's fp32 in xs) quantized to xq (kXqWords per unit, after xs in shared
// memory) by the whole block, 8 consecutive threads per unit, one barrier at the end. Columns are
// whole 256-column super-blocks (int8 path: K-quants), so a warp is all in or all out of a trip
// (the shuffles need all lanes).
template <GgmlType T>
__device__ __forceinline__ void quantize_staged(const float* xs, uint32_t* xq, int cols) {
  const int n4 = cols / 4;
  for (int c4 = threadIdx.x; c4 < n4; c4 += kBlock) {
    uint32_t hi, lo;
    float sc, sum;
    quantize_x4<true>(*reinterpret_cast<const float4*>(xs + xs_index<T>(4 * c4)), hi, lo, sc, sum);
    uint32_t* q = xq + (c4 >> 3) * kXqWords;
    q[c4 & 7] = hi;
    q[8 + (c4 & 7)] = lo;
    if ((c4 & 7) == 0) *reinterpret_cast<float2*>(q + 16) = make_float2(sc, sum);
  }
  __syncthreads();
}

// A lane's slice of x for one pass: fp32 registers (xr, and the unit sums xsm for formats with a
// minimum), or on the int8 path the quantized x in shared memory, whose units the dot products
// read per item (which units a lane takes depends on the weight format: qformat.h pair_first).
template <GgmlType T, GgmlType TV, int NX, bool I8>
struct XSlice {
  float xr[NX], xsm[NX / 32];
  __device__ __forceinline__ void load(const float* xs, const uint32_t*, int ps, int cols,
                                       int lane);
};
template <GgmlType T, GgmlType TV, int NX>
struct XSlice<T, TV, NX, true> {
  static_assert(NX == kI8Nx, "the int8 path takes a unit pair per lane and pass");
  const uint32_t* xq;
  __device__ __forceinline__ void load(const float*, const uint32_t* q, int, int, int) { xq = q; }
  __device__ __forceinline__ XQ unit(int u) const {
    const uint4* p = reinterpret_cast<const uint4*>(xq + u * kXqWords);
    const float2 f = *reinterpret_cast<const float2*>(xq + u * kXqWords + 16);
    return XQ{p[0], p[1], p[2], p[3], f.x, f.y};
  }
};

// The sums of this lane's 32-column units of x (xsum of QFormat::dot), for formats with a minimum:
// once per slice of x, not once per row of every item.
template <GgmlType T, GgmlType TV, int NX>
__device__ __forceinline__ void unit_sums(const float (&xr)[NX], float (&xsm)[NX / 32]) {
#pragma unroll
  for (int k = 0; k < NX / 32; ++k) {
    xsm[k] = 0.f;
    if constexpr (QFormat<T>::kLayout.xsum || QFormat<TV>::kLayout.xsum) {
      xsm[k] = x_sum32(xr + k * 32);
      // Pinned here: without it the compiler sinks the sum back into the item loop (its only
      // use), where it costs 32 adds per item.
      asm volatile("" : "+f"(xsm[k]));
    }
  }
}

template <GgmlType T, GgmlType TV, int NX, bool I8>
__device__ __forceinline__ void XSlice<T, TV, NX, I8>::load(const float* xs, const uint32_t*,
                                                            int ps, int cols, int lane) {
  load_xr<T, NX>(xr, xs, ps, cols, lane);
  unit_sums<T, TV, NX>(xr, xsm);
}

// Two rows' units of one pass held in registers (block formats; empty for float formats, whose
// loads are issued in dot2, coalesced across the warp): NX / 32 units per lane and row, or on the
// int8 path one unit pair. Loaded BEFORE pdl_wait where possible (weights never depend on the
// previous kernel), so their DRAM latency overlaps the previous kernel's tail.
template <GgmlType T, int NX, bool I8, bool B = is_block<T>()>
struct WRegs {};
template <GgmlType T, int NX, bool I8>
struct WRegs<T, NX, I8, true> {
  static constexpr int kN = I8 ? 1 : NX / 32;
  typename QFormat<T>::Raw a[kN], b[kN];
};

template <GgmlType T, int NX, bool I8>
__device__ __forceinline__ void load_w(WRegs<T, NX, I8>& w, const DevMat& ma, int ra,
                                       const DevMat& mb, int rb, int lane, int ps) {
  if constexpr (I8) {
    using F = QFormat<T>;
    const int g = ps * 32 + lane;  // the lane's unit pair: super-block g / 4, group g % 4
    if (g < ma.cols / 64) {
      const int nb = ma.cols / 256;
      w.a[0] = F::load_pair(ma.q, ma.d, (size_t)ra * nb + g / 4, g % 4);
      w.b[0] = F::load_pair(mb.q, mb.d, (size_t)rb * nb + g / 4, g % 4);
    }
  } else if constexpr (is_block<T>()) {
    using F = QFormat<T>;
    constexpr int upb = units_per_block<T>();
    const int nu = ma.cols / 32, nb = ma.cols / F::kLayout.qk;
#pragma unroll
    for (int k = 0; k < NX / 32; ++k) {
      const int u = ps * NX + lane + 32 * k;
      if (u < nu) {
        const int blk = u / upb, j = u % upb;
        w.a[k] = F::load(ma.q, ma.d, (size_t)ra * nb + blk, j);
        w.b[k] = F::load(mb.q, mb.d, (size_t)rb * nb + blk, j);
      }
    }
  }
}

// Partial dot products of rows ra of ma and rb of mb with this lane's slice of pass ps of x.
template <GgmlType T, int NX, bool I8, class XS>
__device__ __forceinline__ void dot2(const WRegs<T, NX, I8>& w, const DevMat& ma, int ra,
                                     const DevMat& mb, int rb, const XS& x, int lane, int ps,
                                     float& pa, float& pb) {
  using F = QFormat<T>;
  float sa = 0.f, sb = 0.f;
  const int cols = ma.cols;
  if constexpr (I8) {
    const int g = ps * 32 + lane;
    if (g < cols / 64) {
      const int u = 8 * (g / 4) + F::pair_first(g % 4);
      const XQ x0 = x.unit(u), x1 = x.unit(u + F::kPairStep);
      sa = F::idot_pair(w.a[0], x0, x1);
      sb = F::idot_pair(w.b[0], x0, x1);
    }
  } else if constexpr (is_block<T>()) {
    const int nu = cols / 32;
#pragma unroll
    for (int k = 0; k < NX / 32; ++k) {
      if (ps * NX + lane + 32 * k < nu) {
        sa += F::dot(w.a[k], x.xr + k * 32, x.xsm[k]);
        sb += F::dot(w.b[k], x.xr + k * 32, x.xsm[k]);
      }
    }
  } else {
    const size_t oa = (size_t)ra * cols, ob = (size_t)rb * cols;
#pragma unroll
    for (int j = 0; j < NX; ++j) {
      const int c = ps * pass_cols<NX>() + lane + 32 * j;
      if (c < cols) {
        sa += F::elem(ma.q, oa + c) * x.xr[j];
        sb += F::elem(mb.q, ob + c) * x.xr[j];
      }
    }
  }
  pa = sa;
  pb = sb;
}

// The two rows work item `item` computes (Qkv: seg = 0/1/2 for Q/K/V).
template <Epi E>
struct ItemRows {
  const DevMat* ma;
  const DevMat* mb;
  int ra, rb, seg;
  __device__ __forceinline__ ItemRows(const GemvParams& p, int item) {
    ma = mb = &p.m0;
    seg = 0;
    if constexpr (E == Epi::Plain) {
      ra = 2 * item;
      rb = ra + 1 < p.m0.rows ? ra + 1 : ra;  // odd row count: recompute, drop
    } else if constexpr (E == Epi::GateUp) {
      mb = &p.m1;
      ra = rb = item;
    } else {
      const int g = 2 * item;
      seg = g < p.off1 ? 0 : (g < p.off2 ? 1 : 2);
      ma = mb = seg == 0 ? &p.m0 : (seg == 1 ? &p.m1 : &p.m2);
      ra = g - (seg == 0 ? 0 : (seg == 1 ? p.off1 : p.off2));
      rb = ra + 1;
    }
  }
};

// The weights of one work item in registers. T is the matrices' type; Qkv kernels may take V in
// a second type TV (K-quant mixtures give attn_v more bits: Q6_K, or Q8_0 where rows are not
// whole super-blocks), so the three projections stay one launch: the item's segment (warp-uniform)
// picks the registers and the code.
template <GgmlType T, GgmlType TV, int NX, bool I8>
struct ItemW {
  // One item is of one segment, so a mixture's two register sets share storage: the union halves
  // the registers of the weights in flight (this one and the prefetched next).
  union {
    WRegs<T, NX, I8> w;
    WRegs<TV, NX, I8> v;
  };
  template <Epi E>
  __device__ __forceinline__ void load(const ItemRows<E>& ir, int lane, int ps) {
    if (T != TV && ir.seg == 2) {
      load_w<TV, NX, I8>(v, *ir.ma, ir.ra, *ir.mb, ir.rb, lane, ps);
    } else {
      load_w<T, NX, I8>(w, *ir.ma, ir.ra, *ir.mb, ir.rb, lane, ps);
    }
  }
  template <Epi E, class XS>
  __device__ __forceinline__ void dot(const ItemRows<E>& ir, const XS& x, int lane, int ps,
                                      float& pa, float& pb) const {
    if (T != TV && ir.seg == 2) {
      dot2<TV, NX, I8>(v, *ir.ma, ir.ra, *ir.mb, ir.rb, x, lane, ps, pa, pb);
    } else {
      dot2<T, NX, I8>(w, *ir.ma, ir.ra, *ir.mb, ir.rb, x, lane, ps, pa, pb);
    }
  }
};

// Epilogue inputs that do not depend on the dot products, fetched or computed before them so
// their latency overlaps the x staging and the math instead of trailing the warp sums (an L2 round
// trip, or powf + sincosf, on every step's critical path). Plain with accumulate: the rows of
// out0. Qkv: the RoPE rotation (a = cos, b = sin) of the item's row pair, when it has one.
struct PreEpi {
  float a = 0.f, b = 0.f;
  bool rot = false;
};

template <Epi E>
__device__ __forceinline__ PreEpi pre_epi(const GemvParams& p, const ItemRows<E>& ir, int pos) {
  PreEpi e;
  if constexpr (E == Epi::Plain) {
    if (p.accumulate) {
      e.a = p.out0[ir.ra];
      if (ir.rb != ir.ra) e.b = p.out0[ir.rb];
    }
  } else if constexpr (E == Epi::Qkv) {
    const int i = (ir.ra % p.head_dim) / 2;
    if (p.rope && ir.seg < 2 && 2 * i < p.rope_dim) {
      const float theta = (float)pos * rope_inv_freq(i, p.rope_dim, p.rope_base);
      sincosf(theta, &e.b, &e.a);
      e.rot = true;
    }
  }
  return e;
}

// The K-quants' kernels are held to two blocks per SM (128 registers; a few bytes of spills for
// Q5_K and the Q4_K+Q6_K projections): at one block per SM (150-250 registers unbounded) eight
// warps per SM keep too few weight bytes in flight.
// K-quant kernels (either matrix type with 256-weight super-blocks) take x in 32 registers per
// lane, passes of 1,024 columns, on the fp32 path; host-side mirror: plan_launch.
template <GgmlType T, GgmlType TV>
constexpr bool kHeavy = QFormat<T>::kLayout.qk > 32 || QFormat<TV>::kLayout.qk > 32;
template <GgmlType T, GgmlType TV>
constexpr int kMinBlocks() {
  return kHeavy<T, TV> ? 2 : 1;
}

// How a kernel walks the columns: ONE pass (cols <= pass_cols<NX>()), SLICED (p.slices warps of
// one block per item, warp s taking pass s: 2 to 8 passes), SLICED_LOOP (more than 8 passes: the
// 8 warps of an item walk passes s, s + 8, ...).
enum class Cols { One, Sliced, SlicedLoop };

// Warps stride over work items (grid capped for large matrices such as the lm_head, so the x
// staging is amortized over several items). ONE and SLICED warps hold one fixed slice of x in
// registers for all their items and load the next item's weights while the current one is
// computed; SLICED items' slice sums meet in shared memory. SLICED_LOOP warps reload x from shared
// memory per pass.
// (Serial passes in one warp would put one DRAM round trip per pass on the critical path and, at
// 2,048 columns, need so many registers per thread that one block fits per SM.)
template <GgmlType T, int NX, Epi E, Cols C, GgmlType TV, bool I8>
__global__ void __launch_bounds__(kBlock, kMinBlocks<T, TV>()) gemv_kernel(const GemvParams p) {
  constexpr bool SLICED = C != Cols::One;
  constexpr bool one = C != Cols::SlicedLoop;  // one pass per warp
  constexpr int kWarps = kBlock / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int S = SLICED ? p.slices : 1;  // warps per item
  const int R = kWarps / S;             // items per block and round
  const int sl = SLICED ? warp % S : 0, r = warp / S;
  const int cols = p.m0.cols;
  const int passes = (cols + pass_cols<NX>() - 1) / pass_cols<NX>();
  const int stride = gridDim.x * R;
  // Rounds are block-uniform (every warp runs them all: the slices' reduction syncs the block).
  const int first = blockIdx.x * R;
  int item = first + r;
  const bool in_block = r < R;  // warps past R * S idle (e.g. 3 slices: warps 6 and 7)

  ItemW<T, TV, NX, I8> w;
  if (in_block && item < p.n_items) w.load(ItemRows<E>(p, item), lane, sl);
  pdl_wait();
  pdl_trigger();
  int pos = 0, kv_row = 0;
  if constexpr (E == Epi::Qkv) {  // issued early: overlaps the x staging
    pos = *p.pos;
    kv_row = p.slot ? *p.slot : pos;
  }
  // The first item's epilogue inputs (by the warp that writes the item: slice 0). Residual rows:
  // loads issued by lane 0 before the staging, in flight during it. RoPE angle: computed by every
  // lane (the same value across the warp, no divergent branch) after the staging's loads, so it
  // interleaves with the math.
  constexpr bool kEpiAllLanes = E == Epi::Qkv;
  const bool writer = in_block && sl == 0;
  PreEpi pe;
  if (!kEpiAllLanes && writer && lane == 0 && item < p.n_items) {
    pe = pre_epi<E>(p, ItemRows<E>(p, item), pos);
  }
  extern __shared__ float4 smem_x4[];
  float* xs = reinterpret_cast<float*>(smem_x4);
  stage_x<T, NX, SLICED>(xs, p.x, p.norm_w, p.eps, cols, lane, p.res);
  uint32_t* xq = reinterpret_cast<uint32_t*>(xs + xs_bytes<T>(cols) / sizeof(float));
  if constexpr (I8) quantize_staged<T>(xs, xq, cols);
  XSlice<T, TV, NX, I8> x;
  if constexpr (one) x.load(xs, xq, sl, cols, lane);
  if (kEpiAllLanes && writer && item < p.n_items) pe = pre_epi<E>(p, ItemRows<E>(p, item), pos);

  __shared__ float2 part[2][kWarps];  // SLICED: per round (parity) and warp, its two sums
  float best_v = 0.f;                 // Plain + argmax: lane 0's best row so far
  int best_i = INT_MAX;
  for (int base = first, round = 0; base < p.n_items; base += stride, item += stride, ++round) {
    const bool valid = in_block && item < p.n_items;
    const ItemRows<E> ir(p, valid ? item : 0);
    const PreEpi cur = pe;
    const bool more = valid && item + stride < p.n_items;
    if (more && writer && (kEpiAllLanes || lane == 0)) {
      pe = pre_epi<E>(p, ItemRows<E>(p, item + stride), pos);
    }
    float va = 0.f, vb = 0.f;
    if (valid) {
      if constexpr (one) {
        ItemW<T, TV, NX, I8> wn;
        if (more) wn.load(ItemRows<E>(p, item + stride), lane, sl);
        w.dot(ir, x, lane, sl, va, vb);
        w = wn;
      } else {
        for (int ps = sl; ps < passes; ps += S) {
          if (ps > sl) w.load(ir, lane, ps);
          x.load(xs, xq, ps, cols, lane);
          float a, b;
          w.dot(ir, x, lane, ps, a, b);
          va += a;
          vb += b;
        }
        if (more) w.load(ItemRows<E>(p, item + stride), lane, sl);
      }
      va = warp_sum(va);
      vb = warp_sum(vb);
    }
    if constexpr (SLICED) {
      // Double-buffered by round parity: a round's writes never meet the previous round's reads
      // (those finished before their warp reached this round's barrier).
      float2* pr = part[round & 1];
      if (lane == 0) pr[warp] = make_float2(va, vb);
      __syncthreads();
      if (writer && lane == 0) {
        va = vb = 0.f;
        for (int k = 0; k < S; ++k) {  // fixed order: deterministic sums
          va += pr[r * S + k].x;
          vb += pr[r * S + k].y;
        }
      }
    }
    if (!valid || !writer || lane != 0) continue;

    const int ra = ir.ra, rb = ir.rb, seg = ir.seg;
    if constexpr (E == Epi::Plain) {
      p.out0[ra] = p.accumulate ? cur.a + va : va;
      if (rb != ra) p.out0[rb] = p.accumulate ? cur.b + vb : vb;
      if (p.part_v != nullptr) {
        if (!isnan(va) && amax_beats(va, ra, best_v, best_i)) best_v = va, best_i = ra;
        if (rb != ra && !isnan(vb) && amax_beats(vb, rb, best_v, best_i)) best_v = vb, best_i = rb;
      }
    } else if constexpr (E == Epi::GateUp) {
      p.out0[item] = gate_act(va, p.act) * vb;
    } else {
      if (cur.rot) {
        const float a = va, b = vb;
        va = a * cur.a - b * cur.b;
        vb = a * cur.b + b * cur.a;
      }
      float* dst = seg == 0 ? p.out0 : (seg == 1 ? p.out1 : p.out2);
      if (seg > 0 && p.rope && p.kv_half) {
        __half* h = reinterpret_cast<__half*>(dst) + (size_t)kv_row * p.kv_dim;
        h[ra] = __float2half_rn(va);
        h[ra + 1] = __float2half_rn(vb);
        continue;
      }
      if (seg > 0 && p.rope) dst += (size_t)kv_row * p.kv_dim;
      dst[ra] = va;
      dst[ra + 1] = vb;
    }
  }
  if constexpr (E == Epi::Plain) {
    // Fused argmax stage 1: one partial per block (saves a kernel and a re-read of the logits).
    if (p.part_v != nullptr) {
      __shared__ float sv[kWarps];
      __shared__ int si[kWarps];
      block_argmax<kBlock>(best_v, best_i, sv, si);
      if (threadIdx.x == 0) {
        p.part_v[blockIdx.x] = best_v;
        p.part_i[blockIdx.x] = best_i;
      }
    }
  }
}

// Grid size: one block per round of items (kBlock/32 / slices of them), at most max_blocks
// (default kMaxBlocks, 4 per SM of a 132-SM Hopper); beyond that blocks loop.
int grid_blocks(int n_items, int slices, int max_blocks, bool heavy) {
  const int per_block = (kBlock / 32) / slices;
  int cap = max_blocks > 0 ? max_blocks : kMaxBlocks;
  // Sliced kernels stage all of a wide x per block: one resident wave (2 blocks per SM) that
  // loops over the items stages it once per block. The K-quants' kernels (2 blocks per SM, see
  // kMinBlocks) take one resident wave too: a second wave's blocks start late, stage x again and
  // have their first weights in flight only after the first wave's leave.
  if ((slices > 1 || heavy) && cap > 2 * sm_count()) cap = 2 * sm_count();
  const int blocks = (n_items + per_block - 1) / per_block;
  return blocks < cap ? blocks : cap;
}

// The int8 path pays for quantizing the block's x once (~45 instructions per 4 columns and a
// barrier, after the PDL wait: on the critical path) and saves instructions on every row the block
// computes, so it is taken from kI8MinRows weight rows per block, or where the fp32 path's blocks
// would loop over several rounds of items (the unit pairs' 2,048-column passes halve the slices,
// so the rounds too, and the quantizing is amortized over them). Below that (e.g. 8 rows per
// block in one round) the quantizing costs more than it saves, so such matrices stay on the fp32
// path.
constexpr int kI8MinRows = 10;

// How one launch runs: x registers per lane (nx: pass_cols<nx>() columns a pass; 1,024 for the
// K-quants' fp32 path, whose units take more registers, and for narrow inputs, else 2,048; the
// int8 path's unit pairs, 2,048), whether x takes the int8 path, warps per item (wider inputs
// than one pass: one warp per pass, up to 8; beyond that a warp walks several passes) and blocks.
struct Plan {
  int nx;
  bool i8;
  int slices, grid;
};

// heavy: kHeavy (a 256-weight super-block format); pairs: kI8 (both types describe unit pairs).
Plan plan_launch(bool heavy, bool pairs, int n_items, int cols, int max_blocks) {
  auto with = [&](int nx, bool i8) {
    const int pass = 32 * nx, passes = (cols + pass - 1) / pass;
    const int slices = passes < kBlock / 32 ? passes : kBlock / 32;
    return Plan{nx, i8, slices, grid_blocks(n_items, slices, max_blocks, heavy)};
  };
  const Plan fp = with(heavy || cols <= pass_cols<32>() ? 32 : 64, false);
  if (pairs) {
    // (Inputs so wide that x's two copies pass the shared-memory limit, above ~33k columns,
    // keep the fp32 path.)
    const Plan pl = with(kI8Nx, true);
    const bool fp_loops = (long)fp.grid * ((kBlock / 32) / fp.slices) < n_items;
    if ((2 * n_items >= kI8MinRows * pl.grid || fp_loops) &&
        xs_bytes<GgmlType::Q4_K>(cols) + xq_bytes(cols) <= (size_t)kMaxBlockSmem) {
      return pl;
    }
  }
  return fp;
}

template <GgmlType T, int NX, Epi E, Cols C, GgmlType TV, bool I8>
void launch_nx(GemvParams p, const Plan& pl, const Launch& s) {
  const int cols = p.m0.cols;
  const size_t smem = xs_bytes<T>(cols) + (I8 ? xq_bytes(cols) : 0);
  p.slices = C == Cols::One ? 1 : pl.slices;
  auto* kernel = gemv_kernel<T, NX, E, C, TV, I8>;
  if (smem > 48 * 1024) {
    // Wide inputs: raise this instantiation's dynamic shared-memory limit (once is enough, but
    // the call is cheap and not a stream operation, so graph capture is unaffected).
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  }
  launch_kernel(kernel, dim3(pl.grid), dim3(kBlock), smem, s, p);
}

template <GgmlType T, int NX, Epi E, GgmlType TV, bool I8>
void launch_cols(const GemvParams& p, const Plan& pl, const Launch& s) {
  const int passes = (p.m0.cols + pass_cols<NX>() - 1) / pass_cols<NX>();
  if (passes == 1) {
    launch_nx<T, NX, E, Cols::One, TV, I8>(p, pl, s);
  } else if (passes <= kBlock / 32) {
    launch_nx<T, NX, E, Cols::Sliced, TV, I8>(p, pl, s);
  } else {
    launch_nx<T, NX, E, Cols::SlicedLoop, TV, I8>(p, pl, s);
  }
}

template <GgmlType T, Epi E, GgmlType TV = T>
void launch_t(const GemvParams& p, const Launch& s, int max_blocks) {
  const Plan pl = plan_launch(kHeavy<T, TV>, kI8<T, TV>, p.n_items, p.m0.cols, max_blocks);
  if constexpr (kI8<T, TV>) {
    if (pl.i8) return launch_cols<T, kI8Nx, E, TV, true>(p, pl, s);
  }
  if constexpr (kHeavy<T, TV>) {
    launch_cols<T, 32, E, TV, false>(p, pl, s);
  } else if (pl.nx == 32) {
    launch_nx<T, 32, E, Cols::One, TV, false>(p, pl, s);
  } else {
    launch_cols<T, 64, E, TV, false>(p, pl, s);
  }
}

// The one dispatch place from runtime weight type to kernel template (qformat.h's table).
template <Epi E>
void dispatch(const GemvParams& p, const Launch& s, int max_blocks = 0) {
  const bool ok = dispatch_format(
      p.m0.type, [&](auto tag) { launch_t<decltype(tag)::value, E>(p, s, max_blocks); });
  if (!ok) {
    fail("gemv: no CUDA matrix-vector kernel for type ", type_name(p.m0.type),
         "; supported: ", format_names());
  }
}

void check_mat(const DevMat& w, const char* what) {
  if (w.q == nullptr || w.rows <= 0 || w.cols <= 0) fail("gemv: ", what, " is empty");
  const DevLayout l = dev_layout(w.type);
  if (l.qk == 0) {
    fail("gemv: ", what, " has type ", type_name(w.type),
         ", which has no CUDA kernel; supported: ", format_names());
  }
  if (w.cols > kGemvMaxCols) {
    fail("gemv: ", what, " has ", w.cols, " columns; the CUDA decode matvec stages at most ",
         kGemvMaxCols, " in shared memory; use --backend cpu");
  }
  if (l.block && (w.cols % l.qk != 0 || w.d == nullptr)) {
    fail("gemv: ", what, " is ", type_name(w.type), " with ", w.cols,
         " columns (need a multiple of ", l.qk, " and the split layout's meta bytes)");
  }
}

void check_res(const ResidualIn& r, const float* x, const char* who) {
  if (!r.res && !r.res_norm && !r.x_out) return;
  if (!r.res || !r.res_norm || !r.x_out || r.x_out == x)
    fail(who, ": a pending residual update needs res, res_norm and an x_out other than x");
}

GemvParams base_params(const float* x, const float* norm_w, float eps) {
  GemvParams p = {};
  p.x = x;
  p.norm_w = norm_w;
  p.eps = eps;
  p.pos = nullptr;
  return p;
}

}  // namespace

bool gemv_int8_x(GgmlType t) {
  bool r = false;
  dispatch_format(t, [&](auto tag) { r = has_pairs<decltype(tag)::value>(); });
  return r;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

void gemv(const DevMat& w, const float* x, const float* norm_w, float eps, float* out,
          bool accumulate, const Launch& s) {
  check_mat(w, "W");
  if (x == nullptr || out == nullptr) fail("gemv: null x or out");
  if (!accumulate && head_kernel_takes(w)) {  // lm_head shapes: gemv_head.h
    head_gemv(HeadArgs{w, x, norm_w, eps, out, nullptr, nullptr}, kGemvMaxBlocks, s);
    return;
  }
  GemvParams p = base_params(x, norm_w, eps);
  p.m0 = w;
  p.n_items = (w.rows + 1) / 2;
  p.out0 = out;
  p.accumulate = accumulate ? 1 : 0;
  dispatch<Epi::Plain>(p, s);
}

int gemv_argmax(const DevMat& w, const float* x, const float* norm_w, float eps, float* out,
                float* part_v, int* part_i, const Launch& s) {
  check_mat(w, "W");
  if (x == nullptr || out == nullptr || part_v == nullptr || part_i == nullptr) {
    fail("gemv_argmax: null x, out or argmax partials");
  }
  if (head_kernel_takes(w)) {
    return head_gemv(HeadArgs{w, x, norm_w, eps, out, part_v, part_i}, kGemvMaxBlocks, s);
  }
  GemvParams p = base_params(x, norm_w, eps);
  p.m0 = w;
  p.n_items = (w.rows + 1) / 2;
  p.out0 = out;
  p.part_v = part_v;
  p.part_i = part_i;
  dispatch<Epi::Plain>(p, s, kGemvMaxBlocks);
  return gemv_argmax_parts(w);
}

int gemv_argmax_parts(const DevMat& w) {
  if (head_kernel_takes(w)) return head_grid(w, kGemvMaxBlocks);
  return plan_launch(dev_layout(w.type).qk > 32, gemv_int8_x(w.type), (w.rows + 1) / 2, w.cols,
                     kGemvMaxBlocks)
      .grid;
}

void gemv_qkv(const QkvArgs& a, const Launch& s) {
  check_mat(a.wq, "Wq");
  check_mat(a.wk, "Wk");
  check_mat(a.wv, "Wv");
  if (a.wk.cols != a.wq.cols || a.wv.cols != a.wq.cols || a.wk.rows != a.wv.rows) {
    fail("gemv_qkv: Wq/Wk/Wv shapes disagree");
  }
  if (a.head_dim <= 0 || a.head_dim % 2 != 0 || a.rope_dim > a.head_dim || a.rope_dim % 2 != 0 ||
      a.wq.rows % a.head_dim != 0 || a.wk.rows % a.head_dim != 0) {
    fail("gemv_qkv: head_dim ", a.head_dim, " / rope_dim ", a.rope_dim,
         " do not fit the projections (need even sizes dividing the rows)");
  }
  if (a.pos == nullptr) fail("gemv_qkv: null device position");
  if (a.x == nullptr) fail("gemv_qkv: null x");
  check_res(a.res, a.x, "gemv_qkv");
  GemvParams p = base_params(a.x, a.norm_w, a.eps);
  p.head_dim = a.head_dim;
  p.rope_dim = a.rope_dim;
  p.rope_base = a.rope_base;
  p.kv_dim = a.wk.rows;
  p.rope = a.rope ? 1 : 0;
  p.pos = a.pos;
  p.slot = a.slot;
  // [Q; K; V] as one row space of one launch.
  p.m0 = a.wq;
  p.m1 = a.wk;
  p.m2 = a.wv;
  p.off1 = a.wq.rows;
  p.off2 = a.wq.rows + a.wk.rows;
  p.n_items = (a.wq.rows + 2 * a.wk.rows) / 2;
  p.out0 = a.q_out;
  p.res = a.res;
  p.out1 = static_cast<float*>(a.k_out);
  p.out2 = static_cast<float*>(a.v_out);
  p.kv_half = a.rope && a.kv_half;
  // Q and K of one block type, V in the wider type of a K-quant mixture: still one launch.
  const GgmlType tq = a.wq.type, tv = a.wv.type;
  if (tq == a.wk.type && tv != tq && dev_layout(tq).block &&
      (tv == GgmlType::Q6_K || tv == GgmlType::Q8_0)) {
    dispatch_format(tq, [&](auto tag) {
      constexpr GgmlType T = decltype(tag)::value;
      if constexpr (QFormat<T>::kLayout.block) {
        if (tv == GgmlType::Q6_K) {
          launch_t<T, Epi::Qkv, GgmlType::Q6_K>(p, s, 0);
        } else {
          launch_t<T, Epi::Qkv, GgmlType::Q8_0>(p, s, 0);
        }
      }
    });
    return;
  }
  if (a.wq.type == a.wk.type && a.wq.type == a.wv.type) {
    dispatch<Epi::Qkv>(p, s);
    return;
  }
  // Other mixes of types: one launch per matrix, the segment selected through the row offsets.
  const DevMat* ms[3] = {&a.wq, &a.wk, &a.wv};
  float* outs[3] = {p.out0, p.out1, p.out2};
  for (int i = 0; i < 3; ++i) {
    GemvParams q = p;
    q.m0 = q.m1 = q.m2 = *ms[i];
    q.out0 = q.out1 = q.out2 = outs[i];
    // Put this matrix's rows in segment i: segments before it are empty.
    q.off1 = i == 0 ? ms[i]->rows : 0;
    q.off2 = i == 2 ? 0 : ms[i]->rows;
    q.n_items = ms[i]->rows / 2;
    dispatch<Epi::Qkv>(q, s);
  }
}

void gemv_gate_up(const DevMat& wg, const DevMat& wu, const float* x, const float* norm_w,
                  float eps, float* out, const Launch& s, int act, const ResidualIn& res) {
  check_mat(wg, "W_gate");
  check_mat(wu, "W_up");
  if (wg.rows != wu.rows || wg.cols != wu.cols || wg.type != wu.type) {
    fail("gemv_gate_up: W_gate and W_up differ in shape or type (", type_name(wg.type), " vs ",
         type_name(wu.type), ")");
  }
  GemvParams p = base_params(x, norm_w, eps);
  p.m0 = wg;
  p.m1 = wu;
  p.n_items = wg.rows;
  p.out0 = out;
  if (act != 0 && act != 1) fail("gemv_gate_up: activation ", act, " (0 SiLU, 1 GELU-tanh)");
  check_res(res, x, "gemv_gate_up");
  p.act = act;
  p.res = res;
  dispatch<Epi::GateUp>(p, s);
}

}  // namespace smolrt::cuda
