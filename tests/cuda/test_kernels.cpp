// Every decode kernel against its CPU twin (src/backend/cpu/ops.h) on random data, odd sizes
// included. Outputs are poisoned (NaN bytes) before each kernel runs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "cuda/argmax.h"
#include "cuda/attention_decode.h"
#include "cuda/gemv.h"
#include "cuda/gemv_head.h"
#include "cuda/launch.h"
#include "cuda/prefill_ops.h"
#include "cuda/qkv_finish.h"
#include "cuda/rmsnorm.h"
#include "cuda_test_util.h"
#include "ops/op_table.h"
#include "quant/formats.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;
using test::RandMat;

using test::ops::block_of;
using test::ops::int8_x_bound;
using test::ops::is_float;
using test::ops::ref_gemv;

// --- RMSNorm ---------------------------------------------------------------------------------

TEST(KernelRmsnorm, MatchesCpu) {
  REQUIRE_GPU();
  for (int n : {7, 64, 576, 1000, 2049}) {
    std::vector<float> x = test::randn(n, 1 + n, 3.f), w = test::randn(n, 2 + n);
    Dev<float> dx(x), dw(w), out((size_t)n);
    cuda::rmsnorm(out.p(), dx.p(), dw.p(), n, 1e-5f, nullptr);
    std::vector<float> ref(n);
    cpu::rmsnorm(ref.data(), x.data(), w.data(), n, 1e-5f);
    std::vector<float> got = out.get();
    // rsqrtf (<=2 ulp) and a different summation order: 1e-5 relative is ~50x the typical error.
    for (int i = 0; i < n; ++i) ASSERT_NEAR(got[i], ref[i], 1e-5f * (std::fabs(ref[i]) + 1e-3f));
  }
}

// --- matrix-vector -----------------------------------------------------------------------------

struct Shape {
  int rows, cols;
};

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

struct QkvShape {
  int dim, n_heads, n_kv, head_dim, rope_dim;
  float base;
};

