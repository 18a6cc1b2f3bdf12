// Decode matrix-vector products (batch 1): out = W·x for F32, F16, Q4_0 and Q8_0 weights
// (Q4_0/Q8_0 in the split layout of dev_mat.h), fp32 activations and fp32 accumulation.
//
// Work split: one warp computes two output rows; each lane owns whole 32-column blocks (quant
// types, one 16-byte load per Q4_0 block, two per Q8_0 block) or strided columns (F32/F16), and
// keeps its slice of x in registers; x is staged once per block in shared memory.
// cols <= kGemvMaxCols.
//
// Optional fused RMSNorm of the input (norm_w != nullptr): each block normalizes its staged copy
// of x (one block reduction) before the products: x*rsqrt(mean(x^2)+eps)*norm_w.
#pragma once

#include <cuda_runtime.h>

#include "cuda/dev_mat.h"

namespace smolrt::cuda {

constexpr int kGemvMaxCols = 2048;

// Residual partials folded into a vector v of length len (gemv_gate_up: its input x; gemv with
// accumulate: its output):  v'[i] = ((v[i] + p[0*len + i]) + p[1*len + i]) + ... , k < n, in
// this fixed order, so every kernel folding the same partials sees bit-identical values. The
// fused-Wo attention kernel writes them (attention_decode.h, AttnWo): the residual update
// x += Wo·att then costs no launch of its own. p 16-byte aligned; n = 0: none.
struct ResidualParts {
  const float* p = nullptr;  // [n][len]
  int n = 0;
};

// out[r] = (accumulate ? out'[r] : 0) + W[r,:]·n(x), r < w.rows. x: [w.cols]; out: [w.rows];
// out' = out with res folded in (res needs accumulate).
// pf (optional): weights the grid prefetches into L2 for a later kernel (dev_mat.h).
void gemv(const DevMat& w, const float* x, const float* norm_w, float eps, float* out,
          bool accumulate, cudaStream_t s, L2Prefetch pf = {}, const ResidualParts& res = {});

// lm_head with argmax stage 1 fused in: out = W·n(x) as gemv(accumulate=false), and block b also
// writes the best (value, row) among the rows it computed to part_v[b], part_i[b] (NaN never wins,
// ties -> lowest row, index INT_MAX = no candidate; the rules of argmax.h). Returns the number of
// partials written, for argmax_final. max_blocks: grid cap, 0 = the default (4 blocks per SM of a
// 132-SM Hopper), at most kGemvMaxBlocks; part_v/part_i hold at least kGemvMaxBlocks entries.
//
// fin (optional): argmax stage 2 in the same kernel, done by the last block to finish (a ticket
// counter); outputs as argmax_final (argmax.h).
struct ArgmaxFinal {
  int* count = nullptr;        // device int, 0 before the launch; the kernel leaves it 0
  int* out = nullptr;          // device int: the id
  int* next_params = nullptr;  // optional [2] {token, pos} slots: id, pos + 1 (argmax.h)
  int* host_out = nullptr;     // optional pinned (UVA-mapped) host int: the id
};
constexpr int kGemvMaxBlocks = 132 * 8;
int gemv_argmax(const DevMat& w, const float* x, const float* norm_w, float eps, float* out,
                float* part_v, int* part_i, cudaStream_t s, int max_blocks = 0,
                const ArgmaxFinal* fin = nullptr);
// The partial count gemv_argmax returns for w (no launch). Large Q8_0 matrices (the lm_head) go
// through a wider kernel with its own grid (gemv_head.h), so the count depends on w's shape and
// type, and max_blocks is a cap there (at most the blocks resident at once).
int gemv_argmax_parts(const DevMat& w, int max_blocks = 0);

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
  float* q_out;   // [q_dim]
  float* k_out;   // rope=false: [kv_dim]; rope=true: layer K cache [n_ctx][kv_dim]
  float* v_out;   // rope=false: [kv_dim]; rope=true: layer V cache [n_ctx][kv_dim]
  L2Prefetch pf;  // optional, see gemv()
  // Optional fused embedding lookup (saves the step's embed launch): with embed.q set, x is row
  // *token of embed (dequantized exactly as cuda::embed does; x itself is not read), and block 0
  // also writes that raw row to x_out (the residual stream). embed.cols must equal the dim.
  DevMat embed;
  const int* token = nullptr;
  float* x_out = nullptr;
};
void gemv_qkv(const QkvArgs& a, cudaStream_t s);

// FFN input: out[r] = silu(Wg[r,:]·n(x')) * (Wu[r,:]·n(x')), r < hidden_dim; one warp does the
// gate and up row of the same r, so SiLU·up never leaves registers. x' = x with res folded in
// (x itself is not written).
void gemv_gate_up(const DevMat& wg, const DevMat& wu, const float* x, const float* norm_w,
                  float eps, float* out, cudaStream_t s, L2Prefetch pf = {},
                  const ResidualParts& res = {});

}  // namespace smolrt::cuda
