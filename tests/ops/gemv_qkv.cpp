// gemv_qkv: the decode step's QKV matvec with its epilogue (RoPE, K/V into the cache, gemv.h)
// against cpu::gemv, cpu::rope_ext and the cache rows, and with qkv_finish after it.
// Outputs are poisoned (NaN bytes) before each kernel runs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda/cuda_test_util.h"
#include "cuda/gemv.h"
#include "cuda/qkv_finish.h"
#include "ops/op_table.h"
#include "quant/formats.h"
#include "test_util.h"

namespace smolrt::test::ops {
namespace {

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
    f.k_cache = kcache, f.v_cache = vcache, f.row_pos = dpos.p(), f.kv_half = half;
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

}  // namespace
}  // namespace smolrt::test::ops
