// The prefill GEMM (gemm_q4.h) for every weight format it takes, against double-precision loops
// over the CPU reference dequantization, on random raw blocks (test::RandMat: every quant bit
// pattern, realistic scales), fp32 and fp16 activation paths, outputs poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda/gemm_q4.h"
#include "cuda_test_util.h"
#include "prefill_test_util.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;
using test::RandMat;
using test::rel_l2;

// y[t][r] = sum_k W[r][k] x[t][k] in double over the CPU dequantization of W.
std::vector<double> ref_gemm(const RandMat& m, const std::vector<float>& x, int t) {
  const int n = (int)m.view.rows, k = (int)m.view.cols;
  std::vector<float> row(k);
  std::vector<double> y((size_t)t * n);
  for (int r = 0; r < n; ++r) {
    cpu::dequant_row(m.view, r, row.data());
    for (int i = 0; i < t; ++i) {
      double s = 0;
      for (int j = 0; j < k; ++j) s += (double)row[j] * x[(size_t)i * k + j];
      y[(size_t)i * n + r] = s;
    }
  }
  return y;
}

// Every format but F32, which the GEMM does not take (cuda::gemm_takes).
std::vector<GgmlType> gemm_types() {
  std::vector<GgmlType> v;
  for (GgmlType t : test::all_formats())
    if (t != GgmlType::F32) v.push_back(t);
  return v;
}

// Weights and activations are rounded to fp16 (2^-11 relative each) before the fp32-accumulated
// MMA; independent errors give a relative L2 error near 6e-4 (gemm_q4's own test); the formats
// with a minimum add the rounding of d*q + m (same order), so 3e-3 holds for all with margin.
constexpr double kTol = 3e-3;

TEST(GemmFormats, StoreMatchesReferenceForEveryFormat) {
  REQUIRE_GPU();
  // 192 x 1024: whole K-quant super-blocks, 12 row tiles. Token counts: one 8-token tile, a
  // partial 32-token tile, and the fp16 path's 64-token tiles (from kGemmF16MinTokens on).
  const int n = 192, k = 1024;
  uint32_t seed = 500;
  for (GgmlType t : gemm_types()) {
    ASSERT_TRUE(cuda::gemm_takes(t)) << type_name(t);
    RandMat m(t, n, k, seed++);
    for (int T : {7, 33, cuda::kGemmF16MinTokens}) {
      SCOPED_TRACE(testing::Message() << type_name(t) << " T=" << T);
      const std::vector<float> x = test::randn((size_t)T * k, seed++);
      const std::vector<double> ref = ref_gemm(m, x, T);
      Dev<float> dx(x), dy((size_t)T * n);
      cuda::GemmQ4Args a;
      a.w0 = m.mat, a.x = dx.p(), a.ldx = k, a.t = T;
      cuda::GemmOut o;
      o.y = dy.p(), o.ldy = n;
      // fp32 input (converted in the GEMM's staging)
      cuda::gemm_q4(a, cuda::GemmEpilogue::Store, o, nullptr);
      EXPECT_LT(rel_l2(dy.get(), ref), kTol);
      // fp16 input in fragment order (act_to_f16)
      const int ldh = (k + 63) / 64 * 64;
      Dev<uint16_t> xh((size_t)T * ldh);
      cuda::act_to_f16(dx.p(), k, T, k, nullptr, 1e-5f, xh.p(), ldh, nullptr);
      a.xh = xh.p(), a.ldh = ldh;
      dy.poison();
      cuda::gemm_q4(a, cuda::GemmEpilogue::Store, o, nullptr);
      EXPECT_LT(rel_l2(dy.get(), ref), kTol);
    }
  }
}

