// Decode matrix-vector kernels (see gemv.h). At decode sizes these are latency-bound: weights are
// fetched into registers before the PDL wait, x is staged once per block through padded shared
// memory (coalesced global loads, conflict-free float4 reads), and each warp's slice of x then
// lives in registers for the whole dot product.
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
  int n_items;        // warps of work (each produces two rows)
  const float* x;
  const float* norm_w;
  float eps;
  float* out0;
  float* out1;
  float* out2;
  int accumulate;
  int head_dim, rope_dim, kv_dim, rope;
  float rope_base;
  const int* pos;
  float* part_v;  // Plain: per-block argmax partials (nullptr: none), see gemv_argmax
  int* part_i;
  ArgmaxFinal fin;     // fin.count != nullptr: the last block also does argmax stage 2
  const char* pf_ptr;  // L2 prefetch range (bytes a multiple of 16), split across the blocks
  size_t pf_bytes;
  const float* res;  // residual partials [res_n][len] folded into x (GateUp) or out0 (Plain)
  int res_n;
  DevMat emb;        // Qkv: emb.q set = x is row *token of emb (QkvArgs::embed)
  const int* token;  // [1]
  float* x_out;      // block 0 writes the raw embedding row here
};

// v + res[0*len + i] + res[1*len + i] + ... in this order (gemv.h, ResidualParts). The loads are
// independent of the sum, so the unrolled body issues them together (one L2 round trip).
__device__ __forceinline__ float fold_res(float v, const float* res, int n, int len, int i) {
#pragma unroll 8
  for (int k = 0; k < n; ++k) v += res[(size_t)k * len + i];
  return v;
}

// Threads per block, fixed: the staging loops' trip counts derive from it. Small matrices get fewer
// blocks than SMs, which is fine: at decode sizes they are latency-bound, not bandwidth-bound.
// 256 measured best in the whole decode step (H200, synth SmolLM-135M, bench-decode): 2,617 tok/s
// against 2,484 with 128 and 2,395 with 512. With 256 each kind of kernel alone is slower (e.g. 30
// QKV kernels back to back: 76.5 vs 72.4 us), but the chain of mixed kernels is 20 us faster.
constexpr int kBlock = 256;
constexpr int kMaxBlocks = 132 * 4;

constexpr bool is_quant(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q8_0;
}

// Shared-memory slot of column c. Quant types pad every 32-column block to 36 floats, so the
// float4 reads of lanes owning consecutive blocks (144 B apart) hit distinct banks.
template <GgmlType T>
__device__ __forceinline__ int xs_index(int c) {
  if constexpr (is_quant(T)) {
    return (c >> 5) * 36 + (c & 31);
  } else {
    return c;
  }
}

