// qkv_finish: the Q/K/V finishing kernel of every architecture switch (qkv_finish.h: biases,
// per-head RMSNorm of Q and K, normal or NeoX RoPE with per-layer bases and llama3 frequency
// factors, K/V into the cache) against its CPU twin cpu::qkv_finish row by row, and its argument
// checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "cuda/attention_decode.h"
#include "cuda/attention_paged.h"
#include "cuda/cuda_test_util.h"
#include "cuda/prefill_test_util.h"
#include "cuda/qkv_finish.h"
#include "cuda/rmsnorm.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;

// --- qkv_finish ---------------------------------------------------------------------------------

struct FinishCase {
  const char* name;
  int n_heads, n_kv, hd, rope_dim;
  bool bias, norm, neox, factors, half;
  int ring = 0;  // > 0: no slots, K/V of position p at row p % ring (a sliding-window ring cache)
};

// n rows: 13 fill whole groups of rows and a partial one at every head_dim; 1,100 make a grid past
// a few resident waves, so each block takes several groups in turn.
void check_finish(const FinishCase& fc, int n = 13) {
  SCOPED_TRACE(fc.name);
  const int pos0 = 37, q_dim = fc.n_heads * fc.hd, kv_dim = fc.n_kv * fc.hd;
  const int slots = n <= 64 ? 64 : 2048;  // >= n, and a power of two: the slots below are distinct
  const float eps = 1e-6f, base = 10000.f;
  std::vector<float> q = test::randn((size_t)n * q_dim, 1, 2.f),
                     k = test::randn((size_t)n * kv_dim, 2, 2.f),
                     v = test::randn((size_t)n * kv_dim, 3, 2.f);
  std::vector<float> bq = test::randn(q_dim, 4, 0.5f), bk = test::randn(kv_dim, 5, 0.5f),
                     bv = test::randn(kv_dim, 6, 0.5f);
  std::vector<float> qn = test::randn(fc.hd, 7, 0.3f), kn = test::randn(fc.hd, 8, 0.3f);
  for (float& x : qn) x += 1.f;
  for (float& x : kn) x += 1.f;
  std::vector<float> fac(fc.rope_dim / 2);
  for (int i = 0; i < (int)fac.size(); ++i) fac[i] = 1.f + (float)(i % 7);  // 1..7
  std::vector<int> slot(n);
  for (int i = 0; i < n; ++i) {
    slot[i] = fc.ring > 0 ? (pos0 + i) % fc.ring : (i * 13 + 5) % slots;  // scattered pool rows
  }

  Dev<float> dq(q), dk(k), dv(v), dbq(bq), dbk(bk), dbv(bv), dqn(qn), dkn(kn), dfac(fac);
  Dev<int> dslot(slot);
  const size_t elt = fc.half ? 2 : 4;
  cuda::DeviceBuffer kc(slots * kv_dim * elt, "test"), vc(slots * kv_dim * elt, "test");
  CUDA_CHECK(cudaMemset(kc.get(), 0xff, kc.size()));
  CUDA_CHECK(cudaMemset(vc.get(), 0xff, vc.size()));
  cuda::QkvFinishArgs a;
  a.n = n, a.q = dq.p(), a.ldq = q_dim, a.k = dk.p(), a.v = dv.p(), a.ldkv = kv_dim;
  a.k_cache = kc.get(), a.v_cache = vc.get(), a.kv_half = fc.half, a.pos0 = pos0;
  if (fc.ring > 0) {
    a.ring = fc.ring;
  } else {
    a.row_slot = dslot.p();
  }
  if (fc.bias) a.bq = dbq.p(), a.bk = dbk.p(), a.bv = dbv.p();
  if (fc.norm) a.q_norm = dqn.p(), a.k_norm = dkn.p();
  a.eps = eps, a.n_heads = fc.n_heads, a.n_kv_heads = fc.n_kv, a.head_dim = fc.hd;
  a.rope_dim = fc.rope_dim, a.rope_base = base, a.neox = fc.neox;
  if (fc.factors) a.freq_factors = dfac.p();
  cuda::qkv_finish(a, nullptr);

  const std::vector<float> gq = dq.get();
  std::vector<float> gk(slots * kv_dim), gv(slots * kv_dim);
  std::vector<uint16_t> hk(fc.half ? slots * kv_dim : 0), hv(hk.size());
  CUDA_CHECK(cudaDeviceSynchronize());
  if (fc.half) {
    CUDA_CHECK(cudaMemcpy(hk.data(), kc.get(), kc.size(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hv.data(), vc.get(), vc.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < hk.size(); ++i) gk[i] = fp16_to_f32(hk[i]), gv[i] = fp16_to_f32(hv[i]);
  } else {
    CUDA_CHECK(cudaMemcpy(gk.data(), kc.get(), kc.size(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(gv.data(), vc.get(), vc.size(), cudaMemcpyDeviceToHost));
  }
  // The fp32 kernel vs its twin (fp32, angles from double, so within ~1e-6 of exact): a few ulps
  // of the norm and sincosf, and the kernel's fp32 angle pos * freq, whose two roundings (2^-24
  // relative each) grow with the position: 2^-22 per unit of the last position bounds them with
  // room (~1.2e-5 at position 50, ~2.7e-4 at 1,136). fp16 caches round to 2^-11 relative.
  const double tol = (fc.half ? 2e-3 : 1e-5) + (pos0 + n) * std::ldexp(1.0, -22);
  std::vector<bool> written(slots, false);
  const cpu::QkvFinishShape shape{fc.n_heads, fc.n_kv, fc.hd, fc.rope_dim, fc.neox, eps};
  std::vector<float> cs(fc.rope_dim), rq(q_dim), rk(kv_dim), rv(kv_dim);
  for (int i = 0; i < n; ++i) {
    const int pos = pos0 + i;
    written[slot[i]] = true;
    // The CPU twin on this row.
    std::copy_n(q.data() + (size_t)i * q_dim, q_dim, rq.data());
    std::copy_n(k.data() + (size_t)i * kv_dim, kv_dim, rk.data());
    std::copy_n(v.data() + (size_t)i * kv_dim, kv_dim, rv.data());
    cpu::rope_angles(cs.data(), fc.rope_dim, pos, base, fc.factors ? fac.data() : nullptr);
    cpu::qkv_finish(rq.data(), rk.data(), rv.data(), shape, fc.bias ? bq.data() : nullptr,
                    fc.bias ? bk.data() : nullptr, fc.bias ? bv.data() : nullptr,
                    fc.norm ? qn.data() : nullptr, fc.norm ? kn.data() : nullptr, cs.data());
    auto expect = [&](const float* got, const float* ref, int len, int seg) {
      for (int e = 0; e < len; ++e)
        ASSERT_NEAR(got[e], ref[e], tol * (1.0 + std::fabs(ref[e])))
            << "row " << i << " segment " << seg << " element " << e;
    };
    expect(gq.data() + (size_t)i * q_dim, rq.data(), q_dim, 0);
    expect(gk.data() + (size_t)slot[i] * kv_dim, rk.data(), kv_dim, 1);
    expect(gv.data() + (size_t)slot[i] * kv_dim, rv.data(), kv_dim, 2);
  }
  // Pool rows no token maps to were not written (still the 0xff poison: NaN in both widths).
  for (int r = 0; r < slots; ++r) {
    if (written[r]) continue;
    for (int e = 0; e < kv_dim; ++e)
      ASSERT_TRUE(std::isnan(gk[(size_t)r * kv_dim + e]) && std::isnan(gv[(size_t)r * kv_dim + e]))
          << "slot " << r << " written";
  }
}

TEST(QkvFinish, MatchesCpuTwin) {
  REQUIRE_GPU();
  const FinishCase cases[] = {
      // gemma3-270m: 4 heads / 1 KV head of 256, QK norm, NeoX.
      {"gemma3", 4, 1, 256, 256, false, true, true, false, false},
      {"gemma3 fp16 cache", 4, 1, 256, 256, false, true, true, false, true},
      {"gemma3 ring cache", 4, 1, 256, 256, false, true, true, false, false, 16},
      // qwen2.5-0.5b: biases, NeoX, head_dim 64.
      {"qwen2", 14, 2, 64, 64, true, false, true, false, false},
      // llama 3: frequency factors, normal RoPE; rope_dim < head_dim leaves the tail as is.
      {"llama3", 8, 2, 64, 64, false, false, false, true, false},
      {"partial rope", 4, 2, 32, 16, true, true, false, true, false},
      {"neox partial", 2, 1, 16, 8, false, true, true, false, true},
  };
  for (const FinishCase& c : cases) check_finish(c);
  check_finish({"qwen2 long chunk", 14, 2, 64, 64, true, false, true, false, true}, 1100);
  check_finish({"gemma3 long chunk", 4, 1, 256, 256, false, true, true, false, false}, 1100);
}

TEST(QkvFinish, RefusesBadShapes) {
  REQUIRE_GPU();
  Dev<float> b(4096);
  cuda::QkvFinishArgs a;
  a.q = b.p(), a.k = b.p();
  a.v = b.p(), a.k_cache = b.p(), a.v_cache = b.p();
  a.n_heads = 1, a.n_kv_heads = 1, a.head_dim = 512, a.rope_dim = 64, a.ldq = a.ldkv = 512;
  EXPECT_THROW(cuda::qkv_finish(a, nullptr), Error);  // head_dim > 256
  a.head_dim = 64, a.rope_dim = 66;
  EXPECT_THROW(cuda::qkv_finish(a, nullptr), Error);  // rope_dim > head_dim
  a.rope_dim = 64, a.ldq = 32;
  EXPECT_THROW(cuda::qkv_finish(a, nullptr), Error);  // pitch too small
}

}  // namespace
}  // namespace smolrt
