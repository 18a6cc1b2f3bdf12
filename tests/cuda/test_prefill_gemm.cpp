// gemm_quant (both paths, every epilogue) against double-precision loops on random data.
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/gemm_quant.h"
#include "prefill_test_util.h"
#include "test_util.h"

using namespace smolrt;
using namespace smolrt::cuda;
using namespace smolrt::test;

namespace {

// Tolerances on ||out - ref|| / ||ref||:
//  Small path: fp32 accumulation over <= 1536 terms, ~1e-6 typical; 2e-5 leaves room for
//    cancellation in near-zero outputs.
//  TensorCore path: weights and activations rounded to fp16 (2^-11 relative each) before the
//    fp32-accumulated MMA; the errors are independent so the relative L2 error is ~6e-4;
//    3e-3 is 5x that.
double tol(GemmPath p) {
  return p == GemmPath::Small ? 2e-5 : 3e-3;
}
const char* pname(GemmPath p) {
  return p == GemmPath::Small ? "small" : "tc";
}

struct Case {
  int n, k;
};

// y_ref[t][r] = sum_k W[r][k] * x'[t][k], x' = rmsnorm(x)*nw when norm.
std::vector<double> ref_gemm(const std::vector<double>& W, int n, int k,
                             const std::vector<float>& x, int t, const std::vector<float>* nw) {
  std::vector<double> y((size_t)t * n), xn(k);
  for (int i = 0; i < t; ++i) {
    if (nw) {
      rmsnorm_ref(&x[(size_t)i * k], nw->data(), k, 1e-5, xn.data());
    } else {
      for (int j = 0; j < k; ++j) xn[j] = x[(size_t)i * k + j];
    }
    for (int r = 0; r < n; ++r) {
      const double* w = &W[(size_t)r * k];
      double s = 0;
      for (int j = 0; j < k; ++j) s += w[j] * xn[j];
      y[(size_t)i * n + r] = s;
    }
  }
  return y;
}

class GemmTokens : public ::testing::TestWithParam<int> {};

TEST_P(GemmTokens, StoreAccumulateNormQ4_0AndQ8_0) {
  REQUIRE_GPU();
  const int T = GetParam();
  const Case cases[] = {{576, 576}, {192, 576}, {576, 1536}, {100, 96}, {38, 32}};
  uint32_t seed = 1000 + T;
  for (const Case& cs : cases) {
    for (GgmlType wt : {GgmlType::Q4_0, GgmlType::Q8_0}) {
      if (wt == GgmlType::Q8_0 && cs.k == 1536) continue;  // lm_head shape class only
      const auto raw =
          wt == GgmlType::Q4_0 ? random_q4_0(cs.n, cs.k, seed++) : random_q8_0(cs.n, cs.k, seed++);
      const auto W = dequant(raw, wt, cs.n, cs.k);
      const auto x = randn((size_t)T * cs.k, seed++, 1.0f);
      auto nw = randn(cs.k, seed++, 0.5f);
      for (float& v : nw) v += 1.0f;
      const auto ref = ref_gemm(W, cs.n, cs.k, x, T, nullptr);
      const auto ref_n = ref_gemm(W, cs.n, cs.k, x, T, &nw);
      DevBuf<uint8_t> dw(raw);
      DevBuf<float> dx(x), dnw(nw), dy((size_t)T * cs.n);
      const auto resid = randn((size_t)T * cs.n, seed++, 1.0f);
      for (GemmPath p : {GemmPath::Small, GemmPath::TensorCore}) {
        SCOPED_TRACE(cat("T=", T, " n=", cs.n, " k=", cs.k, " ", type_name(wt), " ", pname(p)));
        GemmArgs a;
        a.w = dw.p, a.wtype = wt, a.n = cs.n, a.k = cs.k, a.x = dx.p, a.ldx = cs.k, a.t = T;
        GemmOut o;
        o.y = dy.p, o.ldy = cs.n;
        dy.poison();
        gemm_quant(a, GemmEpilogue::Store, o, nullptr, p);
        EXPECT_LT(rel_l2(dy.download(), ref), tol(p));

        a.norm_w = dnw.p;
        dy.poison();
        gemm_quant(a, GemmEpilogue::Store, o, nullptr, p);
        EXPECT_LT(rel_l2(dy.download(), ref_n), tol(p));
        a.norm_w = nullptr;

        if (wt == GgmlType::Q4_0) {  // residual-accumulating variant
          dy.upload(resid);
          gemm_quant(a, GemmEpilogue::Accumulate, o, nullptr, p);
          std::vector<double> want(ref);
          for (size_t i = 0; i < want.size(); ++i) want[i] += resid[i];
          const auto got = dy.download();
          // Compare the added part so the residual's size does not hide GEMM errors.
          std::vector<float> delta(got.size());
          for (size_t i = 0; i < got.size(); ++i) delta[i] = got[i] - resid[i];
          EXPECT_LT(rel_l2(delta, ref), tol(p) + 1e-5);
          EXPECT_LT(rel_l2(got, want), tol(p));
        }
      }
    }
  }
}

TEST_P(GemmTokens, SiluPairInterleaved) {
  REQUIRE_GPU();
  const int T = GetParam();
  const int hid = 1536, dim = 576;
  const auto raw = random_q4_0(2 * hid, dim, 77 + T);
  const auto W = dequant(raw, GgmlType::Q4_0, 2 * hid, dim);
  const auto x = randn((size_t)T * dim, 5 + T);
  auto nw = randn(dim, 9, 0.3f);
  for (float& v : nw) v += 1.0f;
  const auto gu = ref_gemm(W, 2 * hid, dim, x, T, &nw);
  std::vector<double> ref((size_t)T * hid);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < hid; ++j) {
      const double g = gu[(size_t)t * 2 * hid + 2 * j], u = gu[(size_t)t * 2 * hid + 2 * j + 1];
      ref[(size_t)t * hid + j] = g / (1 + std::exp(-g)) * u;
    }
  DevBuf<uint8_t> dw(raw);
  DevBuf<float> dx(x), dnw(nw), dy((size_t)T * hid);
  for (GemmPath p : {GemmPath::Small, GemmPath::TensorCore}) {
    SCOPED_TRACE(cat("T=", T, " ", pname(p)));
    GemmArgs a;
    a.w = dw.p, a.n = 2 * hid, a.k = dim, a.x = dx.p, a.ldx = dim, a.t = T, a.norm_w = dnw.p;
    GemmOut o;
    o.y = dy.p, o.ldy = hid;
    dy.poison();
    gemm_quant(a, GemmEpilogue::SiluPair, o, nullptr, p);
    EXPECT_LT(rel_l2(dy.download(), ref), tol(p) * 2);  // silu*up multiplies two GEMM errors
  }
}

