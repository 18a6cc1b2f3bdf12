// Decode matrix-vector products (batch 1): out = W·x for every weight format of cuda/qformat.h,
// fp32 activations (two int8 levels for the K-quants, gemv_int8_x) and fp32 accumulation. One
// kernel family, templated over the format description (QFormat) and the epilogue; any shape the
// format's block size allows.
//
// Work split: one warp computes two output rows; each lane owns whole 32-column units (block
// formats: QFormat::load, 16-byte loads) or strided columns (float formats), and keeps its slice
// of x in registers; x is staged once per block in shared memory. Matrices wider than one pass
// (2,048 columns; 1,024 for the K-quants, whose units take more registers) split the passes over
// up to 8 warps of one block (column slices, summed in shared memory), beyond 8 passes a warp
// walks several; those grids are one resident wave (2 blocks per SM) that loops over the rows,
// so each block stages the wide x once.
//
// Optional fused RMSNorm of the input (norm_w != nullptr): each block normalizes its staged copy
// of x (one block reduction) before the products: x*rsqrt(mean(x^2)+eps)*norm_w.
#pragma once

#include <cuda_runtime.h>

#include "cuda/dev_mat.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

// The widest input a decode matvec stages in shared memory (227 KiB of fp32 x, padded).
constexpr int kGemvMaxCols = 49152;

// Whether the matvec of type t may take x quantized per 32-column unit to two int8 levels (the
// K-quants, where enough rows per block amortize the quantization: DP4A dot products, qformat.h
// XQ): each element of x is then within max|x| / 64516 of its unit, which bounds the difference
// from the fp32 product (the kernel tests use that bound).
bool gemv_int8_x(GgmlType t);

// out[r] = (accumulate ? out[r] : 0) + W[r,:]·n(x), r < w.rows. x: [w.cols]; out: [w.rows].
void gemv(const DevMat& w, const float* x, const float* norm_w, float eps, float* out,
          bool accumulate, const Launch& s);

// lm_head with argmax stage 1 fused in: out = W·n(x) as gemv(accumulate=false), and block b also
// writes the best (value, row) among the rows it computed to part_v[b], part_i[b] (NaN never wins,
// ties -> lowest row, index INT_MAX = no candidate; the rules of argmax.h). Returns the number of
// partials written, for argmax_final; part_v/part_i hold at least kGemvMaxBlocks entries.
constexpr int kGemvMaxBlocks = 132 * 8;
int gemv_argmax(const DevMat& w, const float* x, const float* norm_w, float eps, float* out,
                float* part_v, int* part_i, const Launch& s);
// The partial count gemv_argmax returns for w (no launch). Large Q8_0 matrices (the lm_head) go
// through a wider kernel with its own grid (gemv_head.h), so the count depends on w's shape and
// type.
int gemv_argmax_parts(const DevMat& w);

// A residual update left pending by the previous matvec (gemma3's post norms: x += rmsnorm(W·in)
// · post_norm), made in a matvec's input staging instead of a kernel of its own: the matvec's input
// is x + rmsnorm(res) · res_norm (then its own fused RMSNorm, if any), and block 0 writes that sum
// to x_out. x_out must not be x: the other blocks are still reading x. All null: no update.
struct ResidualIn {
  const float* res = nullptr;       // [cols] the previous matvec's raw output
  const float* res_norm = nullptr;  // [cols] its post-norm weight
  float* x_out = nullptr;           // [cols] the updated residual stream
};

// Q, K and V projections of one token in one launch (Wq, Wk, Wv must share one type; otherwise
// the launcher issues one launch per matrix). With rope=true the epilogue also rotates Q and K
// (GGUF "normal" RoPE: adjacent pairs (2i, 2i+1) of each head by pos*base^(-2i/rope_dim)) and
// appends K and V at row *pos of the layer's caches; with rope=false Q, K, V are written raw to
// q_out, k_out, v_out (k_cache/v_cache unused) for the separate rope_qk_kv_append kernel.
struct QkvArgs {
  DevMat wq, wk, wv;    // rows q_dim, kv_dim, kv_dim; cols dim
  const float* x;       // [dim]
  const float* norm_w;  // [dim] attn_norm weight for the fused RMSNorm, or nullptr
  float eps;
  int head_dim, rope_dim;  // head_dim even, rope_dim <= head_dim
  float rope_base;
  const int* pos;  // device: position of this token
  bool rope;
  // rope=true: device K/V cache row to write (a paged pool's slot), or nullptr: the position.
  const int* slot = nullptr;
  float* q_out;          // [q_dim]
  void* k_out;           // rope=false: fp32 [kv_dim]; rope=true: layer K cache [n_ctx][kv_dim]
  void* v_out;           // rope=false: fp32 [kv_dim]; rope=true: layer V cache [n_ctx][kv_dim]
  bool kv_half = false;  // rope=true: the caches hold fp16 (else fp32)
  ResidualIn res;        // a pending residual update of x, made in the staging
};
void gemv_qkv(const QkvArgs& a, const Launch& s);

// FFN input: out[r] = act(Wg[r,:]·n(x)) * (Wu[r,:]·n(x)), r < hidden_dim; one warp does the
// gate and up row of the same r, so act·up never leaves registers. Wg and Wu of one type.
// act: 0 SiLU, 1 GELU (tanh approximation) — ModelConfig::act as int.
// res: a pending residual update of x, made in the staging (see ResidualIn).
void gemv_gate_up(const DevMat& wg, const DevMat& wu, const float* x, const float* norm_w,
                  float eps, float* out, const Launch& s, int act = 0, const ResidualIn& res = {});

}  // namespace smolrt::cuda
