// The compute kernels a cpu::Forward runs, chosen when it is built: the fp32 oracle (ops.h,
// single precision throughout, the reference every other path is tested against) or the fast
// path (activations quantized per 32-block to int8, integer dot products on weights repacked at
// load, SIMD by runtime dispatch, threaded). The forward pass itself (cpu_forward.cpp) is one
// layer loop for both; only these calls differ.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/cpu/fast/isa.h"
#include "model/model.h"

namespace smolrt::cpu {

// A weight matrix as prepared by Kernels::add (an index into the kernels' own table).
using WeightId = int;

// One output of a matmul: out[j * rows(w) + r] = dot(W[r, :], x_j).
struct MatTarget {
  WeightId w = -1;
  float* out = nullptr;
};

// One query row of an attention call: its KV rows live in the pool at slot(t) = pages[t /
// page_size] * page_size + t % page_size for t < n_pos; keys first..n_pos-1 are attended (a
// sliding window starts past 0).
struct AttnRow {
  const int* pages = nullptr;
  int first = 0;
  int n_pos = 0;
};

// The attention call's shapes: q and out are [rows][n_heads * head_dim]; the pools are
// [slots][n_kv_heads * head_dim]; scale: the softmax scale, 0 = 1/sqrt(head_dim).
struct AttnShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  float scale = 0.f;
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // "fp32 reference" or "int8 avx512vnni": for device names and benchmark records.
  virtual std::string name() const = 0;
  int n_threads() const { return n_threads_; }

  // Prepares a weight for matmul (the fast path repacks it); at load only, never per token.
  // Throws Error for a type the kernels cannot compute. The view's data must outlive the kernels.
  virtual WeightId add(const TensorView& w) = 0;

  // For every target, out[j * rows + r] = dot(W[r, :], x_j) for the n inputs x_j = x + j * cols
  // (all targets' weights have the same cols). One call for the weights that share an input lets
  // the fast path quantize it once and spread all their rows over the threads together. A row's
  // result never depends on n, on the other inputs or on the thread count.
  virtual void matmul(const float* x, int n, std::span<const MatTarget> targets) = 0;

  // Causal attention of rows.size() query rows (see AttnRow / AttnShape) over the K/V pools.
  virtual void attention(float* out, const float* q, const float* k_pool, const float* v_pool,
                         std::span<const AttnRow> rows, const AttnShape& s) = 0;

  // gate[i] = act(gate[i]) * up[i], i < n: SwiGLU (silu) or GELU(tanh).
  virtual void gated_act(FfnAct act, float* gate, const float* up, int64_t n) = 0;

 protected:
  int n_threads_ = 1;
};

// The fp32 oracle (ops.h). n_threads > 0; max_pos: positions one row may attend (its scratch).
std::unique_ptr<Kernels> make_ref_kernels(int n_threads, int max_pos);

// The fast path at SIMD level isa (which must be supported). max_rows: inputs one matmul call may
// carry; max_cols: the widest weight input; max_pos as above. Buffers are sized here, once.
std::unique_ptr<Kernels> make_fast_kernels(int n_threads, Isa isa, int max_rows, int64_t max_cols,
                                           int max_pos);

}  // namespace smolrt::cpu
