// The dense path's cuBLASLt GEMM (dense_gemm.h) against the CPU reference over fp16 copies made by
// cuda::dequantize (itself checked for every format by the op table, tests/ops/dequantize.cpp), at
// the models' real shapes (576, 896, 2048 and 8192 columns) and 1 to 520 rows, with fp32 / fp16
// outputs and the accumulating (residual) form; outputs poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda/cuda_test_util.h"
#include "cuda/dense_gemm.h"
#include "cuda/dequantize.h"
#include "cuda/gemm.h"
#include "cuda/prefill_ops.h"
#include "cuda/prefill_test_util.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;
using test::RandMat;
using test::rel_l2;

// y[t][r] = sum_k W[r][k] x[t][k] in double over the CPU dequantization, for the listed rows.
std::vector<double> ref_rows(const RandMat& m, const std::vector<float>& x, int t,
                             const std::vector<int>& rows) {
  const int k = (int)m.view.cols;
  std::vector<float> w(k);
  std::vector<double> y((size_t)t * rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    cpu::dequantize(m.view, rows[i], w.data());
    for (int j = 0; j < t; ++j) {
      double s = 0;
      for (int c = 0; c < k; ++c) s += (double)w[c] * x[(size_t)j * k + c];
      y[(size_t)j * rows.size() + i] = s;
    }
  }
  return y;
}

// Weights and activations each rounded once to fp16, fp32 accumulation: ~6e-4 relative L2 for
// independent errors (the quantized GEMM's bound, gemm's test); 3e-3 with margin for every
// format, as there.
constexpr double kTol = 3e-3;

struct Shape {
  int rows, cols;
};

TEST(DenseGemm, MatchesCpuAtModelShapes) {
  REQUIRE_GPU();
  // Output rows x columns as the models have them: SmolLM-135M (576), Qwen2.5-0.5B (896),
  // Llama-3.2-1B / SmolLM2-1.7B (2048), a down projection (8192 columns).
  const Shape shapes[] = {{576, 576}, {896, 896}, {1024, 2048}, {256, 8192}};
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K,
                            GgmlType::F16};
  cuda::DenseGemm gemm;
  uint32_t seed = 1000;
  for (const Shape& sh : shapes) {
    for (GgmlType t : types) {
      if (sh.cols % type_info(t)->block_size) continue;  // (models fall back to Q5_0 there)
      RandMat m(t, sh.rows, sh.cols, seed++);
      Dev<uint16_t> wd((size_t)sh.rows * sh.cols);
      cuda::dequantize(m.mat, wd.p(), sh.cols, nullptr);
      // Rows checked against the double reference: a spread sample (the GEMM is blind to which).
      std::vector<int> check;
      for (int r = 0; r < sh.rows; r += std::max(1, sh.rows / 24)) check.push_back(r);
      check.push_back(sh.rows - 1);
      for (int T : {1, 7, 64, 300, 520}) {
        SCOPED_TRACE(testing::Message()
                     << type_name(t) << " " << sh.rows << "x" << sh.cols << " T=" << T);
        const std::vector<float> x = test::randn((size_t)T * sh.cols, seed++);
        Dev<float> dx(x);
        Dev<uint16_t> xh((size_t)T * sh.cols);
        cuda::act_to_f16(dx.p(), sh.cols, T, sh.cols, nullptr, 1e-5f, xh.p(), sh.cols, nullptr,
                         cuda::F16Order::kRowMajor);
        const std::vector<double> ref = ref_rows(m, x, T, check);
        auto pick = [&](const std::vector<float>& y) {
          std::vector<float> v;
          for (int j = 0; j < T; ++j)
            for (int r : check) v.push_back(y[(size_t)j * sh.rows + r]);
          return v;
        };
        // fp32 store
        Dev<float> y((size_t)T * sh.rows);
        gemm.run(wd.p(), sh.rows, sh.cols, xh.p(), sh.cols, T, {y.p(), sh.rows, false, false},
                 nullptr);
        const std::vector<float> got = y.get();
        for (float v : got) ASSERT_TRUE(std::isfinite(v));  // every element written
        EXPECT_LT(rel_l2(pick(got), ref), kTol);
        // accumulate onto a residual: y = r + product
        const std::vector<float> res = test::randn((size_t)T * sh.rows, seed++);
        Dev<float> ya(res);
        gemm.run(wd.p(), sh.rows, sh.cols, xh.p(), sh.cols, T, {ya.p(), sh.rows, false, true},
                 nullptr);
        const std::vector<float> acc = ya.get();
        std::vector<float> diff(acc.size());
        for (size_t i = 0; i < acc.size(); ++i) diff[i] = acc[i] - res[i];
        EXPECT_LT(rel_l2(pick(diff), ref), kTol);
        // fp16 store (the gate/up form), one more rounding of each output
        Dev<uint16_t> yh((size_t)T * sh.rows);
        gemm.run(wd.p(), sh.rows, sh.cols, xh.p(), sh.cols, T, {yh.p(), sh.rows, true, false},
                 nullptr);
        std::vector<float> gh;
        for (uint16_t h : yh.get()) gh.push_back(fp16_to_f32(h));
        EXPECT_LT(rel_l2(pick(gh), ref), kTol);
      }
    }
  }
}

