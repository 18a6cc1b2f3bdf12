// Multi-token GEMM over quantized weights for the batched prefill, on tensor cores:
//   y[t][n] = sum_k W[n][k] * x'[t][k]   for every token t of a chunk, one pass over W.
// Generic over the weight format (cuda/qformat.h: each format's load16 / w16 or pairs16); the
// name stays from its first format, Q4_0.
//
// Weights are the decode backend's own device image (cuda/dev_mat.h, the split layout), so the
// prefill needs no second copy of the model.
//
// How (gemm.cu): each warp owns 16 weight rows and streams their 64-column chunks straight
// from global memory into registers (the first ones before the PDL wait), dequantizes them in
// registers into mma.sync m16n8k16 A fragments (fp16: Q4_0 exact, (q-8)*d rounded once; the
// others rounded once from the fp32 reference value, a relative 2^-11 per weight), and multiplies
// them with the chunk's activations, which the block staged once in shared memory as fp16 in
// fragment order (one 8-byte load per B fragment, no conflicts). Accumulation in fp32. Warps of a
// block split K and add their partial tiles in a fixed order (deterministic); residual GEMMs with
// few tiles also split K across blocks and add atomically when the Launch allows it.
//
// Fused prologue / epilogues (no launch of their own):
//   norm_w != nullptr : x'[t] = x[t] / sqrt(mean(x[t]^2) + eps) * norm_w   (RMSNorm), else x' = x
//   Store      : y[t*ldy + n] = acc                        (w0: n rows)
//   Accumulate : y[t*ldy + n] += acc                       (residual: attention output, down)
//   GatePair   : y[t*ldy + j] = act(gate_j . x') * (up_j . x')  (w0 = gate, w1 = up; act SiLU/GELU)
//   QkvRope    : rows [Wq (w0); Wk (w1); Wv (w2)]; RoPE ("normal" GGUF style, adjacent pairs,
//                angle pos * base^(-2i/rope_dim), pos = pos0 + t) on q and k; q to
//                y[t*ldy + c], k and v to k_cache / v_cache[(pos0+t)*kv_dim + c] (fp16 or fp32)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dev_mat.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

enum class GemmEpilogue { Store, Accumulate, GatePair, QkvRope };

// Whether the GEMM takes matrices of type t (every format of qformat.h but F32).
inline bool gemm_takes(GgmlType t) {
  return t != GgmlType::F32 && dev_layout(t).qk != 0;
}

struct GemmArgs {
  // Matrices of any type gemm_takes() in their device layout, all with the same column count k (a
  // multiple of 32). QkvRope's three may differ in type (one launch each); GatePair's two may not.
  // Store / Accumulate: w0. GatePair: w0 = gate, w1 = up (same rows). QkvRope: w0 = Wq, w1 = Wk,
  // w2 = Wv (Wq and Wk rows multiples of 16).
  DevMat w0, w1, w2;
  const float* x = nullptr;  // device [t][ldx] fp32 activations, 16-byte aligned
  int ldx = 0;               // multiple of 4, >= k
  // Or (xh != nullptr, x ignored, norm_w must be nullptr): fp16 activations already in fragment
  // order, [t][ldh] as act_to_f16 writes them (ldh a multiple of 64, >= k rounded up to 64, pad
  // columns zero). Large batches take this path: the block copies them into shared memory as is.
  const uint16_t* xh = nullptr;
  int ldh = 0;
  int t = 0;                      // tokens in the batch (>= 1)
  const float* norm_w = nullptr;  // device [k] RMSNorm weight, or nullptr for no prologue
  float eps = 1e-5f;
};

struct GemmOut {
  float* y = nullptr;  // device [t][ldy]; Store/Accumulate: w0.rows cols, GatePair: w0.rows,
  int ldy = 0;         // QkvRope: q_dim
  // QkvRope only:
  int q_dim = 0, kv_dim = 0, head_dim = 0, rope_dim = 0;
  float rope_base = 10000.f;
  int pos0 = 0;             // absolute position of token 0
  void* k_cache = nullptr;  // device [n_ctx][kv_dim] (this layer), fp16 if kv_half else fp32
  // Multi-sequence steps (device [t] each, or nullptr): token t's position is row_pos[t] (instead
  // of pos0 + t) and its K/V row is row_slot[t] of the caches (a paged pool's slot) instead of its
  // position.
  const int* row_pos = nullptr;
  const int* row_slot = nullptr;
  void* v_cache = nullptr;
  bool kv_half = true;
  // GatePair only: the gate's activation (0 SiLU, 1 GELU-tanh: ModelConfig::act).
  int act = 0;
  // GatePair only: when yh is set, act(g)*u goes to yh [t][ldyh] as fp16 in fragment order (the
  // next GEMM's xh input) instead of y. ldyh a multiple of 64, >= rows rounded up to 64.
  uint16_t* yh = nullptr;
  int ldyh = 0;
};

// Fragment order: position of column r (0..63) of a 64-column chunk in an xh row (the chunk's
// columns permuted so each thread's mma operands are 8 contiguous bytes; see gemm.cu).
__host__ __device__ constexpr int gemm_frag_pos(int r) {
  const int b = r >> 5, hi = (r >> 4) & 1, h = (r >> 3) & 1, wi = (r >> 2) & 1, e = r & 3;
  const int pe = e == 1 ? 2 : e == 2 ? 1 : e;
  return (2 * wi + hi) * 16 + (2 * b + h) * 4 + pe;
}

// Layouts of fp16 activation rows: the fragment order gemm reads (xh), or plain row-major
// (the dense GEMMs' input, dense_gemm.h).
enum class F16Order { kFragment, kRowMajor };

// Rows of fp32 activations -> fp16: out[i][.] = x[i][.] * (norm_w ? norm_w / sqrt(mean(x[i]^2) +
// eps) : 1); in fragment order columns [k, ldh) zero, row-major ones left as they are. One block
// per row. k a multiple of 4; ldh >= k, a multiple of 64 (fragment order) or 8 (row-major).
void act_to_f16(const float* x, int ldx, int t, int k, const float* norm_w, float eps,
                uint16_t* out, int ldh, const Launch& stream, F16Order order = F16Order::kFragment);

// Batches of at least this many tokens should use the fp16 path (act_to_f16 + xh): below it the
// fp32 path (norm and conversion fused into the GEMM's staging) is faster, from here the one
// conversion per chunk pays off.
constexpr int kGemmF16MinTokens = 512;
// The prefill's down GEMM reads silu(gate)*up as fp16 from this many tokens on (below: fp32 input,
// converted in the GEMM's staging).
constexpr int kDownF16MinTokens = 33;

// Checks shapes and types (throws smolrt::Error naming the bad field), launches as the Launch
// says (PDL, split K), checks the launch.
void gemm(const GemmArgs& a, GemmEpilogue ep, const GemmOut& o, const Launch& stream);

}  // namespace smolrt::cuda
