// The many-row GEMM (gemm.h) beyond the op table's plain and accumulating forms
// (tests/ops/gemm.cpp): the fused RMSNorm past fp16's range, the gate/up pair and the mixed-format
// QKV with RoPE, on several weight formats, against double-precision loops over the CPU
// dequantization.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda/cuda_test_util.h"
#include "cuda/gemm.h"
#include "cuda/prefill_test_util.h"
#include "ops/op_table.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;
using test::RandMat;
using test::rel_l2;

// Weights and activations are rounded to fp16 (2^-11 relative each) before the fp32-accumulated
// MMA; independent errors give a relative L2 error near 6e-4 (gemm's own test); the formats
// with a minimum add the rounding of d*q + m (same order), so 3e-3 holds for all with margin.
constexpr double kTol = 3e-3;

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
    const std::vector<double> ref = test::ops::ref_gemm(w.view, xn, T);
    Dev<float> dx(x), dnw(nw), dy((size_t)T * rows);
    cuda::GemmArgs a;
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
    cuda::gemm(a, cuda::GemmEpilogue::Store, o, nullptr);
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
    const std::vector<double> rg = test::ops::ref_gemm(g.view, x, T),
                              ru = test::ops::ref_gemm(u.view, x, T);
    std::vector<double> ref(rg.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double v = rg[i];
      const double a =
          act ? 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
              : v / (1.0 + std::exp(-v));
      ref[i] = a * ru[i];
    }
    Dev<float> dy((size_t)T * hid);
    cuda::GemmArgs a;
    a.w0 = g.mat, a.w1 = u.mat, a.x = dx.p(), a.ldx = dim, a.t = T;
    cuda::GemmOut o;
    o.y = dy.p(), o.ldy = hid, o.act = act;
    cuda::gemm(a, cuda::GemmEpilogue::GatePair, o, nullptr);
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
    cuda::GemmArgs a;
    a.w0 = wq.mat, a.w1 = wk.mat, a.w2 = wv.mat, a.x = dx.p(), a.ldx = dim, a.t = T;
    cuda::GemmOut o;
    o.y = dq.p(), o.ldy = q_dim, o.q_dim = q_dim, o.kv_dim = kv_dim, o.head_dim = 80;
    o.rope_dim = 0, o.pos0 = pos0, o.k_cache = kc.p(), o.v_cache = vc.p(), o.kv_half = false;
    cuda::gemm(a, cuda::GemmEpilogue::QkvRope, o, nullptr);
    EXPECT_LT(rel_l2(dq.get(), test::ops::ref_gemm(wq.view, x, T)), kTol);
    const std::vector<float> k = kc.get(), v = vc.get();
    EXPECT_LT(rel_l2(std::vector<float>(k.begin() + pos0 * kv_dim, k.begin() + (pos0 + T) * kv_dim),
                     test::ops::ref_gemm(wk.view, x, T)),
              kTol);
    EXPECT_LT(rel_l2(std::vector<float>(v.begin() + pos0 * kv_dim, v.begin() + (pos0 + T) * kv_dim),
                     test::ops::ref_gemm(wv.view, x, T)),
              kTol);
  }
  // gate and up of different types are refused (one kernel reads both).
  {
    RandMat g(GgmlType::Q4_K, hid, dim, 47), u(GgmlType::Q6_K, hid, dim, 48);
    Dev<float> dy((size_t)T * hid);
    cuda::GemmArgs a;
    a.w0 = g.mat, a.w1 = u.mat, a.x = dx.p(), a.ldx = dim, a.t = T;
    cuda::GemmOut o;
    o.y = dy.p(), o.ldy = hid;
    EXPECT_THROW(cuda::gemm(a, cuda::GemmEpilogue::GatePair, o, nullptr), Error);
  }
}

}  // namespace
}  // namespace smolrt