// fp16 input at the 1B-2B models' widths (k = 2,048 and 8,192: the token tile shrinks until a
// block's K range fits shared memory) and at token counts past one 32-token tile; 80 rows: a
// partial group of row tiles. Store, and Accumulate with K split across blocks (the down GEMM's
// launch) and without.
TEST(GemmFormats, F16InputAtModelWidths) {
  REQUIRE_GPU();
  const int n = 80;
  uint32_t seed = 900;
  for (GgmlType t : gemm_types())
    for (int k : {2048, 8192}) {
      RandMat m(t, n, k, seed++);
      for (int T : {40, 64, 97}) {
        SCOPED_TRACE(testing::Message() << type_name(t) << " k=" << k << " T=" << T);
        const std::vector<float> x = test::randn((size_t)T * k, seed++);
        const std::vector<double> ref = ref_gemm(m, x, T);
        Dev<float> dx(x), dy((size_t)T * n);
        const int ldh = (k + 63) / 64 * 64;
        Dev<uint16_t> xh((size_t)T * ldh);
        cuda::act_to_f16(dx.p(), k, T, k, nullptr, 1e-5f, xh.p(), ldh, nullptr);
        cuda::GemmQ4Args a;
        a.w0 = m.mat, a.xh = xh.p(), a.ldh = ldh, a.t = T;
        cuda::GemmOut o;
        o.y = dy.p(), o.ldy = n;
        dy.poison();
        cuda::gemm_q4(a, cuda::GemmEpilogue::Store, o, nullptr);
        EXPECT_LT(rel_l2(dy.get(), ref), kTol);
        for (bool split : {false, true}) {
          SCOPED_TRACE(split ? "split K" : "one block per output");
          CUDA_CHECK(cudaMemset(dy.p(), 0, sizeof(float) * T * n));
          cuda::gemm_q4(a, cuda::GemmEpilogue::Accumulate, o, cuda::Launch(nullptr, false, split));
          EXPECT_LT(rel_l2(dy.get(), ref), kTol);
        }
      }
    }
}

// The fused RMSNorm on a residual stream past the fp16 range (gemma3's reaches ~1e5 and its norm
// weights ~1e3): the GEMM normalizes before rounding to fp16, so the output stays finite and
// within the usual bound; fp32 input (small batches) and fp16 input through act_to_f16 (long rows
// past the 64-token tile: k = 2048 without a K split, the Store epilogue).
TEST(GemmFormats, NormFusedInputPastFp16Range) {
  REQUIRE_GPU();
  for (int T : {9, 600}) {
    SCOPED_TRACE(testing::Message() << T << " tokens");
    const int dim = 2048, rows = 96;
    std::vector<float> x = test::randn((size_t)T * dim, 51, 3e4f), nw = test::randn(dim, 52, 50.f);
    for (float& w : nw) w += 300.f;
    for (int i = 0; i < T; ++i) x[(size_t)i * dim + i % dim] = 1.2e5f;
    std::vector<float> xn((size_t)T * dim);
    for (int i = 0; i < T; ++i) {
      double ss = 0;
      for (int j = 0; j < dim; ++j) ss += (double)x[(size_t)i * dim + j] * x[(size_t)i * dim + j];
      const double r = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (int j = 0; j < dim; ++j)
        xn[(size_t)i * dim + j] = (float)(x[(size_t)i * dim + j] * r * nw[j]);
    }
    RandMat w(GgmlType::Q8_0, rows, dim, 53);
    const std::vector<double> ref = ref_gemm(w, xn, T);
    Dev<float> dx(x), dnw(nw), dy((size_t)T * rows);
    cuda::GemmQ4Args a;
    a.w0 = w.mat, a.t = T, a.eps = 1e-6f;
    const int ldh = (dim + 63) / 64 * 64;
    Dev<uint16_t> xh((size_t)T * ldh);
    if (T >= cuda::kGemmF16MinTokens) {
      cuda::act_to_f16(dx.p(), dim, T, dim, dnw.p(), 1e-6f, xh.p(), ldh, nullptr);
      a.xh = xh.p(), a.ldh = ldh;
    } else {
      a.x = dx.p(), a.ldx = dim, a.norm_w = dnw.p();
    }
    cuda::GemmOut o;
    o.y = dy.p(), o.ldy = rows;
    cuda::gemm_q4(a, cuda::GemmEpilogue::Store, o, nullptr);
    const std::vector<float> got = dy.get();
    for (float v : got) ASSERT_TRUE(std::isfinite(v));
    EXPECT_LT(rel_l2(got, ref), kTol);
  }
}