TEST(DenseGemm, BadArgumentsAreErrors) {
  REQUIRE_GPU();
  cuda::DenseGemm gemm;
  Dev<uint16_t> w(64 * 64), x(64 * 8);
  Dev<float> y(64 * 8);
  EXPECT_THROW(gemm.run(w.p(), 64, 60, x.p(), 64, 8, {y.p(), 64, false, false}, nullptr), Error);
  EXPECT_THROW(gemm.run(w.p(), 64, 64, x.p(), 60, 8, {y.p(), 64, false, false}, nullptr), Error);
  EXPECT_THROW(gemm.run(w.p(), 64, 64, x.p(), 64, 8, {y.p(), 32, false, false}, nullptr), Error);
  EXPECT_THROW(gemm.run(w.p(), 64, 64, x.p(), 64, 8, {x.p(), 64, true, true}, nullptr), Error);
  EXPECT_THROW(gemm.run(nullptr, 64, 64, x.p(), 64, 8, {y.p(), 64, false, false}, nullptr), Error);
}

// gated_act: act(gate) * up over [gate | up] fp16 rows, SiLU and GELU-tanh, against the CPU twin's
// expressions in double.
TEST(DenseGemm, GatedActMatchesCpu) {
  REQUIRE_GPU();
  for (int act : {0, 1}) {
    const int n = 37, hid = 1536, ldgu = 2 * hid, ldo = hid + 8;
    const std::vector<float> g = test::randn((size_t)n * ldgu, 77 + act, 3.f);
    std::vector<uint16_t> gh(g.size());
    for (size_t i = 0; i < g.size(); ++i) gh[i] = f32_to_fp16(g[i]);
    Dev<uint16_t> dg(gh), out((size_t)n * ldo);
    cuda::gated_act(dg.p(), ldgu, n, hid, act, out.p(), ldo, nullptr);
    const std::vector<uint16_t> o = out.get();
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < hid; ++j) {
        const double gv = fp16_to_f32(gh[(size_t)i * ldgu + j]);
        const double uv = fp16_to_f32(gh[(size_t)i * ldgu + hid + j]);
        const double a =
            act == 1
                ? 0.5 * gv * (1 + std::tanh(0.7978845608028654 * (gv + 0.044715 * gv * gv * gv)))
                : gv / (1 + std::exp(-gv));
        const double want = a * uv, got = fp16_to_f32(o[(size_t)i * ldo + j]);
        ASSERT_NEAR(got, want, std::fabs(want) * 1.5e-3 + 1e-5)
            << "act " << act << " " << i << "," << j;
      }
  }
}

}  // namespace
}  // namespace smolrt
