// gemm: cuda::gemm (the many-row GEMM on quantized weights, gemm.h) against double-precision sums
// over cpu::dequantize's rows (cpu::gemm's arithmetic in double): the Store epilogue with fp32
// input (converted in its staging) and with fp16 input in fragment order (act_to_f16), and the
// Accumulate epilogue with K split across blocks (the down GEMM's launch) and without.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/gemm.h"
#include "cuda/prefill_test_util.h"
#include "ops/op_table.h"
#include "test_util.h"

namespace smolrt::test::ops {
namespace {

// Weights and activations are rounded to fp16 (2^-11 relative each) before the fp32-accumulated
// MMA; independent errors give a relative L2 error near 6e-4 (gemm_epilogues.cpp); the formats with
// a minimum add the rounding of d*q + m (same order), so 3e-3 holds for all with margin.
constexpr double kTol = 3e-3;

// 192 x 1024: whole K-quant super-blocks, 12 row tiles; token counts: one 8-token tile, a partial
// 32-token tile, and the fp16 path's 64-token tiles (from kGemmF16MinTokens on). 80 x 2048 and
// 80 x 8192, the 1B-2B models' widths (the token tile shrinks until a block's K range fits shared
// memory; a partial group of row tiles), at token counts past one 32-token tile.
std::vector<Shape> shapes(GgmlType) {
  std::vector<Shape> s;
  for (int t : {7, 33, cuda::kGemmF16MinTokens}) s.push_back({192, 1024, t});
  for (int k : {2048, 8192})
    for (int t : {40, 64, 97}) s.push_back({80, k, t});
  return s;
}

void check(const Case& c) {
  const int n = c.shape.rows, k = c.shape.cols, T = c.shape.t;
  RandMat m(c.type, n, k, c.seed);
  const std::vector<float> x = test::randn((size_t)T * k, c.seed + 1);
  const std::vector<double> ref = ref_gemm(m.view, x, T);
  Dev<float> dx(x), dy((size_t)T * n);
  cuda::GemmArgs a;
  a.w0 = m.mat, a.x = dx.p(), a.ldx = k, a.t = T;
  cuda::GemmOut o;
  o.y = dy.p(), o.ldy = n;
  if (k <= 1024) {  // fp32 input
    cuda::gemm(a, cuda::GemmEpilogue::Store, o, nullptr);
    EXPECT_LT(rel_l2(dy.get(), ref), kTol) << "fp32 input";
  }
  const int ldh = (k + 63) / 64 * 64;
  Dev<uint16_t> xh((size_t)T * ldh);
  cuda::act_to_f16(dx.p(), k, T, k, nullptr, 1e-5f, xh.p(), ldh, nullptr);
  a.xh = xh.p(), a.ldh = ldh;
  dy.poison();
  cuda::gemm(a, cuda::GemmEpilogue::Store, o, nullptr);
  EXPECT_LT(rel_l2(dy.get(), ref), kTol) << "fp16 input";
  for (bool split : {false, true}) {
    CUDA_CHECK(cudaMemset(dy.p(), 0, sizeof(float) * T * n));
    cuda::gemm(a, cuda::GemmEpilogue::Accumulate, o, cuda::Launch(nullptr, false, split));
    EXPECT_LT(rel_l2(dy.get(), ref), kTol) << "accumulate, " << (split ? "split K" : "one block");
  }
}

}  // namespace

// Every format but F32, which the GEMM does not take (cuda::gemm_takes).
Op gemm_op() {
  return {"gemm", [](GgmlType t) { return cuda::gemm_takes(t); }, shapes, check};
}

}  // namespace smolrt::test::ops
