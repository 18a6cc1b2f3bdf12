// gemm (every epilogue, every tile shape) against double-precision loops on random data.
#include <cuda_fp16.h>

#include <cmath>

#include "backend/cuda/device_weights.h"
#include "cuda/gemm.h"
#include "cuda/prefill_test_util.h"
#include "test_util.h"

using namespace smolrt;
using namespace smolrt::cuda;
using namespace smolrt::test;

namespace {

// Tolerance on ||out - ref|| / ||ref||: weights and activations are rounded to fp16 (2^-11
// relative each) before the fp32-accumulated MMA; the errors are independent, so the relative L2
// error is ~6e-4. 3e-3 is 5x that.
constexpr double kTol = 3e-3;

struct Case {
  int n, k;
};

// A raw GGUF Q4_0 matrix on the device in the split layout the backend uploads (stage_matrix).
struct DevQ4 {
  DevBuf<uint8_t> buf;
  DevMat m;
  DevQ4(const std::vector<uint8_t>& raw, int rows, int cols)
      : buf(device_bytes(view(raw, rows, cols))) {
    std::vector<uint8_t> host(buf.n);
    m = stage_matrix(view(raw, rows, cols), host.data(), buf.p);
    buf.upload(host);
  }
  static TensorView view(const std::vector<uint8_t>& raw, int rows, int cols) {
    TensorView t;
    t.name = "test";
    t.type = GgmlType::Q4_0;
    t.rows = rows;
    t.cols = cols;
    t.data = raw.data();
    t.nbytes = raw.size();
    return t;
  }
};

// The fp16 input path: act_to_f16 into a [t][ldh] buffer, then the GEMM reads it (norm applied
// by the conversion). Fills a.xh / a.ldh and clears a.norm_w.
struct F16Input {
  DevBuf<uint16_t> buf;
  int ldh;
  F16Input(int t, int k) : buf((size_t)t * ((k + 63) / 64 * 64)), ldh((k + 63) / 64 * 64) {}
  void use(GemmArgs& a, const float* x, int k, cudaStream_t s) {
    buf.poison();  // pad columns must come from act_to_f16, not from a lucky zero
    CUDA_CHECK(cudaDeviceSynchronize());  // s may not order itself after the legacy stream
    act_to_f16(x, a.ldx, a.t, k, a.norm_w, a.eps, buf.p, ldh, s);
    a.xh = buf.p, a.ldh = ldh, a.norm_w = nullptr;
  }
};

// fp16 fragment-order rows [t][ld] back to [t][cols] floats.
std::vector<float> unpermute(const std::vector<uint16_t>& h, int t, int cols, int ld) {
  std::vector<float> out((size_t)t * cols);
  for (int i = 0; i < t; ++i)
    for (int c = 0; c < cols; ++c)
      out[(size_t)i * cols + c] =
          fp16_to_f32(h[(size_t)i * ld + (c & ~63) + gemm_frag_pos(c & 63)]);
  return out;
}

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

TEST_P(GemmTokens, StoreAccumulateNorm) {
  REQUIRE_GPU();
  const int T = GetParam();
  // SmolLM shapes, plus tails: 100 rows (partial 16-row tile), k = 96 (a one-block last chunk).
  const Case cases[] = {{576, 576}, {192, 576}, {576, 1536}, {100, 96}, {38, 32}};
  uint32_t seed = 1000 + T;
  Stream st;
  for (const Case& cs : cases) {
    const auto raw = random_q4_0(cs.n, cs.k, seed++);
    const auto W = dequant(raw, GgmlType::Q4_0, cs.n, cs.k);
    const auto x = randn((size_t)T * cs.k, seed++, 1.0f);
    auto nw = randn(cs.k, seed++, 0.5f);
    for (float& v : nw) v += 1.0f;
    const auto ref = ref_gemm(W, cs.n, cs.k, x, T, nullptr);
    const auto ref_n = ref_gemm(W, cs.n, cs.k, x, T, &nw);
    DevQ4 dw(raw, cs.n, cs.k);
    DevBuf<float> dx(x), dnw(nw), dy((size_t)T * cs.n);
    const auto resid = randn((size_t)T * cs.n, seed++, 1.0f);
    F16Input xh(T, cs.k);
    // Plain and PDL launches (the test stream does not synchronize with the legacy stream the
    // buffers are filled on: sync around every call), fp32 and fp16 inputs.
    for (cudaStream_t s : {(cudaStream_t) nullptr, st.s})
      for (bool f16 : {false, true}) {
        SCOPED_TRACE(cat("T=", T, " n=", cs.n, " k=", cs.k, " pdl=", s != nullptr, " f16=", f16));
        auto run = [&](GemmArgs a, GemmEpilogue ep, const GemmOut& o, bool split = false) {
          CUDA_CHECK(cudaDeviceSynchronize());
          if (f16) xh.use(a, dx.p, cs.k, s);
          gemm(a, ep, o, Launch(s, true, split));
          CUDA_CHECK(cudaDeviceSynchronize());
        };
        GemmArgs a;
        a.w0 = dw.m, a.x = dx.p, a.ldx = cs.k, a.t = T;
        GemmOut o;
        o.y = dy.p, o.ldy = cs.n;
        dy.poison();
        run(a, GemmEpilogue::Store, o);
        EXPECT_LT(rel_l2(dy.download(), ref), kTol);

        a.norm_w = dnw.p;
        dy.poison();
        run(a, GemmEpilogue::Store, o);
        EXPECT_LT(rel_l2(dy.download(), ref_n), kTol);
        a.norm_w = nullptr;

        // Residual-accumulating variant: one block per output (the default) and K split across
        // blocks with atomic adds.
        for (bool split : {false, true}) {
          SCOPED_TRACE(cat("split_k=", split));
          dy.upload(resid);
          run(a, GemmEpilogue::Accumulate, o, split);
          std::vector<double> want(ref);
          for (size_t i = 0; i < want.size(); ++i) want[i] += resid[i];
          const auto got = dy.download();
          // Compare the added part so the residual's size does not hide GEMM errors.
          std::vector<float> delta(got.size());
          for (size_t i = 0; i < got.size(); ++i) delta[i] = got[i] - resid[i];
          EXPECT_LT(rel_l2(delta, ref), kTol + 1e-5);
          EXPECT_LT(rel_l2(got, want), kTol);
        }
      }
  }
}

TEST_P(GemmTokens, GatePair) {
  REQUIRE_GPU();
  const int T = GetParam();
  const int dim = 576;
  for (int hid : {1536, 100}) {  // 100: a partial 8-column tile
    const auto rg = random_q4_0(hid, dim, 77 + T), ru = random_q4_0(hid, dim, 78 + T);
    const auto G = dequant(rg, GgmlType::Q4_0, hid, dim), U = dequant(ru, GgmlType::Q4_0, hid, dim);
    const auto x = randn((size_t)T * dim, 5 + T);
    auto nw = randn(dim, 9, 0.3f);
    for (float& v : nw) v += 1.0f;
    const auto gr = ref_gemm(G, hid, dim, x, T, &nw), ur = ref_gemm(U, hid, dim, x, T, &nw);
    std::vector<double> ref((size_t)T * hid);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = gr[i] / (1 + std::exp(-gr[i])) * ur[i];
    DevQ4 dg(rg, hid, dim), du(ru, hid, dim);
    DevBuf<float> dx(x), dnw(nw), dy((size_t)T * hid);
    F16Input xh(T, dim);
    const int ldyh = (hid + 63) / 64 * 64;
    DevBuf<uint16_t> dyh((size_t)T * ldyh);
    for (bool f16 : {false, true}) {
      SCOPED_TRACE(cat("T=", T, " hid=", hid, " f16=", f16));
      GemmArgs a;
      a.w0 = dg.m, a.w1 = du.m, a.x = dx.p, a.ldx = dim, a.t = T, a.norm_w = dnw.p;
      if (f16) xh.use(a, dx.p, dim, nullptr);
      GemmOut o;
      o.y = dy.p, o.ldy = hid;
      if (f16) o.yh = dyh.p, o.ldyh = ldyh;  // fp16 output in the down GEMM's input order
      dy.poison(), dyh.poison();
      gemm(a, GemmEpilogue::GatePair, o, nullptr);
      // silu*up multiplies two GEMM errors; the fp16 output adds one 2^-11 rounding.
      const auto got = f16 ? unpermute(dyh.download(), T, hid, ldyh) : dy.download();
      EXPECT_LT(rel_l2(got, ref), kTol * 2 + (f16 ? 1e-3 : 0.0));
    }
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
    const auto rq_raw = random_q4_0(q_dim, h.dim, 31 + T);
    const auto rk_raw = random_q4_0(kv_dim, h.dim, 32 + T);
    const auto rv_raw = random_q4_0(kv_dim, h.dim, 33 + T);
    std::vector<double> W = dequant(rq_raw, GgmlType::Q4_0, q_dim, h.dim);
    for (const auto* r : {&rk_raw, &rv_raw}) {
      const auto part = dequant(*r, GgmlType::Q4_0, kv_dim, h.dim);
      W.insert(W.end(), part.begin(), part.end());
    }
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
    DevQ4 wq(rq_raw, q_dim, h.dim), wk(rk_raw, kv_dim, h.dim), wv(rv_raw, kv_dim, h.dim);
    DevBuf<float> dx(x), dnw(nw), dq((size_t)T * q_dim);
    F16Input xh(T, h.dim);
    for (bool half : {true, false}) {
      const bool f16 = half;  // fp16 input with the fp16 cache, fp32 input with the fp32 one
      DevBuf<uint8_t> kc((size_t)n_ctx * kv_dim * (half ? 2 : 4)),
          vc((size_t)n_ctx * kv_dim * (half ? 2 : 4));
      SCOPED_TRACE(cat("T=", T, " hd=", h.hd, " half=", half, " f16=", f16));
      kc.poison(), vc.poison(), dq.poison();
      GemmArgs a;
      a.w0 = wq.m, a.w1 = wk.m, a.w2 = wv.m, a.x = dx.p, a.ldx = h.dim, a.t = T, a.norm_w = dnw.p;
      if (f16) xh.use(a, dx.p, h.dim, nullptr);
      GemmOut o;
      o.y = dq.p, o.ldy = q_dim, o.q_dim = q_dim, o.kv_dim = kv_dim, o.head_dim = h.hd;
      o.rope_dim = h.hd, o.rope_base = h.base, o.pos0 = pos0, o.k_cache = kc.p, o.v_cache = vc.p;
      o.kv_half = half;
      gemm(a, GemmEpilogue::QkvRope, o, nullptr);
      EXPECT_LT(rel_l2(dq.download(), rq), kTol);
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
      const double kt = kTol + (half ? 1e-3 : 0.0);
      EXPECT_LT(rel_l2(read_cache(kc), rk), kt);
      EXPECT_LT(rel_l2(read_cache(vc), rv), kt);
    }
  }
}

// 1..32: 8-token tiles, K split over warps; 33, 100, 512: 32-token tiles; every size also through
// the fp16 input path (64-token tiles).
INSTANTIATE_TEST_SUITE_P(Batch, GemmTokens, ::testing::Values(1, 7, 16, 32, 33, 100, 512));

// Every register width of the kernel (rows covering ldh with 1, 2, 4, 8 float4s per thread) and
// the rolled loops past them (ldh 9,024), k below ldh (pad columns), ldx above k.
struct ActCase {
  int t, k, ld, ldx;
};

class ActToF16 : public ::testing::TestWithParam<ActCase> {};

TEST_P(ActToF16, NormalizesPermutesAndZeroPads) {
  REQUIRE_GPU();
  const ActCase c = GetParam();
  const int T = c.t, k = c.k, ld = c.ld;
  auto x = randn((size_t)T * c.ldx, 3, 2.0f);
  for (int t = 0; t < T; ++t)  // columns past k are never read: NaN there would show
    for (int col = k; col < c.ldx; ++col) x[(size_t)t * c.ldx + col] = NAN;
  auto nw = randn(k, 4, 0.3f);
  for (float& v : nw) v += 1.0f;
  DevBuf<float> dx(x), dnw(nw);
  DevBuf<uint16_t> out((size_t)T * ld);
  for (bool norm : {false, true}) {
    SCOPED_TRACE(cat("t=", T, " k=", k, " ldh=", ld, " norm=", norm));
    out.poison();
    act_to_f16(dx.p, c.ldx, T, k, norm ? dnw.p : nullptr, 1e-5f, out.p, ld, nullptr);
    const auto h = out.download();
    const auto got = unpermute(h, T, ld, ld);
    std::vector<double> xn(k);
    for (int t = 0; t < T; ++t) {
      if (norm) {
        rmsnorm_ref(&x[(size_t)t * c.ldx], nw.data(), k, 1e-5, xn.data());
      } else {
        for (int col = 0; col < k; ++col) xn[col] = x[(size_t)t * c.ldx + col];
      }
      for (int col = 0; col < ld; ++col) {
        const float g = got[(size_t)t * ld + col];
        if (col >= k) {
          ASSERT_EQ(g, 0.0f) << "pad column " << col;
        } else {
          ASSERT_NEAR(g, xn[col], std::fabs(xn[col]) * 1e-3 + 1e-6) << "t=" << t << " c=" << col;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ActToF16,
                         ::testing::Values(ActCase{5, 100, 128, 100}, ActCase{70, 576, 1536, 576},
                                           ActCase{3, 960, 1024, 964}, ActCase{9, 2048, 2048, 2048},
                                           ActCase{4, 3072, 4096, 3072},
                                           ActCase{2, 9000, 9024, 9000}));

TEST(Gemm, BadArgumentsThrowError) {
  REQUIRE_GPU();
  const auto raw = random_q4_0(16, 64, 1);
  DevQ4 w(raw, 16, 64);
  DevBuf<float> x(64 * 4), y(64 * 4);
  GemmArgs a;
  a.w0 = w.m, a.x = x.p, a.ldx = 64, a.t = 1;
  GemmOut o;
  o.y = y.p, o.ldy = 16;
  gemm(a, GemmEpilogue::Store, o, nullptr);  // the valid baseline does not throw
  GemmArgs bad = a;
  bad.w0.cols = 48;  // k not a multiple of 32
  EXPECT_THROW(gemm(bad, GemmEpilogue::Store, o, nullptr), Error);
  bad = a;
  bad.w0.type = GgmlType::F32;  // the one device format the GEMM does not take
  EXPECT_THROW(gemm(bad, GemmEpilogue::Store, o, nullptr), Error);
  bad.w0.type = GgmlType::Q2_K;  // no device description at all
  EXPECT_THROW(gemm(bad, GemmEpilogue::Store, o, nullptr), Error);
  bad = a;
  bad.ldx = 62;
  EXPECT_THROW(gemm(bad, GemmEpilogue::Store, o, nullptr), Error);
  bad = a;
  bad.t = 0;
  EXPECT_THROW(gemm(bad, GemmEpilogue::Store, o, nullptr), Error);
  bad = a;
  bad.w1 = w.m;
  bad.w1.rows = 8;  // gate and up row counts differ
  EXPECT_THROW(gemm(bad, GemmEpilogue::GatePair, o, nullptr), Error);
  GemmOut q = o;  // QkvRope with q_dim not a multiple of 16
  q.q_dim = 8, q.kv_dim = 4, q.head_dim = 4, q.rope_dim = 4, q.k_cache = y.p, q.v_cache = y.p;
  bad = a;
  bad.w0.rows = 8, bad.w1 = w.m, bad.w2 = w.m, bad.w1.rows = 4, bad.w2.rows = 4;
  EXPECT_THROW(gemm(bad, GemmEpilogue::QkvRope, q, nullptr), Error);
}

}  // namespace