// QKV with RoPE and the KV-cache write, fp16 and fp32 caches, SmolLM and stories-like heads.
TEST_P(GemmTokens, QkvRopeKvWrite) {
  REQUIRE_GPU();
  const int T = GetParam();
  struct H {
    int dim, n_heads, n_kv, hd;
    float base;
  };
  for (const H& h : {H{576, 9, 3, 64, 100000.f}, H{64, 8, 4, 8, 10000.f}}) {
    const int q_dim = h.n_heads * h.hd, kv_dim = h.n_kv * h.hd, n = q_dim + 2 * kv_dim;
    const int pos0 = 13, n_ctx = pos0 + T + 3;
    const auto raw = random_q4_0(n, h.dim, 31 + T);
    const auto W = dequant(raw, GgmlType::Q4_0, n, h.dim);
    const auto x = randn((size_t)T * h.dim, 17 + T);
    auto nw = randn(h.dim, 3, 0.3f);
    for (float& v : nw) v += 1.0f;
    auto ref = ref_gemm(W, n, h.dim, x, T, &nw);
    for (int t = 0; t < T; ++t) {
      double* row = &ref[(size_t)t * n];
      rope_ref(row, h.n_heads, h.hd, h.hd, pos0 + t, h.base);
      rope_ref(row + q_dim, h.n_kv, h.hd, h.hd, pos0 + t, h.base);
    }
    std::vector<double> rq, rk, rv;
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < n; ++c) {
        const double v = ref[(size_t)t * n + c];
        (c < q_dim ? rq : c < q_dim + kv_dim ? rk : rv).push_back(v);
      }
    DevBuf<uint8_t> dw(raw);
    DevBuf<float> dx(x), dnw(nw), dq((size_t)T * q_dim);
    for (bool half : {true, false}) {
      DevBuf<uint8_t> kc((size_t)n_ctx * kv_dim * (half ? 2 : 4)),
          vc((size_t)n_ctx * kv_dim * (half ? 2 : 4));
      for (GemmPath p : {GemmPath::Small, GemmPath::TensorCore}) {
        SCOPED_TRACE(cat("T=", T, " hd=", h.hd, " half=", half, " ", pname(p)));
        kc.poison(), vc.poison(), dq.poison();
        GemmArgs a;
        a.w = dw.p, a.n = n, a.k = h.dim, a.x = dx.p, a.ldx = h.dim, a.t = T, a.norm_w = dnw.p;
        GemmOut o;
        o.y = dq.p, o.ldy = q_dim, o.q_dim = q_dim, o.kv_dim = kv_dim, o.head_dim = h.hd;
        o.rope_dim = h.hd, o.rope_base = h.base, o.pos0 = pos0, o.k_cache = kc.p, o.v_cache = vc.p;
        o.kv_half = half;
        gemm_quant(a, GemmEpilogue::QkvRope, o, nullptr, p);
        EXPECT_LT(rel_l2(dq.download(), rq), tol(p));
        auto read_cache = [&](const DevBuf<uint8_t>& b) {
          const auto bytes = b.download();
          std::vector<float> v((size_t)T * kv_dim);
          for (int t = 0; t < T; ++t)
            for (int c = 0; c < kv_dim; ++c) {
              const size_t idx = (size_t)(pos0 + t) * kv_dim + c;
              if (half) {
                uint16_t u;
                std::memcpy(&u, bytes.data() + idx * 2, 2);
                v[(size_t)t * kv_dim + c] = fp16_to_f32(u);
              } else {
                std::memcpy(&v[(size_t)t * kv_dim + c], bytes.data() + idx * 4, 4);
              }
            }
          // Positions outside [pos0, pos0+T) must be untouched (still poison 0xff).
          const size_t es = half ? 2 : 4;
          for (size_t i = 0; i < (size_t)pos0 * kv_dim * es; ++i) EXPECT_EQ(bytes[i], 0xff);
          for (size_t i = (size_t)(pos0 + T) * kv_dim * es; i < bytes.size(); ++i)
            EXPECT_EQ(bytes[i], 0xff);
          return v;
        };
        // fp16 cache adds one more 2^-11 rounding: bound + 1e-3.
        const double kt = tol(p) + (half ? 1e-3 : 0.0);
        EXPECT_LT(rel_l2(read_cache(kc), rk), kt);
        EXPECT_LT(rel_l2(read_cache(vc), rv), kt);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Batch, GemmTokens, ::testing::Values(1, 7, 32, 100, 512));

TEST(GemmQuant, BadArgumentsThrowError) {
  REQUIRE_GPU();
  DevBuf<float> x(64), y(64);
  DevBuf<uint8_t> w(18 * 4);
  GemmArgs a;
  a.w = w.p, a.n = 2, a.k = 48, a.x = x.p, a.ldx = 48, a.t = 1;  // k not a multiple of 32
  GemmOut o;
  o.y = y.p, o.ldy = 2;
  EXPECT_THROW(gemm_quant(a, GemmEpilogue::Store, o, nullptr), Error);
  a.k = 32, a.wtype = GgmlType::F16;
  EXPECT_THROW(gemm_quant(a, GemmEpilogue::Store, o, nullptr), Error);
  a.wtype = GgmlType::Q8_0;
  EXPECT_THROW(gemm_quant(a, GemmEpilogue::Accumulate, o, nullptr), Error);
  a.wtype = GgmlType::Q4_0, a.n = 3;
  o.ldy = 3;
  EXPECT_THROW(gemm_quant(a, GemmEpilogue::SiluPair, o, nullptr), Error);
}

}  // namespace