TEST(GemmFormats, GatePairAndMixedQkvRopeMatchReference) {
  REQUIRE_GPU();
  const int dim = 512, hid = 256, T = 9;
  const std::vector<float> x = test::randn((size_t)T * dim, 41);
  Dev<float> dx(x);
  // GatePair over a K-quant gate/up pair, with SiLU (llama) and GELU-tanh (gemma3).
  for (int act : {0, 1}) {
    SCOPED_TRACE(act ? "gelu" : "silu");
    RandMat g(GgmlType::Q4_K, hid, dim, 42), u(GgmlType::Q4_K, hid, dim, 43);
    const std::vector<double> rg = ref_gemm(g, x, T), ru = ref_gemm(u, x, T);
    std::vector<double> ref(rg.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double v = rg[i];
      const double a =
          act ? 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
              : v / (1.0 + std::exp(-v));
      ref[i] = a * ru[i];
    }
    Dev<float> dy((size_t)T * hid);
    cuda::GemmQ4Args a;
    a.w0 = g.mat, a.w1 = u.mat, a.x = dx.p(), a.ldx = dim, a.t = T;
    cuda::GemmOut o;
    o.y = dy.p(), o.ldy = hid, o.act = act;
    cuda::gemm_q4(a, cuda::GemmEpilogue::GatePair, o, nullptr);
    EXPECT_LT(rel_l2(dy.get(), ref), kTol);
  }
  // QkvRope with Q, K in Q4_K and V in Q6_K or Q8_0 (a Q4_K_M mixture's attn_v: the two-type
  // kernel, one launch) or F16 (one launch per matrix). 80 rows of Q: the Q/K blocks' last one
  // is partial. rope_dim 0 leaves the values unrotated, so the reference is the three plain
  // products; q goes to y, k and v to the fp32 caches at rows pos0..pos0+T-1.
  for (GgmlType tv : {GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16}) {
    SCOPED_TRACE(type_name(tv));
    const int q_dim = 80 * 4, kv_dim = 80, pos0 = 3, n_ctx = 16;
    RandMat wq(GgmlType::Q4_K, q_dim, dim, 44), wk(GgmlType::Q4_K, kv_dim, dim, 45),
        wv(tv, kv_dim, dim, 46);
    Dev<float> dq((size_t)T * q_dim), kc((size_t)n_ctx * kv_dim), vc((size_t)n_ctx * kv_dim);
    cuda::GemmQ4Args a;
    a.w0 = wq.mat, a.w1 = wk.mat, a.w2 = wv.mat, a.x = dx.p(), a.ldx = dim, a.t = T;
    cuda::GemmOut o;
    o.y = dq.p(), o.ldy = q_dim, o.q_dim = q_dim, o.kv_dim = kv_dim, o.head_dim = 80;
    o.rope_dim = 0, o.pos0 = pos0, o.k_cache = kc.p(), o.v_cache = vc.p(), o.kv_half = false;
    cuda::gemm_q4(a, cuda::GemmEpilogue::QkvRope, o, nullptr);
    EXPECT_LT(rel_l2(dq.get(), ref_gemm(wq, x, T)), kTol);
    const std::vector<float> k = kc.get(), v = vc.get();
    EXPECT_LT(rel_l2(std::vector<float>(k.begin() + pos0 * kv_dim, k.begin() + (pos0 + T) * kv_dim),
                     ref_gemm(wk, x, T)),
              kTol);
    EXPECT_LT(rel_l2(std::vector<float>(v.begin() + pos0 * kv_dim, v.begin() + (pos0 + T) * kv_dim),
                     ref_gemm(wv, x, T)),
              kTol);
  }
  // gate and up of different types are refused (one kernel reads both).
  {
    RandMat g(GgmlType::Q4_K, hid, dim, 47), u(GgmlType::Q6_K, hid, dim, 48);
    Dev<float> dy((size_t)T * hid);
    cuda::GemmQ4Args a;
    a.w0 = g.mat, a.w1 = u.mat, a.x = dx.p(), a.ldx = dim, a.t = T;
    cuda::GemmOut o;
    o.y = dy.p(), o.ldy = hid;
    EXPECT_THROW(cuda::gemm_q4(a, cuda::GemmEpilogue::GatePair, o, nullptr), Error);
  }
}

}  // namespace
}  // namespace smolrt
