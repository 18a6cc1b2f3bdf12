// gemm_quant(): argument checks and the one place where runtime choices (weight type, epilogue,
// path) become template parameters.
#include "cuda/gemm_quant.h"

#include <cstdint>

#include "core/error.h"
#include "cuda/gemm_common.cuh"

namespace smolrt::cuda {
namespace {

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

void check_args(const GemmArgs& a, GemmEpilogue ep, const GemmOut& o) {
  if (!a.w || !a.x) fail("gemm_quant: null weight or activation pointer");
  if (a.wtype != GgmlType::Q4_0 && a.wtype != GgmlType::Q8_0)
    fail("gemm_quant: weight type ", type_name(a.wtype), " is not supported (Q4_0 or Q8_0)");
  if (a.wtype == GgmlType::Q8_0 && ep != GemmEpilogue::Store)
    fail("gemm_quant: Q8_0 weights support only the Store epilogue");
  if (a.n <= 0 || a.t <= 0) fail("gemm_quant: empty shape n=", a.n, " t=", a.t);
  if (a.k <= 0 || a.k % 32 != 0) fail("gemm_quant: k=", a.k, " must be a positive multiple of 32");
  if (a.ldx < a.k || a.ldx % 4 != 0)
    fail("gemm_quant: ldx=", a.ldx, " must be >= k=", a.k, " and a multiple of 4");
  if (!aligned16(a.x) || (a.norm_w && !aligned16(a.norm_w)))
    fail("gemm_quant: activations and norm weight must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(a.w) & 1u) fail("gemm_quant: weights must be 2-byte aligned");
  if (!o.y) fail("gemm_quant: null output pointer");
  switch (ep) {
    case GemmEpilogue::Store:
    case GemmEpilogue::Accumulate:
      if (o.ldy < a.n) fail("gemm_quant: ldy=", o.ldy, " < n=", a.n);
      break;
    case GemmEpilogue::SiluPair:
      if (a.n % 2 != 0) fail("gemm_quant: SiluPair needs an even row count, got n=", a.n);
      if (o.ldy < a.n / 2) fail("gemm_quant: ldy=", o.ldy, " < n/2=", a.n / 2);
      break;
    case GemmEpilogue::QkvRope:
      if (o.head_dim <= 0 || o.head_dim % 2 || o.q_dim % o.head_dim || o.kv_dim % o.head_dim)
        fail("gemm_quant: QkvRope head_dim=", o.head_dim,
             " must be even and divide q_dim=", o.q_dim, " and kv_dim=", o.kv_dim);
      if (o.rope_dim < 0 || o.rope_dim > o.head_dim)
        fail("gemm_quant: rope_dim=", o.rope_dim, " must be in [0, head_dim=", o.head_dim, "]");
      if (a.n != o.q_dim + 2 * o.kv_dim)
        fail("gemm_quant: QkvRope n=", a.n,
             " must equal q_dim + 2*kv_dim = ", o.q_dim + 2 * o.kv_dim);
      if (!o.k_cache || !o.v_cache || o.pos0 < 0) fail("gemm_quant: QkvRope needs KV caches");
      if (o.ldy < o.q_dim) fail("gemm_quant: ldy=", o.ldy, " < q_dim=", o.q_dim);
      break;
  }
}

template <class B, GemmEpilogue E>
void run(const GemmArgs& a, const GemmOut& o, cudaStream_t s, bool small) {
  if (small) {
    detail::launch_gemm_small<B, E>(a, o, s);
  } else {
    detail::launch_gemm_tc<B, E>(a, o, s);
  }
}

int g_small_max = kGemmSmallMaxTokens;

}  // namespace

void set_gemm_small_max_tokens(int t) {
  g_small_max = t < 0 ? kGemmSmallMaxTokens : t;
}
int gemm_small_max_tokens() {
  return g_small_max;
}

void gemm_quant(const GemmArgs& a, GemmEpilogue ep, const GemmOut& o, cudaStream_t stream,
                GemmPath path) {
  check_args(a, ep, o);
  const bool small = path == GemmPath::Small || (path == GemmPath::Auto && a.t <= g_small_max);
  if (a.wtype == GgmlType::Q8_0) return run<BlockQ8_0, GemmEpilogue::Store>(a, o, stream, small);
  switch (ep) {
    case GemmEpilogue::Store:
      return run<BlockQ4_0, GemmEpilogue::Store>(a, o, stream, small);
    case GemmEpilogue::Accumulate:
      return run<BlockQ4_0, GemmEpilogue::Accumulate>(a, o, stream, small);
    case GemmEpilogue::SiluPair:
      return run<BlockQ4_0, GemmEpilogue::SiluPair>(a, o, stream, small);
    case GemmEpilogue::QkvRope:
      return run<BlockQ4_0, GemmEpilogue::QkvRope>(a, o, stream, small);
  }
}

}  // namespace smolrt::cuda