// half: fp16 caches (the multi-sequence backend's fp16 pool).
void check_qkv(GgmlType tq, GgmlType tkv, const QkvShape& s, int pos, int n_ctx, bool fused_norm,
               bool rope_in_epilogue, bool half = false) {
  SCOPED_TRACE(testing::Message() << type_name(tq) << "/" << type_name(tkv) << " dim " << s.dim
                                  << " pos " << pos << " norm " << fused_norm << " epi "
                                  << rope_in_epilogue << " half " << half);
  const int q_dim = s.n_heads * s.head_dim, kv_dim = s.n_kv * s.head_dim;
  RandMat wq(tq, q_dim, s.dim, 1), wk(tq, kv_dim, s.dim, 2), wv(tkv, kv_dim, s.dim, 3);
  std::vector<float> x = test::randn(s.dim, 4), nw = test::randn(s.dim, 5);
  std::vector<float> xin = x;
  if (fused_norm) cpu::rmsnorm(xin.data(), x.data(), nw.data(), s.dim, 1e-5f);
  std::vector<float> rq, rk, rv, tq_, tk, tv;
  ref_gemv(wq.view, xin, rq, tq_);
  ref_gemv(wk.view, xin, rk, tk);
  ref_gemv(wv.view, xin, rv, tv);
  cpu::rope(rq.data(), s.n_heads, s.head_dim, s.rope_dim, pos, s.base);
  cpu::rope(rk.data(), s.n_kv, s.head_dim, s.rope_dim, pos, s.base);

  Dev<float> dx(x), dnw(nw), q((size_t)q_dim), k((size_t)kv_dim), v((size_t)kv_dim);
  Dev<float> kc((size_t)n_ctx * kv_dim), vc((size_t)n_ctx * kv_dim);
  Dev<uint16_t> kh((size_t)n_ctx * kv_dim), vh((size_t)n_ctx * kv_dim);  // 0xffff: fp16 NaN
  void* kcache = half ? (void*)kh.p() : kc.p();
  void* vcache = half ? (void*)vh.p() : vc.p();
  Dev<int> dpos(std::vector<int>{pos});
  cuda::QkvArgs a;
  a.wq = wq.mat;
  a.wk = wk.mat;
  a.wv = wv.mat;
  a.x = dx.p();
  a.norm_w = fused_norm ? dnw.p() : nullptr;
  a.eps = 1e-5f;
  a.head_dim = s.head_dim;
  a.rope_dim = s.rope_dim;
  a.rope_base = s.base;
  a.pos = dpos.p();
  a.rope = rope_in_epilogue;
  a.q_out = q.p();
  a.k_out = rope_in_epilogue ? kcache : k.p();
  a.v_out = rope_in_epilogue ? vcache : v.p();
  a.kv_half = half;
  cuda::gemv_qkv(a, nullptr);
  if (!rope_in_epilogue) {
    cuda::QkvFinishArgs f;
    f.q = q.p(), f.ldq = q_dim, f.k = k.p(), f.v = v.p(), f.ldkv = kv_dim;
    f.k_cache = kcache, f.v_cache = vcache, f.pos_dev = dpos.p(), f.kv_half = half;
    f.n_heads = s.n_heads, f.n_kv_heads = s.n_kv, f.head_dim = s.head_dim;
    f.rope_dim = s.rope_dim, f.rope_base = s.base;
    cuda::qkv_finish(f, nullptr);
  }
  std::vector<float> gq = q.get(), gk = kc.get(), gv = vc.get();
  if (half) {
    const std::vector<uint16_t> hk = kh.get(), hv = vh.get();
    for (size_t i = 0; i < gk.size(); ++i) gk[i] = fp16_to_f32(hk[i]), gv[i] = fp16_to_f32(hv[i]);
  }
  // fp16 caches: one more rounding, 2^-11 relative.
  const float hr = half ? 4.9e-4f : 0.f;
  const float f = fused_norm ? 2.f : 1.f;
  // RoPE mixes two rows: bound = sum of both rows' bounds, plus sincosf/powf rounding at large
  // angles (pos*theta up to ~1e3 rad: ~1e-6 relative).
  for (int r = 0; r < q_dim; ++r) {
    const float b = f * (tq_[r] + tq_[r ^ 1]) + 2e-6f * std::fabs(rq[r]) + 1e-6f;
    ASSERT_NEAR(gq[r], rq[r], b) << "q row " << r;
  }
  for (int r = 0; r < kv_dim; ++r) {
    const float b = f * (tk[r] + tk[r ^ 1]) + (2e-6f + hr) * std::fabs(rk[r]) + 1e-6f;
    ASSERT_NEAR(gk[(size_t)pos * kv_dim + r], rk[r], b) << "k row " << r;
    ASSERT_NEAR(gv[(size_t)pos * kv_dim + r], rv[r], f * tv[r] + hr * std::fabs(rv[r]))
        << "v row " << r;
  }
  // Nothing else in the caches was written (still poison).
  for (size_t i = 0; i < gk.size(); ++i) {
    if (i / kv_dim == (size_t)pos) continue;
    ASSERT_TRUE(std::isnan(gk[i]) && std::isnan(gv[i])) << "cache entry " << i << " written";
  }
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

TEST(KernelQkv, RopeKvAppendMatchCpu) {
  REQUIRE_GPU();
  const QkvShape smol = {576, 9, 3, 64, 64, 100000.f};
  const QkvShape stories = {64, 8, 4, 8, 8, 10000.f};
  const QkvShape partial_rope = {96, 3, 1, 32, 16, 10000.f};
  for (bool epi : {true, false}) {
    for (bool norm : {true, false}) {
      check_qkv(GgmlType::Q4_0, GgmlType::Q4_0, smol, 5, 64, norm, epi);
      check_qkv(GgmlType::Q4_0, GgmlType::Q4_0, smol, 1000, 1024, norm, epi);
      check_qkv(GgmlType::F32, GgmlType::F32, stories, 17, 32, norm, epi);
      check_qkv(GgmlType::F16, GgmlType::F16, partial_rope, 3, 8, norm, epi);
      check_qkv(GgmlType::Q4_0, GgmlType::Q4_0, smol, 77, 128, norm, epi, /*half=*/true);
    }
  }
  // Every format once on a shape it takes (dim 1024: whole K-quant super-blocks).
  const QkvShape wide = {1024, 16, 4, 64, 64, 10000.f};
  for (GgmlType t : test::all_formats())
    check_qkv(t, t, is_float(t) || block_of(t) == 32 ? smol : wide, 9, 16, true, true);
  // SmolLM2-1.7B's projections (dim 2,048: two column slices for the K-quants; 4,608: three for
  // the 32-weight formats).
  const QkvShape big = {2048, 32, 8, 64, 64, 130000.f};
  const QkvShape big32 = {4608, 36, 4, 128, 128, 10000.f};
  check_qkv(GgmlType::Q4_K, GgmlType::Q4_K, big, 300, 512, true, true);
  check_qkv(GgmlType::Q6_K, GgmlType::Q6_K, big, 3, 16, false, false);
  check_qkv(GgmlType::Q4_0, GgmlType::Q4_0, big32, 11, 16, true, true);
  // 9,216 K-quant columns: 9 passes, walked by the 8 warps of an item
  const QkvShape huge = {9216, 4, 1, 64, 64, 10000.f};
  check_qkv(GgmlType::Q4_K, GgmlType::Q6_K, huge, 5, 16, true, true);
  // A K-quant mixture's attn_v (Q6_K, or Q8_0 for rows that are not whole super-blocks) in the
  // same launch as Q and K (the two-type kernel); any other mix: one launch per matrix.
  for (bool epi : {true, false}) {
    check_qkv(GgmlType::Q5_0, GgmlType::Q8_0, smol, 7, 16, true, epi);
    check_qkv(GgmlType::Q4_K, GgmlType::Q6_K, wide, 7, 16, true, epi);
    check_qkv(GgmlType::Q5_K, GgmlType::Q8_0, wide, 3, 16, false, epi);
    check_qkv(GgmlType::Q4_0, GgmlType::F16, smol, 7, 16, true, epi);
    check_qkv(GgmlType::Q4_K, GgmlType::Q6_K, big, 7, 16, true, epi);
  }
}

TEST(KernelGateUp, SiluAndGeluMulMatchCpu) {
  REQUIRE_GPU();
  // The second shape of each type is wider than one pass: column slices over several warps.
  for (int act : {0, 1})
    for (GgmlType t : test::all_formats())
      for (bool wide : {false, true}) {
        const int rows = is_float(t) ? 172 : 1536,
                  cols = is_float(t)
                             ? (wide ? 2080 : 64)
                             : (block_of(t) == 256 ? (wide ? 2048 : 1024) : (wide ? 4608 : 576));
        for (bool norm : {true, false}) {
          SCOPED_TRACE(testing::Message()
                       << type_name(t) << " " << cols << " norm " << norm << " act " << act);
          RandMat wg(t, rows, cols, 21), wu(t, rows, cols, 22);
          std::vector<float> x = test::randn(cols, 23), nw = test::randn(cols, 24), xin = x;
          if (norm) cpu::rmsnorm(xin.data(), x.data(), nw.data(), cols, 1e-5f);
          std::vector<float> g, u, tg, tu, ref(rows);
          ref_gemv(wg.view, xin, g, tg);
          ref_gemv(wu.view, xin, u, tu);
          if (act == 0) {
            cpu::silu_mul(ref.data(), g.data(), u.data(), rows);
          } else {  // GELU, tanh approximation, in double
            for (int r = 0; r < rows; ++r) {
              const double v = g[r];
              ref[r] = (float)(0.5 * v *
                               (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) *
                               u[r]);
            }
          }
          Dev<float> dx(x), dnw(nw), out((size_t)rows);
          cuda::gemv_gate_up(wg.mat, wu.mat, dx.p(), norm ? dnw.p() : nullptr, 1e-5f, out.p(),
                             nullptr, act);
          std::vector<float> got = out.get();
          const float f = norm ? 2.f : 1.f;
          for (int r = 0; r < rows; ++r) {
            // |d(act(g)u)| <= |u|·1.13·dg + |act(g)|·du (silu' <= 1.1, gelu' <= 1.13)
            const float b =
                f * (1.13f * std::fabs(u[r]) * tg[r] + (std::fabs(g[r]) + 1.f) * tu[r]) +
                1e-6f * std::fabs(ref[r]) + 1e-7f;
            ASSERT_NEAR(got[r], ref[r], b) << "row " << r;
          }
        }
      }
}

// --- attention -------------------------------------------------------------------------------

// One decode-attention case: random q and cache (seeds seed, seed+1, seed+2; positions past
// n_pos hold NaN, which the kernel must never read), the CPU twin's output, and the device copies
// with the split scratch and the position slot.
struct AttnCase {
  int n_heads, n_kv, head_dim, n_ctx, n_pos, q_dim;
  std::vector<float> q, kc, vc, ref;  // ref: cpu::attention
  Dev<float> dq, dk, dv, part;
  Dev<int> cnt, dpos;
  AttnCase(int nh, int nkv, int hd, int ctx, int np, uint32_t seed)
      : n_heads(nh),
        n_kv(nkv),
        head_dim(hd),
        n_ctx(ctx),
        n_pos(np),
        q_dim(nh * hd),
        q(test::randn(q_dim, seed, 2.f)),
        kc(cache(seed + 1)),
        vc(cache(seed + 2)),
        ref(q_dim),
        dq(q),
        dk(kc),
        dv(vc),
        part((size_t)nh * cuda::attn_splits(ctx, hd) * (hd + 2)),
        cnt(std::vector<int>(nh, 0)),
        dpos(std::vector<int>{np - 1}) {
    std::vector<float> scratch(np);
    cpu::attention(ref.data(), q.data(), kc.data(), vc.data(), np, nh, nkv, hd, scratch.data());
  }
  std::vector<float> cache(uint32_t seed) const {
    std::vector<float> c = test::randn((size_t)n_ctx * n_kv * head_dim, seed);
    for (size_t i = (size_t)n_pos * n_kv * head_dim; i < c.size(); ++i) c[i] = NAN;
    return c;
  }
  void run(float* out, cudaStream_t s) {
    cuda::attention_decode(out, dq.p(), dk.p(), dv.p(), dpos.p(), n_ctx, n_heads, n_kv, head_dim,
                           {part.p(), cnt.p()}, s);
  }
  // The split counters reset themselves after every launch.
  void expect_counters_reset() const {
    std::vector<int> c = cnt.get();
    for (int h = 0; h < n_heads; ++h) ASSERT_EQ(c[h], 0);
  }
};

void check_attention(int n_heads, int n_kv, int head_dim, int n_ctx, int n_pos) {
  SCOPED_TRACE(testing::Message() << n_heads << "/" << n_kv << "x" << head_dim << " n_pos " << n_pos
                                  << " n_ctx " << n_ctx);
  AttnCase c(n_heads, n_kv, head_dim, n_ctx, n_pos, 31);
  Dev<float> out((size_t)c.q_dim);
  for (int rep = 0; rep < 2; ++rep) {  // twice: the split counters must reset themselves
    out.poison();
    c.run(out.p(), nullptr);
    std::vector<float> got = out.get();
    // Outputs are convex combinations of N(0,1) values; softmax of fp32 scores in another order
    // (and expf vs std::exp) moves them by ~1e-6.
    for (int i = 0; i < c.q_dim; ++i) ASSERT_NEAR(got[i], c.ref[i], 2e-5f) << "out " << i;
  }
  c.expect_counters_reset();
}

TEST(KernelAttention, SplitContextMatchesCpu) {
  REQUIRE_GPU();
  // 1 split, several 32-position splits, 16 splits of 32, then longer splits (chunk 64, 128).
  for (int n_pos : {1, 2, 31, 32, 33, 100, 512, 513, 1000, 2048}) {
    check_attention(9, 3, 64, 2048, n_pos);
  }
  for (int n_pos : {1, 5, 200}) check_attention(8, 4, 8, 256, n_pos);
  check_attention(4, 4, 128, 512, 333);
  check_attention(2, 1, 32, 700, 699);
  check_attention(6, 2, 16, 96, 77);
  check_attention(4, 2, 4, 64, 64);
}

// The one-row steps of the multi-sequence backend: the caches are a paged pool (shuffled pages,
// the sequence's block table in row `seq` of the tables), fp32 or fp16.
// Pages of 2 positions give tables longer than the kernel stages in shared memory (splits past
// them restage); pages of 1 in a context of 8192, splits longer than the staged entries. run: the
// sequence's pages are consecutive (from page 3) and the kernel is told so
// (AttnPages::consecutive).
void check_paged_decode(int n_pos, bool half, int page = 16, bool run = false, int ctx = 1024) {
  SCOPED_TRACE(testing::Message() << "n_pos " << n_pos << (half ? " fp16" : " fp32") << " page "
                                  << page << " ctx " << ctx << (run ? " consecutive pages" : ""));
  const int nh = 9, nkv = 3, hd = 64, kv_dim = nkv * hd, stride = ctx / page, seq = 1;
  const int n_pages = 2 * stride, slots = n_pages * page;
  std::vector<float> q = test::randn(size_t(nh) * hd, 7, 2.f);
  std::vector<float> k = test::randn(size_t(slots) * kv_dim, 8), v = test::randn(k.size(), 9);
  if (half)  // the reference sees the values the kernel reads
    for (auto* a : {&k, &v})
      for (float& x : *a) x = fp16_to_f32(f32_to_fp16(x));
  std::vector<int> tables(2 * stride);
  for (int j = 0; j < 2 * stride; ++j) tables[j] = (j * 37 + 11) % n_pages;  // a permutation
  if (run)
    for (int j = 0; j < stride; ++j) tables[seq * stride + j] = 3 + j;
  std::vector<float> kc(size_t(n_pos) * kv_dim), vc(kc.size()), ref(size_t(nh) * hd), sc(n_pos);
  for (int p = 0; p < n_pos; ++p) {
    const size_t slot = size_t(tables[seq * stride + p / page]) * page + p % page;
    std::copy_n(&k[slot * kv_dim], kv_dim, &kc[size_t(p) * kv_dim]);
    std::copy_n(&v[slot * kv_dim], kv_dim, &vc[size_t(p) * kv_dim]);
  }
  cpu::attention(ref.data(), q.data(), kc.data(), vc.data(), n_pos, nh, nkv, hd, sc.data());
  std::vector<uint16_t> kh, vh;
  for (float x : k) kh.push_back(f32_to_fp16(x));
  for (float x : v) vh.push_back(f32_to_fp16(x));
  Dev<float> dq(q), dk(k), dv(v), out(size_t(nh) * hd);
  Dev<uint16_t> dkh(kh), dvh(vh);
  Dev<int> dt(tables), dseq(std::vector<int>{seq}), dpos(std::vector<int>{n_pos - 1});
  const int n_ctx = stride * page;
  Dev<float> part(size_t(nh) * cuda::attn_splits(n_ctx, hd) * (hd + 2));
  Dev<int> cnt(std::vector<int>(nh, 0));
  // The consecutive-pages flag as a one-row step stages it: 1 with run, else 0 (the table read).
  Dev<int> dflag(std::vector<int>{run ? 1 : 0});
  // Twice each: the split counters must reset themselves. The table found through the sequence
  // index (no flag unless run), then given directly (seq null: as a one-row step stages it).
  for (int rep = 0; rep < 4; ++rep) {
    out.poison();
    const cuda::AttnPages pages =
        rep < 2 ? cuda::AttnPages{dt.p(), dseq.p(), stride, page, half, run ? dflag.p() : nullptr}
                : cuda::AttnPages{dt.p() + seq * stride, nullptr, stride, page, half, dflag.p()};
    cuda::attention_decode(out.p(), dq.p(), half ? (const void*)dkh.p() : dk.p(),
                           half ? (const void*)dvh.p() : dv.p(), dpos.p(), n_ctx, nh, nkv, hd,
                           {part.p(), cnt.p()}, nullptr, pages);
    const std::vector<float> got = out.get();
    // As check_attention: convex combinations of N(0,1) values, fp32 math in another order.
    for (int i = 0; i < nh * hd; ++i) ASSERT_NEAR(got[i], ref[i], 2e-5f) << "out " << i;
  }
}

TEST(KernelAttention, PagedPoolFp32AndFp16) {
  REQUIRE_GPU();
  for (bool half : {false, true})
    for (int n_pos : {1, 17, 128, 700, 1024}) check_paged_decode(n_pos, half);
  for (int n_pos : {3, 513, 1024}) check_paged_decode(n_pos, true, 2);
  for (int n_pos : {300, 5000, 8192}) check_paged_decode(n_pos, n_pos != 5000, 1, false, 8192);
  for (bool half : {false, true})
    for (int n_pos : {1, 130, 1024}) check_paged_decode(n_pos, half, 256, true);
  for (int n_pos : {17, 700}) check_paged_decode(n_pos, true, 16, true);
}

TEST(KernelAttention, NoContextCap) {
  REQUIRE_GPU();
  check_attention(9, 3, 64, 8192, 5000);
  check_attention(9, 3, 64, 8192, 8192);
}

// --- argmax -----------------------------------------------------------------------------------

int gpu_argmax(const std::vector<float>& x) {
  Dev<float> dx(x), pv((size_t)cuda::kArgmaxBlocks);
  Dev<int> pi((size_t)cuda::kArgmaxBlocks), out((size_t)1);
  cuda::argmax(dx.p(), (int)x.size(), pv.p(), pi.p(), out.p(), nullptr);
  return out.get()[0];
}

TEST(KernelArgmax, Cases) {
  REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(gpu_argmax({0.5f, 3.f, -1.f, 2.f}), 1);
  EXPECT_EQ(gpu_argmax(std::vector<float>(1000, 4.25f)), 0);  // all equal -> lowest index
  std::vector<float> last = test::randn(49152, 3);
  last.back() = 100.f;
  EXPECT_EQ(gpu_argmax(last), 49151);
  std::vector<float> ties = test::randn(5000, 4);
  ties[4000] = 50.f;
  ties[1234] = 50.f;
  EXPECT_EQ(gpu_argmax(ties), 1234);
  EXPECT_EQ(gpu_argmax({NAN, 1.f, NAN, 3.f, NAN}), 3);  // NaN never wins
  EXPECT_EQ(gpu_argmax({-inf, NAN, -inf}), 0);          // -inf is a value, NaN is not
  EXPECT_EQ(gpu_argmax({1.f, inf, NAN, inf, 2.f}), 1);  // +inf wins, first of ties
  EXPECT_EQ(gpu_argmax({NAN, NAN, NAN}), 0);            // all NaN -> 0
  EXPECT_EQ(gpu_argmax({-3.f}), 0);
  for (uint32_t seed = 0; seed < 4; ++seed) {
    std::vector<float> v = test::randn(49152, 50 + seed);
    v[seed * 1000 + 7] = NAN;
    EXPECT_EQ(gpu_argmax(v), cpu::argmax(v.data(), (int)v.size())) << "seed " << seed;
  }
  for (int n : {1, 31, 257, 67585}) {
    std::vector<float> v = test::randn(n, n);
    EXPECT_EQ(gpu_argmax(v), cpu::argmax(v.data(), n)) << "n " << n;
  }
}

// argmax_rows (the multi-row steps' argmax, a cluster of blocks per row) vs cpu::argmax per row:
// widths around the blocks' slices, a pitch past the width (scalar loads) or not (16-byte loads),
// ties across slices, NaN, +-inf and all-NaN rows; on a stream (PDL launch) and on the default one.
TEST(KernelArgmax, RowsMatchCpu) {
  REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  for (int cols : {1, 5, 33, 1000, 49152, 128256, 262147})
    for (int pad : {0, 3}) {
      const int ld = cols + pad, rows = cols > 100000 ? 70 : 130;
      std::vector<float> x = test::randn((size_t)rows * ld, (uint32_t)(cols + pad));
      auto row = [&](int r) { return &x[(size_t)r * ld]; };
      std::fill_n(row(0), cols, NAN);              // all NaN: 0
      row(1)[cols - 1] = row(1)[cols / 2] = 1e3f;  // ties in two slices: the lower index
      std::fill_n(row(2), cols - 1, NAN);          // the one value left wins
      std::fill_n(row(3), cols, -inf);             // -inf is a value
      row(4)[cols - 1] = row(4)[cols / 3] = inf;   // +inf wins, the first of ties
      std::fill_n(row(5), cols, 2.f);              // all equal: 0
      row(6)[cols - 1] = 50.f;                     // the last column
      Dev<float> dx(x);
      Dev<int> out((size_t)rows);
      for (cudaStream_t s : {st, (cudaStream_t) nullptr}) {
        // The poison and the read-back run on the legacy default stream, which a non-blocking
        // stream does not wait for or hold up: synchronize around the launch.
        out.poison();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        cuda::argmax_rows(dx.p(), ld, cols, rows, out.p(), s);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<int> got = out.get();
        for (int r = 0; r < rows; ++r)
          ASSERT_EQ(got[r], cpu::argmax(row(r), cols))
              << "row " << r << " cols " << cols << " ld " << ld;
      }
    }
  cudaStreamDestroy(st);
  EXPECT_THROW(cuda::argmax_rows(nullptr, 8, 8, 1, nullptr, nullptr), Error);
}

// --- lm_head with argmax stage 1 fused in -----------------------------------------------------

// gemv_argmax + argmax_final vs gemv + the CPU argmax: bit-identical logits (same kernel body),
// the same id. Returns the id.
int check_fused_argmax(const cuda::DevMat& m, const std::vector<float>& x, const float* norm_w) {
  Dev<float> dx(x), a((size_t)m.rows), b((size_t)m.rows), pv((size_t)cuda::kGemvMaxBlocks);
  Dev<int> pi((size_t)cuda::kGemvMaxBlocks), out((size_t)1);
  cuda::gemv(m, dx.p(), norm_w, 1e-5f, a.p(), false, nullptr);
  const int parts = cuda::gemv_argmax(m, dx.p(), norm_w, 1e-5f, b.p(), pv.p(), pi.p(), nullptr);
  EXPECT_EQ(parts, cuda::gemv_argmax_parts(m));
  EXPECT_GE(parts, 1);
  cuda::argmax_final(pv.p(), pi.p(), parts, out.p(), nullptr);
  const std::vector<float> la = a.get(), lb = b.get();
  // Bitwise (NaN logits included): the same kernel body computes both.
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << "rows " << m.rows;
  const int id = out.get()[0];
  EXPECT_EQ(id, cpu::argmax(la.data(), m.rows)) << "rows " << m.rows;
  return id;
}

TEST(KernelArgmax, FusedWithLmHeadMatchesSeparate) {
  REQUIRE_GPU();
  const std::vector<float> x = test::randn(576, 91);
  Dev<float> norm(test::randn(576, 92));
  RandMat head(GgmlType::Q8_0, 49152, 576, 90);  // the SmolLM2-135M lm_head shape
  check_fused_argmax(head.mat, x, nullptr);
  check_fused_argmax(head.mat, x, norm.p());
  RandMat odd(GgmlType::Q4_0, 1001, 576, 93);  // odd rows: the last item recomputes one row
  check_fused_argmax(odd.mat, x, nullptr);
  RandMat gemma(GgmlType::Q8_0, 262144, 640, 96);  // gemma-3-270m's tied lm_head shape
  check_fused_argmax(gemma.mat, std::vector<float>(test::randn(640, 95)), nullptr);
  RandMat k6(GgmlType::Q6_K, 30001, 1024, 98);  // a K-quant lm_head, more rows than warps
  check_fused_argmax(k6.mat, std::vector<float>(test::randn(1024, 99)), nullptr);
  RandMat k6w(GgmlType::Q6_K, 20001, 2048, 89);  // SmolLM2-1.7B-wide: column slices, grid loops
  check_fused_argmax(k6w.mat, std::vector<float>(test::randn(2048, 88)), nullptr);
  RandMat k3(GgmlType::Q4_K, 5001, 3072, 87);  // 3 slices: two idle warps per block, rounds loop
  check_fused_argmax(k3.mat, std::vector<float>(test::randn(3072, 86)), nullptr);
  RandMat odd8(GgmlType::Q8_0, 8195, 576, 97);  // wide kernel, partial last row group
  check_fused_argmax(odd8.mat, x, norm.p());

  // F32 matrices built to hit the rules: ties -> lowest row across blocks; NaN never wins.
  const int rows = 300, cols = 64;
  const std::vector<float> xs = test::randn(cols, 94);
  std::vector<float> w = test::randn((size_t)rows * cols, 95);
  for (int c = 0; c < cols; ++c) {
    w[(size_t)250 * cols + c] = 10.f * xs[c];  // tie between rows 250 and 280: 250 wins
    w[(size_t)280 * cols + c] = 10.f * xs[c];
    w[(size_t)5 * cols + c] = 20.f * xs[c];  // larger, but NaN below
  }
  w[(size_t)5 * cols + 3] = NAN;
  Dev<float> dw(w);
  const cuda::DevMat fm{GgmlType::F32, rows, cols, dw.p(), nullptr};
  EXPECT_EQ(check_fused_argmax(fm, xs, nullptr), 250);
  std::vector<float> same((size_t)rows * cols);
  for (size_t i = 0; i < same.size(); ++i) same[i] = xs[i % cols];  // all rows equal
  Dev<float> ds(same);
  const cuda::DevMat sm{GgmlType::F32, rows, cols, ds.p(), nullptr};
  EXPECT_EQ(check_fused_argmax(sm, xs, nullptr), 0);
  std::vector<float> xnan = xs;
  xnan[0] = NAN;  // every logit NaN -> 0
  Dev<float> dxn(xnan), lo((size_t)rows), pv((size_t)cuda::kGemvMaxBlocks);
  Dev<int> pi((size_t)cuda::kGemvMaxBlocks), out((size_t)1);
  const int parts = cuda::gemv_argmax(fm, dxn.p(), nullptr, 0, lo.p(), pv.p(), pi.p(), nullptr);
  cuda::argmax_final(pv.p(), pi.p(), parts, out.p(), nullptr);
  EXPECT_EQ(out.get()[0], 0);
  EXPECT_THROW(cuda::argmax_final(pv.p(), pi.p(), 0, out.p(), nullptr), Error);
}

// The decode hand-off: stage 2 writes the id into the token slot, advances the position slot and
// stores the id in pinned host memory (UVA-mapped), for both argmax entry points.
TEST(KernelArgmax, HandOffToNextStep) {
  REQUIRE_GPU();
  std::vector<float> v = test::randn(49152, 96);
  v[31337] = 99.f;
  Dev<float> dv(v), pv((size_t)cuda::kGemvMaxBlocks);
  Dev<int> pi((size_t)cuda::kGemvMaxBlocks), out((size_t)1);
  cuda::PinnedBuffer host(sizeof(int), "test");
  int* hid = static_cast<int*>(host.get());
  int* hid_dev = nullptr;
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&hid_dev), hid, 0));
  for (int round = 0; round < 2; ++round) {
    // Token slot 0; fields 1 and 3 advance, 2 stays (the multi-sequence staging's shape).
    Dev<int> params(std::vector<int>{7, 41, 5, 9});
    const cuda::StepHandoff next{params.p(), params.p(), 0b1010u};
    *hid = -5;
    if (round == 0) {
      cuda::argmax(dv.p(), (int)v.size(), pv.p(), pi.p(), out.p(), nullptr, next, hid_dev);
    } else {
      // The first round's stage-1 partials are still in pv/pi: 192 blocks of 256 threads cover
      // 49152 values.
      cuda::argmax_final(pv.p(), pi.p(), 192, out.p(), nullptr, next, hid_dev);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(params.get(), (std::vector<int>{31337, 42, 5, 10})) << "round " << round;
    EXPECT_EQ(*reinterpret_cast<volatile int*>(hid), 31337) << "round " << round;
    EXPECT_EQ(out.get()[0], 31337);
  }
}

// --- PDL launches give the same results ---------------------------------------------------------

TEST(KernelLaunch, PdlMatchesPlain) {
  REQUIRE_GPU();
  RandMat m(GgmlType::Q4_0, 576, 576, 77);
  std::vector<float> x = test::randn(576, 78);
  Dev<float> dx(x), a((size_t)576), b((size_t)576);
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CUDA_CHECK(cudaDeviceSynchronize());  // the buffers were filled on the legacy stream
  cuda::gemv(m.mat, dx.p(), nullptr, 0, a.p(), false, cuda::Launch(st, false, true));
  cuda::gemv(m.mat, dx.p(), nullptr, 0, b.p(), false, cuda::Launch(st, true, true));
  // chained (PDL edge): same result
  cuda::gemv(m.mat, dx.p(), nullptr, 0, b.p(), true, cuda::Launch(st, true, true));
  CUDA_CHECK(cudaStreamSynchronize(st));
  CUDA_CHECK(cudaStreamDestroy(st));
  std::vector<float> ga = a.get(), gb = b.get();
  for (int i = 0; i < 576; ++i) ASSERT_EQ(gb[i], ga[i] + ga[i]) << i;
}

}  // namespace
}  // namespace smolrt
