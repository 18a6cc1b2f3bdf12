// gemv: cuda::gemv (the decode step's matrix-vector kernel, gemv.h) against cpu::gemv. The op
// table's entry: every format at its shapes, plain, accumulating (out += W·x) and with the fused
// RMSNorm of its input; then the wide lm_head kernel, what the kernel refuses, and a pending
// residual update made in its input staging.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "cuda/cuda_test_util.h"
#include "cuda/gemv.h"
#include "cuda/gemv_head.h"
#include "ops/op_table.h"
#include "quant/formats.h"
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

namespace smolrt::test::ops {
namespace {

// The wide lm_head kernel (gemv_head.h) on the shapes it takes: odd row counts (a partial last
// group), cols from one 32-block chunk pair to its maximum, with and without the fused norm.
TEST(KernelGemv, WideHeadMatchesCpu) {
  REQUIRE_GPU();
  // The last two give each warp 3 to 5 row groups (both parities of the kernel's two register
  // sets); the others at most one.
  const Shape shapes[] = {{8192, 576}, {8193, 1024}, {10001, 96},  {9999, 640},
                          {8195, 672}, {49999, 576}, {40003, 1024}};
  for (int si = 0; si < (int)std::size(shapes); ++si) {
    const Shape sh = shapes[si];
    RandMat m(GgmlType::Q8_0, sh.rows, sh.cols, 400 + si);
    ASSERT_TRUE(cuda::head_kernel_takes(m.mat)) << sh.rows << "x" << sh.cols;
    std::vector<float> x = test::randn(sh.cols, 401 + si), nw = test::randn(sh.cols, 402 + si);
    Dev<float> dx(x), dnw(nw);
    {
      for (bool norm : {false, true}) {
        SCOPED_TRACE(testing::Message() << sh.rows << "x" << sh.cols << " norm " << norm);
        std::vector<float> xin = x, ref, tol;
        if (norm) cpu::rmsnorm(xin.data(), x.data(), nw.data(), sh.cols, 1e-5f);
        ref_gemv(m.view, xin, ref, tol);
        // int8 x (this kernel quantizes x whatever its format)
        std::vector<double> qb(sh.rows, 0.0);
        {
          std::vector<float> row(sh.cols);
          for (int r = 0; r < sh.rows; ++r) {
            cpu::dequantize(m.view, r, row.data());
            qb[r] = int8_x_bound(row.data(), xin, sh.cols);
          }
        }
        Dev<float> out((size_t)sh.rows);
        cuda::gemv(m.mat, dx.p(), norm ? dnw.p() : nullptr, 1e-5f, out.p(), false, nullptr);
        std::vector<float> got = out.get();
        // factor 2 with the norm: rsqrtf's own rounding carried through the sum (as above)
        for (int r = 0; r < sh.rows; ++r) {
          ASSERT_NEAR(got[r], ref[r], (norm ? 2 : 1) * tol[r] + qb[r]) << "row " << r;
        }
      }
    }
  }
  // Non-finite x gives non-finite rows (never a finite, wrong logit).
  {
    RandMat m(GgmlType::Q8_0, 8192, 576, 77);
    std::vector<float> x = test::randn(576, 78);
    x[40] = std::numeric_limits<float>::infinity();
    Dev<float> dx(x);
    Dev<float> out((size_t)8192);
    cuda::gemv(m.mat, dx.p(), nullptr, 1e-5f, out.p(), false, nullptr);
    std::vector<float> got = out.get();
    int finite = 0;
    for (float v : got) finite += std::isfinite(v) ? 1 : 0;
    EXPECT_EQ(finite, 0);
  }
  // What it does not take goes through the generic kernel.
  RandMat q4(GgmlType::Q4_0, 8192, 576, 1), few(GgmlType::Q8_0, 8191, 576, 2),
      wide(GgmlType::Q8_0, 8192, 1056, 3);
  EXPECT_FALSE(cuda::head_kernel_takes(q4.mat));
  EXPECT_FALSE(cuda::head_kernel_takes(few.mat));
  EXPECT_FALSE(cuda::head_kernel_takes(wide.mat));
}

TEST(KernelGemv, RejectsUnsupported) {
  REQUIRE_GPU();
  RandMat m(GgmlType::Q4_0, 8, 64, 1);
  cuda::DevMat bad = m.mat;
  bad.type = GgmlType::Q2_K;  // a GGUF type with no device description
  Dev<float> x((size_t)64), out((size_t)8);
  EXPECT_THROW(cuda::gemv(bad, x.p(), nullptr, 0, out.p(), false, nullptr), Error);
  bad = m.mat;
  bad.cols = cuda::kGemvMaxCols + 32;
  EXPECT_THROW(cuda::gemv(bad, x.p(), nullptr, 0, out.p(), false, nullptr), Error);
  bad = m.mat;
  bad.type = GgmlType::Q4_K;
  bad.cols = 96;  // not a whole super-block
  EXPECT_THROW(cuda::gemv(bad, x.p(), nullptr, 0, out.p(), false, nullptr), Error);
}

// A pending residual update (gemma3's post norms, gemv.h ResidualIn) made in the matvec's input
// staging: the input is x + rmsnorm(res)·res_norm, then the matvec's own RMSNorm; block 0 writes
// that sum to x_out and x stays as it was. Gate/up and the raw QKV products against the CPU on that
// input, one-pass and sliced (wider than a pass) shapes, block and float formats. Bound: the
// kernels' fused-norm bound with a factor 3 instead of 2 (two RMSNorms' roundings reach the input).
TEST(KernelGemv, PendingResidualMadeInStaging) {
  REQUIRE_GPU();
  const float eps = 1e-6f;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F32})
    for (int cols : {768, 2048, 4608}) {
      SCOPED_TRACE(testing::Message() << type_name(t) << " cols " << cols);
      const int rows = 512, kv = 128;
      std::vector<float> x = test::randn(cols, 31), res = test::randn(cols, 32),
                         rw = test::randn(cols, 33), nw = test::randn(cols, 34);
      std::vector<float> upd(cols), xnew(cols), xin(cols);
      cpu::rmsnorm(upd.data(), res.data(), rw.data(), cols, eps);
      for (int c = 0; c < cols; ++c) xnew[c] = x[c] + upd[c];
      cpu::rmsnorm(xin.data(), xnew.data(), nw.data(), cols, eps);
      RandMat wg(t, rows, cols, 35), wu(t, rows, cols, 36), wk(t, kv, cols, 37),
          wv(t, kv, cols, 38);
      std::vector<float> g, u, tg, tu, rk, rv, tk, tv, ref(rows);
      ref_gemv(wg.view, xin, g, tg);
      ref_gemv(wu.view, xin, u, tu);
      ref_gemv(wk.view, xin, rk, tk);
      ref_gemv(wv.view, xin, rv, tv);
      cpu::silu_mul(ref.data(), g.data(), u.data(), rows);
      Dev<float> dx(x), dres(res), drw(rw), dnw(nw);
      auto check_x_out = [&](Dev<float>& x_out) {
        const std::vector<float> xo = x_out.get(), xs = dx.get();
        for (int c = 0; c < cols; ++c) {
          ASSERT_NEAR(xo[c], xnew[c], 1e-6f * (std::fabs(x[c]) + std::fabs(upd[c])) + 1e-7f)
              << "x_out " << c;
          ASSERT_EQ(xs[c], x[c]) << "x changed at " << c;
        }
      };
      {
        Dev<float> out((size_t)rows), x_out((size_t)cols);  // poisoned
        cuda::gemv_gate_up(wg.mat, wu.mat, dx.p(), dnw.p(), eps, out.p(), nullptr, 0,
                           {dres.p(), drw.p(), x_out.p()});
        const std::vector<float> got = out.get();
        for (int r = 0; r < rows; ++r) {
          const float b =
              3.f * (1.13f * std::fabs(u[r]) * tg[r] + (std::fabs(g[r]) + 1.f) * tu[r]) +
              1e-6f * std::fabs(ref[r]) + 1e-7f;
          ASSERT_NEAR(got[r], ref[r], b) << "gate_up row " << r;
        }
        check_x_out(x_out);
        if (HasFatalFailure()) return;
      }
      {  // QKV, raw outputs (no RoPE): the gate matrix as Wq, K and V of 128 rows
        Dev<float> q((size_t)rows), k((size_t)kv), v((size_t)kv), x_out((size_t)cols);
        Dev<int> dpos(std::vector<int>{0});
        cuda::QkvArgs a;
        a.wq = wg.mat, a.wk = wk.mat, a.wv = wv.mat, a.x = dx.p(), a.norm_w = dnw.p(), a.eps = eps;
        a.head_dim = 64, a.rope_dim = 64, a.rope_base = 10000.f, a.pos = dpos.p(), a.rope = false;
        a.q_out = q.p(), a.k_out = k.p(), a.v_out = v.p();
        a.res = {dres.p(), drw.p(), x_out.p()};
        cuda::gemv_qkv(a, nullptr);
        const std::vector<float> gq = q.get(), gk = k.get(), gv = v.get();
        for (int r = 0; r < rows; ++r) ASSERT_NEAR(gq[r], g[r], 3.f * tg[r]) << "q row " << r;
        for (int r = 0; r < kv; ++r) {
          ASSERT_NEAR(gk[r], rk[r], 3.f * tk[r]) << "k row " << r;
          ASSERT_NEAR(gv[r], rv[r], 3.f * tv[r]) << "v row " << r;
        }
        check_x_out(x_out);
        if (HasFatalFailure()) return;
        // x_out must be another buffer than x: a clear error.
        a.res.x_out = dx.p();
        EXPECT_THROW(cuda::gemv_qkv(a, nullptr), Error);
      }
    }
}

}  // namespace
}  // namespace smolrt::test::ops