template <GgmlType T>
constexpr size_t xs_bytes(int cols) {
  return (is_quant(T) ? (size_t)(cols / 32) * 36 : (size_t)cols) * sizeof(float);
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

// The block stages x (normalized when norm_w is set: one block reduction) in shared memory; each
// lane then copies its slice into registers (quant: lane owns blocks lane+32k, 32 slots each;
// F32/F16: lane owns columns lane+32j). All threads must call this. The global loads of x and
// norm_w are unrolled (fixed trip count from NX) so they are all in flight at once: a rolled loop
// here costs one L2 round trip per iteration, which dominated small matrices.
template <GgmlType T, int NX>
__device__ __forceinline__ void stage_x(float (&xr)[NX], float* xs, const float* x,
                                        const float* norm_w, float eps, int cols, int lane,
                                        const float* res, int res_n, const GemvParams* ep) {
  // Fused embedding (ep: Qkv kernels only, else a constant nullptr): x = row *token of ep->emb.
  const bool emb = ep != nullptr && ep->emb.q != nullptr;
  const size_t tok = emb ? (size_t)*ep->token : 0;
  const bool emb_out = emb && ep->x_out != nullptr && blockIdx.x == 0;
  __shared__ float red[kBlock / 32];
  constexpr int nt = kBlock;
  if constexpr (is_quant(T)) {
    // cols <= 32*NX over kBlock threads: at most ceil(8*NX / kBlock) float4 per thread.
    constexpr int MV = (NX * 32 / 4 + kBlock - 1) / kBlock;
    const int n4 = cols / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* w4 = reinterpret_cast<const float4*>(norm_w);
    float4 v[MV], w[MV];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < MV; ++i) {
      const int c4 = threadIdx.x + i * nt;
      if (emb) {
        v[i] = c4 < n4
                   ? make_float4(
                         dequant_at(ep->emb, tok, 4 * c4), dequant_at(ep->emb, tok, 4 * c4 + 1),
                         dequant_at(ep->emb, tok, 4 * c4 + 2), dequant_at(ep->emb, tok, 4 * c4 + 3))
                   : make_float4(0.f, 0.f, 0.f, 0.f);
        if (emb_out && c4 < n4) reinterpret_cast<float4*>(ep->x_out)[c4] = v[i];
      } else {
        v[i] = c4 < n4 ? x4[c4] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      if (norm_w != nullptr) w[i] = c4 < n4 ? w4[c4] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (res_n > 0) {
      const float4* r4 = reinterpret_cast<const float4*>(res);
#pragma unroll
      for (int i = 0; i < MV; ++i) {
        const int c4 = threadIdx.x + i * nt;
        if (c4 < n4) {
#pragma unroll 4
          for (int k = 0; k < res_n; ++k) {
            const float4 r = r4[(size_t)k * n4 + c4];
            v[i].x += r.x;
            v[i].y += r.y;
            v[i].z += r.z;
            v[i].w += r.w;
          }
        }
      }
    }
    if (norm_w != nullptr) {
#pragma unroll
      for (int i = 0; i < MV; ++i) {
        ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
      }
      const float scale = block_rms_scale<nt>(ss, red, lane, cols, eps);
#pragma unroll
      for (int i = 0; i < MV; ++i) {
        v[i].x = v[i].x * scale * w[i].x;
        v[i].y = v[i].y * scale * w[i].y;
        v[i].z = v[i].z * scale * w[i].z;
        v[i].w = v[i].w * scale * w[i].w;
      }
    }
#pragma unroll
    for (int i = 0; i < MV; ++i) {
      const int c4 = threadIdx.x + i * nt;
      if (c4 < n4) *reinterpret_cast<float4*>(xs + xs_index<T>(4 * c4)) = v[i];
    }
  } else {
    // cols <= 32*NX over kBlock threads: at most ceil(32*NX / kBlock) scalars per thread.
    constexpr int MS = (NX * 32 + kBlock - 1) / kBlock;
    float v[MS], w[MS];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < MS; ++i) {
      const int c = threadIdx.x + i * nt;
      if (emb) {
        v[i] = c < cols ? dequant_at(ep->emb, tok, c) : 0.f;
        if (emb_out && c < cols) ep->x_out[c] = v[i];
      } else {
        v[i] = c < cols ? x[c] : 0.f;
      }
      if (norm_w != nullptr) w[i] = c < cols ? norm_w[c] : 0.f;
      if (res_n > 0 && c < cols) v[i] = fold_res(v[i], res, res_n, cols, c);
    }
    if (norm_w != nullptr) {
#pragma unroll
      for (int i = 0; i < MS; ++i) ss += v[i] * v[i];
      const float scale = block_rms_scale<nt>(ss, red, lane, cols, eps);
#pragma unroll
      for (int i = 0; i < MS; ++i) v[i] = v[i] * scale * w[i];
    }
#pragma unroll
    for (int i = 0; i < MS; ++i) {
      const int c = threadIdx.x + i * nt;
      if (c < cols) xs[c] = v[i];
    }
  }
  __syncthreads();
  if constexpr (is_quant(T)) {
    const int nb = cols / 32;
#pragma unroll
    for (int k = 0; k < NX / 32; ++k) {
      const int b = lane + 32 * k;
      const float4* src = reinterpret_cast<const float4*>(xs + b * 36);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 f = b < nb ? src[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        xr[k * 32 + 4 * i + 0] = f.x;
        xr[k * 32 + 4 * i + 1] = f.y;
        xr[k * 32 + 4 * i + 2] = f.z;
        xr[k * 32 + 4 * i + 3] = f.w;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < NX; ++j) {
      const int c = lane + 32 * j;
      xr[j] = c < cols ? xs[c] : 0.f;
    }
  }
}

// Two rows' quantized weights held in registers. They are loaded BEFORE pdl_wait (weights never
// depend on the previous kernel), so their DRAM latency overlaps the previous kernel's tail.
template <GgmlType T, int NX>
struct WRegs {
  static constexpr int NB = NX / 32;                      // blocks per lane
  static constexpr int NV = T == GgmlType::Q8_0 ? 2 : 1;  // 16-byte loads per block
  uint4 a[NB * NV], b[NB * NV];
  float ka[NB], kb[NB];
};

template <GgmlType T, int NX>
__device__ __forceinline__ void load_w(WRegs<T, NX>& w, const DevMat& ma, int ra, const DevMat& mb,
                                       int rb, int lane) {
  if constexpr (is_quant(T)) {
    constexpr int NV = WRegs<T, NX>::NV;
    const int nb = ma.cols / 32;
    const uint4* qa = static_cast<const uint4*>(ma.q) + (size_t)ra * nb * NV;
    const uint4* qb = static_cast<const uint4*>(mb.q) + (size_t)rb * nb * NV;
    const uint16_t* da = ma.d + (size_t)ra * nb;
    const uint16_t* db = mb.d + (size_t)rb * nb;
#pragma unroll
    for (int k = 0; k < NX / 32; ++k) {
      const int b = lane + 32 * k;
      if (b < nb) {
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          w.a[k * NV + v] = __ldg(qa + b * NV + v);
          w.b[k * NV + v] = __ldg(qb + b * NV + v);
        }
        w.ka[k] = half_bits_to_float(__ldg(da + b));
        w.kb[k] = half_bits_to_float(__ldg(db + b));
      }
    }
  }
}

// Partial dot products of rows ra of ma and rb of mb with this lane's slice of x (quant types:
// from the registers load_w filled; F32/F16: loaded here, coalesced across the warp).
template <GgmlType T, int NX>
__device__ __forceinline__ void dot2(const WRegs<T, NX>& w, const DevMat& ma, int ra,
                                     const DevMat& mb, int rb, const float (&xr)[NX], int lane,
                                     float& pa, float& pb) {
  float sa = 0.f, sb = 0.f;
  const int cols = ma.cols;
  if constexpr (T == GgmlType::Q4_0) {
    const int nb = cols / 32;
#pragma unroll
    for (int k = 0; k < NX / 32; ++k) {
      if (lane + 32 * k < nb) {
        const float ta = q4_block_dot(w.a[k], xr + k * 32);
        const float tb = q4_block_dot(w.b[k], xr + k * 32);
        sa += w.ka[k] * ta;
        sb += w.kb[k] * tb;
      }
    }
  } else if constexpr (T == GgmlType::Q8_0) {
    const int nb = cols / 32;
#pragma unroll
    for (int k = 0; k < NX / 32; ++k) {
      if (lane + 32 * k < nb) {
        const float ta = q8_block_dot(w.a[2 * k], w.a[2 * k + 1], xr + k * 32);
        const float tb = q8_block_dot(w.b[2 * k], w.b[2 * k + 1], xr + k * 32);
        sa += w.ka[k] * ta;
        sb += w.kb[k] * tb;
      }
    }
  } else {
    const size_t oa = (size_t)ra * cols, ob = (size_t)rb * cols;
#pragma unroll
    for (int j = 0; j < NX; ++j) {
      const int c = lane + 32 * j;
      if (c < cols) {
        if constexpr (T == GgmlType::F32) {
          sa += __ldg(static_cast<const float*>(ma.q) + oa + c) * xr[j];
          sb += __ldg(static_cast<const float*>(mb.q) + ob + c) * xr[j];
        } else {
          sa += half_bits_to_float(__ldg(static_cast<const uint16_t*>(ma.q) + oa + c)) * xr[j];
          sb += half_bits_to_float(__ldg(static_cast<const uint16_t*>(mb.q) + ob + c)) * xr[j];
        }
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

// Epilogue inputs that do not depend on the dot products, fetched or computed before them so
// their latency overlaps the x staging and the math instead of trailing the warp sums (an L2 round
// trip, or powf + sincosf, on every step's critical path). Plain with accumulate: the rows of
// out0 (residual partials folded in, in gemv.h's order). Qkv: the RoPE rotation (a = cos,
// b = sin) of the item's row pair, when it has one.
struct PreEpi {
  float a = 0.f, b = 0.f;
  bool rot = false;
};

template <Epi E>
__device__ __forceinline__ PreEpi pre_epi(const GemvParams& p, const ItemRows<E>& ir, int pos) {
  PreEpi e;
  if constexpr (E == Epi::Plain) {
    if (p.accumulate) {
      const int len = p.m0.rows;
      e.a = fold_res(p.out0[ir.ra], p.res, p.res_n, len, ir.ra);
      if (ir.rb != ir.ra) e.b = fold_res(p.out0[ir.rb], p.res, p.res_n, len, ir.rb);
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

// Warps stride over work items (grid capped for large matrices such as the lm_head, so the x
// staging is amortized over several items); the next item's weights are loaded while the current
// one is computed.
template <GgmlType T, int NX, Epi E>
__global__ void __launch_bounds__(kBlock) gemv_kernel(const GemvParams p) {
  const int lane = threadIdx.x & 31;
  const int stride = gridDim.x * (kBlock / 32);
  int item = blockIdx.x * (kBlock / 32) + (threadIdx.x >> 5);

  WRegs<T, NX> w;
  if (item < p.n_items) {
    const ItemRows<E> ir(p, item);
    load_w<T, NX>(w, *ir.ma, ir.ra, *ir.mb, ir.rb, lane);
  }

  // One bulk L2 prefetch per block of a later kernel's weights (a hint; independent of data, so
  // it goes before the wait).
  if (p.pf_bytes != 0 && threadIdx.x == 0) {
    const size_t chunk = ((p.pf_bytes + gridDim.x - 1) / gridDim.x + 15) & ~size_t{15};
    const size_t off = (size_t)blockIdx.x * chunk;
    if (off < p.pf_bytes) {
      const size_t n = p.pf_bytes - off < chunk ? p.pf_bytes - off : chunk;
      prefetch_l2(p.pf_ptr + off, (uint32_t)n);
    }
  }
  pdl_wait();
  pdl_trigger();
  int pos = 0;
  if constexpr (E == Epi::Qkv) pos = *p.pos;  // issued early: overlaps the x staging
  // The first item's epilogue inputs. Residual rows: loads issued by lane 0 before the staging,
  // in flight during it. RoPE angle: computed by every lane (the same value across the warp, no
  // divergent branch) after the staging's loads, so it interleaves with the math.
  constexpr bool kEpiAllLanes = E == Epi::Qkv;
  PreEpi pe;
  if (!kEpiAllLanes && lane == 0 && item < p.n_items) pe = pre_epi<E>(p, ItemRows<E>(p, item), pos);
  extern __shared__ float4 smem_x4[];
  float xr[NX];
  stage_x<T, NX>(xr, reinterpret_cast<float*>(smem_x4), p.x, p.norm_w, p.eps, p.m0.cols, lane,
                 E == Epi::GateUp ? p.res : nullptr, E == Epi::GateUp ? p.res_n : 0,
                 E == Epi::Qkv ? &p : nullptr);
  if (kEpiAllLanes && item < p.n_items) pe = pre_epi<E>(p, ItemRows<E>(p, item), pos);

  float best_v = 0.f;  // Plain + argmax: lane 0's best row so far
  int best_i = INT_MAX;
  for (; item < p.n_items; item += stride) {
    const ItemRows<E> ir(p, item);
    const PreEpi cur = pe;
    WRegs<T, NX> wn;
    if (item + stride < p.n_items) {
      const ItemRows<E> nr(p, item + stride);
      load_w<T, NX>(wn, *nr.ma, nr.ra, *nr.mb, nr.rb, lane);
      if (kEpiAllLanes || lane == 0) pe = pre_epi<E>(p, nr, pos);
    }
    float va, vb;
    dot2<T, NX>(w, *ir.ma, ir.ra, *ir.mb, ir.rb, xr, lane, va, vb);
    w = wn;
    va = warp_sum(va);
    vb = warp_sum(vb);
    if (lane != 0) continue;

    const int ra = ir.ra, rb = ir.rb, seg = ir.seg;
    if constexpr (E == Epi::Plain) {
      p.out0[ra] = p.accumulate ? cur.a + va : va;
      if (rb != ra) p.out0[rb] = p.accumulate ? cur.b + vb : vb;
      if (p.part_v != nullptr) {
        if (!isnan(va) && amax_beats(va, ra, best_v, best_i)) best_v = va, best_i = ra;
        if (rb != ra && !isnan(vb) && amax_beats(vb, rb, best_v, best_i)) best_v = vb, best_i = rb;
      }
    } else if constexpr (E == Epi::GateUp) {
      p.out0[item] = va / (1.f + expf(-va)) * vb;
    } else {
      if (cur.rot) {
        const float a = va, b = vb;
        va = a * cur.a - b * cur.b;
        vb = a * cur.b + b * cur.a;
      }
      float* dst = seg == 0 ? p.out0 : (seg == 1 ? p.out1 : p.out2);
      if (seg > 0 && p.rope) dst += (size_t)pos * p.kv_dim;
      dst[ra] = va;
      dst[ra + 1] = vb;
    }
  }
  if constexpr (E == Epi::Plain) {
    // Fused argmax stage 1: one partial per block (saves a kernel and a re-read of the logits).
    if (p.part_v != nullptr) {
      __shared__ float sv[kBlock / 32];
      __shared__ int si[kBlock / 32];
      block_argmax<kBlock>(best_v, best_i, sv, si);
      if (threadIdx.x == 0) {
        p.part_v[blockIdx.x] = best_v;
        p.part_i[blockIdx.x] = best_i;
      }
      if (p.fin.count != nullptr) argmax_last_block<kBlock>(p.fin, p.part_v, p.part_i, sv, si);
    }
  }
}

// Grid size: one block per kBlock/32 work items, at most max_blocks (default kMaxBlocks, 4 per SM
// of a 132-SM Hopper); beyond that warps loop.
int grid_blocks(int n_items, int max_blocks) {
  const int wpb = kBlock / 32;
  const int cap = max_blocks > 0 ? max_blocks : kMaxBlocks;
  const int blocks = (n_items + wpb - 1) / wpb;
  return blocks < cap ? blocks : cap;
}

template <GgmlType T, Epi E>
void launch_t(const GemvParams& p, int cols, cudaStream_t s, int max_blocks) {
  const int blocks = grid_blocks(p.n_items, max_blocks);
  const dim3 grid(blocks), block(kBlock);
  if (cols <= 1024) {
    launch_kernel(gemv_kernel<T, 32, E>, grid, block, xs_bytes<T>(cols), s, p);
  } else {
    launch_kernel(gemv_kernel<T, 64, E>, grid, block, xs_bytes<T>(cols), s, p);
  }
}

// The one dispatch place from runtime weight type to kernel template.
template <Epi E>
void dispatch(const GemvParams& p, cudaStream_t s, int max_blocks = 0) {
  const int cols = p.m0.cols;
  switch (p.m0.type) {
    case GgmlType::F32:
      return launch_t<GgmlType::F32, E>(p, cols, s, max_blocks);
    case GgmlType::F16:
      return launch_t<GgmlType::F16, E>(p, cols, s, max_blocks);
    case GgmlType::Q4_0:
      return launch_t<GgmlType::Q4_0, E>(p, cols, s, max_blocks);
    case GgmlType::Q8_0:
      return launch_t<GgmlType::Q8_0, E>(p, cols, s, max_blocks);
    default:
      fail("gemv: no CUDA matrix-vector kernel for type ", type_name(p.m0.type),
           "; supported: f32, f16, q4_0, q8_0");
  }
}

void check_mat(const DevMat& w, const char* what) {
  if (w.q == nullptr || w.rows <= 0 || w.cols <= 0) fail("gemv: ", what, " is empty");
  if (w.cols > kGemvMaxCols) {
    fail("gemv: ", what, " has ", w.cols, " columns; the CUDA decode matvec supports at most ",
         kGemvMaxCols);
  }
  if (is_quant(w.type) && (w.cols % 32 != 0 || w.d == nullptr)) {
    fail("gemv: ", what, " is ", type_name(w.type), " with ", w.cols,
         " columns (need a multiple of 32 and scales)");
  }
}

GemvParams base_params(const float* x, const float* norm_w, float eps, L2Prefetch pf) {
  GemvParams p = {};
  p.pf_ptr = static_cast<const char*>(pf.ptr);
  p.pf_bytes = pf.ptr ? (pf.bytes + 15) & ~size_t{15} : 0;
  p.x = x;
  p.norm_w = norm_w;
  p.eps = eps;
  p.pos = nullptr;
  return p;
}

void check_res(const ResidualParts& res, const char* what) {
  if (res.n < 0 || (res.n > 0 && res.p == nullptr)) {
    fail(what, ": residual partials need a buffer and a count >= 0 (got ", res.n, ")");
  }
  if (res.n > 0 && reinterpret_cast<uintptr_t>(res.p) % 16 != 0) {
    fail(what, ": residual partials must be 16-byte aligned");
  }
}

}  // namespace

bool& pdl_enabled() {
  static bool on = false;
  return on;
}

void gemv(const DevMat& w, const float* x, const float* norm_w, float eps, float* out,
          bool accumulate, cudaStream_t s, L2Prefetch pf, const ResidualParts& res) {
  check_mat(w, "W");
  if (x == nullptr || out == nullptr) fail("gemv: null x or out");
  check_res(res, "gemv");
  if (res.n > 0 && !accumulate) fail("gemv: residual partials need accumulate=true");
  if (!accumulate && res.n == 0 && head_kernel_takes(w)) {  // lm_head shapes: gemv_head.h
    head_gemv(HeadArgs{w, x, norm_w, eps, out, nullptr, nullptr, {}}, 0, s);
    return;
  }
  GemvParams p = base_params(x, norm_w, eps, pf);
  p.res = res.p;
  p.res_n = res.n;
  p.m0 = w;
  p.n_items = (w.rows + 1) / 2;
  p.out0 = out;
  p.accumulate = accumulate ? 1 : 0;
  dispatch<Epi::Plain>(p, s);
}

int gemv_argmax(const DevMat& w, const float* x, const float* norm_w, float eps, float* out,
                float* part_v, int* part_i, cudaStream_t s, int max_blocks,
                const ArgmaxFinal* fin) {
  check_mat(w, "W");
  if (x == nullptr || out == nullptr || part_v == nullptr || part_i == nullptr) {
    fail("gemv_argmax: null x, out or argmax partials");
  }
  if (max_blocks < 0 || max_blocks > kGemvMaxBlocks) {
    fail("gemv_argmax: max_blocks ", max_blocks, " outside 0..", kGemvMaxBlocks);
  }
  if (fin != nullptr && (fin->count == nullptr || fin->out == nullptr)) {
    fail("gemv_argmax: null argmax counter/out");
  }
  if (head_kernel_takes(w)) {
    return head_gemv(HeadArgs{w, x, norm_w, eps, out, part_v, part_i, fin ? *fin : ArgmaxFinal{}},
                     max_blocks, s);
  }
  GemvParams p = base_params(x, norm_w, eps, {});
  p.m0 = w;
  p.n_items = (w.rows + 1) / 2;
  p.out0 = out;
  p.part_v = part_v;
  p.part_i = part_i;
  if (fin != nullptr) p.fin = *fin;
  dispatch<Epi::Plain>(p, s, max_blocks);
  return grid_blocks(p.n_items, max_blocks);
}

int gemv_argmax_parts(const DevMat& w, int max_blocks) {
  if (head_kernel_takes(w)) return head_grid(w, max_blocks);
  return grid_blocks((w.rows + 1) / 2, max_blocks);
}

void gemv_qkv(const QkvArgs& a, cudaStream_t s) {
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
  if (a.embed.q != nullptr) {
    const GgmlType t = a.embed.type;
    if (t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::Q4_0 && t != GgmlType::Q8_0) {
      fail("gemv_qkv: no fused embedding for type ", type_name(t),
           "; supported: f32, f16, q4_0, q8_0");
    }
    if (a.embed.cols != a.wq.cols || a.token == nullptr ||
        ((t == GgmlType::Q4_0 || t == GgmlType::Q8_0) && a.embed.d == nullptr)) {
      fail("gemv_qkv: fused embedding has ", a.embed.cols, " columns for a ", a.wq.cols,
           "-column input (or no token / scales)");
    }
  } else if (a.x == nullptr) {
    fail("gemv_qkv: null x");
  }
  GemvParams p = base_params(a.x, a.norm_w, a.eps, a.pf);
  p.emb = a.embed;
  p.token = a.token;
  p.x_out = a.x_out;
  p.head_dim = a.head_dim;
  p.rope_dim = a.rope_dim;
  p.rope_base = a.rope_base;
  p.kv_dim = a.wk.rows;
  p.rope = a.rope ? 1 : 0;
  p.pos = a.pos;
  if (a.wq.type == a.wk.type && a.wq.type == a.wv.type) {
    p.m0 = a.wq;
    p.m1 = a.wk;
    p.m2 = a.wv;
    p.off1 = a.wq.rows;
    p.off2 = a.wq.rows + a.wk.rows;
    p.n_items = (a.wq.rows + 2 * a.wk.rows) / 2;
    p.out0 = a.q_out;
    p.out1 = a.k_out;
    p.out2 = a.v_out;
    dispatch<Epi::Qkv>(p, s);
    return;
  }
  // Mixed types: one launch per matrix, the segment selected through the row offsets.
  const DevMat* ms[3] = {&a.wq, &a.wk, &a.wv};
  float* outs[3] = {a.q_out, a.k_out, a.v_out};
  for (int i = 0; i < 3; ++i) {
    GemvParams q = p;
    if (i > 0) q.pf_bytes = 0;
    q.m0 = q.m1 = q.m2 = *ms[i];
    q.out0 = q.out1 = q.out2 = outs[i];
    // Put this matrix's rows in segment i: segments before it are empty.
    q.off1 = i == 0 ? ms[i]->rows : 0;
    q.off2 = i == 2 ? 0 : ms[i]->rows;
    q.n_items = ms[i]->rows / 2;
    if (i > 0) q.x_out = nullptr;  // the first launch writes the embedding row
    if (i == 1) q.off2 = ms[i]->rows;
    dispatch<Epi::Qkv>(q, s);
  }
}

void gemv_gate_up(const DevMat& wg, const DevMat& wu, const float* x, const float* norm_w,
                  float eps, float* out, cudaStream_t s, L2Prefetch pf, const ResidualParts& res) {
  check_mat(wg, "W_gate");
  check_mat(wu, "W_up");
  if (wg.rows != wu.rows || wg.cols != wu.cols || wg.type != wu.type) {
    fail("gemv_gate_up: W_gate and W_up differ in shape or type (", type_name(wg.type), " vs ",
         type_name(wu.type), ")");
  }
  check_res(res, "gemv_gate_up");
  GemvParams p = base_params(x, norm_w, eps, pf);
  p.res = res.p;
  p.res_n = res.n;
  p.m0 = wg;
  p.m1 = wu;
  p.n_items = wg.rows;
  p.out0 = out;
  dispatch<Epi::GateUp>(p, s);
}

}  // namespace smolrt::cuda
