// gemv: cuda::gemv (the decode step's matrix-vector kernel, gemv.h) against cpu::gemv: plain,
// accumulating (out += W·x) and with the fused RMSNorm of its input.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/gemv.h"
#include "ops/op_table.h"
#include "test_util.h"

namespace smolrt::test::ops {
namespace {

// {9001, 576}, {5001, 64}, {9001, 4096} and {9001, 2048}: more row pairs than the capped grid has
// warps (or slice groups), so warps loop. Real layer shapes (SmolLM2-135M / -360M / -1.7B), both
// ways round: one pass of x registers, and several passes (cols > 2048, or > 1024 for the K-quants)
// split over 2 to 8 warps of a block (2,560: 3 slices, two warps idle; 12,288 K-quant columns: 12
// passes, the 8 warps walk them; {700, 9216}: 9 passes over several rounds of a block). K-quants
// take both of the gemv's paths: fp32 x where a block computes few rows, int8 x from 10 rows per
// block ({8192, 2048}, {9001, 256}, {9001, 2048}; {2900, 9216}: 9 passes).
std::vector<Shape> shapes(GgmlType t) {
  if (is_float(t))
    return {{172, 64}, {64, 172},  {33, 70},   {577, 576}, {5, 1},
            {9, 2048}, {5001, 64}, {31, 2080}, {6, 4099},  {960, 2560}};
  if (block_of(t) == 256)
    return {{576, 1536}, {960, 2560}, {2048, 8192}, {8192, 2048}, {3, 256},    {9001, 256},
            {33, 1024},  {65, 1280},  {7, 12288},   {9001, 2048}, {700, 9216}, {2900, 9216}};
  return {{576, 576},   {193, 1536},  {64, 2048},  {4097, 576}, {3, 32},
          {9001, 576},  {1536, 576},  {576, 1536}, {2560, 960}, {960, 2560},
          {8192, 2048}, {2048, 8192}, {17, 12288}, {9001, 4096}};
}

void check(const Case& c) {
  const int rows = c.shape.rows, cols = c.shape.cols;
  RandMat m(c.type, rows, cols, c.seed);
  std::vector<float> x = test::randn(cols, c.seed + 1), nw = test::randn(cols, c.seed + 2);
  std::vector<float> ref, tol;
  Dev<float> dx(x), dnw(nw);
  {  // plain
    Dev<float> out((size_t)rows);
    cuda::gemv(m.mat, dx.p(), nullptr, 1e-5f, out.p(), false, nullptr);
    ref_gemv(m.view, x, ref, tol);
    const std::vector<float> got = out.get();
    for (int r = 0; r < rows; ++r) ASSERT_NEAR(got[r], ref[r], tol[r]) << "row " << r;
  }
  {  // out += W·x
    const std::vector<float> base = test::randn(rows, c.seed + 3);
    Dev<float> out(base);
    cuda::gemv(m.mat, dx.p(), nullptr, 1e-5f, out.p(), true, nullptr);
    const std::vector<float> got = out.get();
    for (int r = 0; r < rows; ++r)
      ASSERT_NEAR(got[r], base[r] + ref[r], tol[r] + 1e-6f * std::fabs(base[r])) << "row " << r;
  }
  {  // fused RMSNorm of the input
    std::vector<float> xn(cols);
    cpu::rmsnorm(xn.data(), x.data(), nw.data(), cols, 1e-5f);
    ref_gemv(m.view, xn, ref, tol);
    Dev<float> out((size_t)rows);
    cuda::gemv(m.mat, dx.p(), dnw.p(), 1e-5f, out.p(), false, nullptr);
    const std::vector<float> got = out.get();
    // + the norm's own rounding (rsqrtf, 2 ulp) carried through the sum
    for (int r = 0; r < rows; ++r) ASSERT_NEAR(got[r], ref[r], 2 * tol[r]) << "row " << r;
  }
}

}  // namespace

Op gemv_op() {
  return {"gemv", [](GgmlType) { return true; }, shapes, check};
}

}  // namespace smolrt::test::ops
