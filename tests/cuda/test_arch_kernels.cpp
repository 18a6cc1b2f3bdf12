// The kernels behind the architecture switches (model/model.h) against float64 references on
// random data (qkv_finish's: tests/ops/qkv_finish.cpp): sliding-window and head_dim-256 decode
// attention, the paged kernel without a block table and with a window, and the post-norm residual.
// Caches are poisoned with NaN wherever a kernel must not read (outside the window, past the
// context), so reading a key outside the window fails the test.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "cuda/attention_decode.h"
#include "cuda/attention_paged.h"
#include "cuda/qkv_finish.h"
#include "cuda/rmsnorm.h"
#include "cuda_test_util.h"
#include "prefill_test_util.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;

// --- attention ----------------------------------------------------------------------------------

// softmax(scale q·k_t) v_t over t in [lo, pos], per query head, in double.
std::vector<double> ref_attention(const float* q, const std::vector<float>& kc,
                                  const std::vector<float>& vc, const std::vector<int>& slot_of,
                                  int lo, int pos, int n_heads, int n_kv, int hd, double scale) {
  std::vector<double> out((size_t)n_heads * hd, 0.0);
  const int kv_dim = n_kv * hd;
  for (int h = 0; h < n_heads; ++h) {
    const int kvh = h / (n_heads / n_kv);
    std::vector<double> s;
    double mx = -1e300;
    for (int t = lo; t <= pos; ++t) {
      double d = 0;
      const float* kr = &kc[(size_t)slot_of[t] * kv_dim + kvh * hd];
      for (int e = 0; e < hd; ++e) d += (double)q[h * hd + e] * kr[e];
      s.push_back(d * scale);
      mx = std::max(mx, d * scale);
    }
    double den = 0;
    for (double& x : s) den += (x = std::exp(x - mx));
    for (int t = lo; t <= pos; ++t) {
      const float* vr = &vc[(size_t)slot_of[t] * kv_dim + kvh * hd];
      for (int e = 0; e < hd; ++e) out[(size_t)h * hd + e] += s[t - lo] / den * vr[e];
    }
  }
  return out;
}

// Random cache rows for positions [lo, hi) at their slots; NaN everywhere else.
std::vector<float> window_cache(int rows, int kv_dim, const std::vector<int>& slot_of, int lo,
                                int hi, uint32_t seed) {
  std::vector<float> c((size_t)rows * kv_dim, NAN);
  const std::vector<float> r = test::randn((size_t)rows * kv_dim, seed);
  for (int t = lo; t < hi; ++t)
    for (int e = 0; e < kv_dim; ++e)
      c[(size_t)slot_of[t] * kv_dim + e] = r[(size_t)slot_of[t] * kv_dim + e];
  return c;
}

TEST(ArchKernels, DecodeAttentionWindowAndWideHeads) {
  REQUIRE_GPU();
  struct C {
    int nh, nkv, hd, ctx, pos, window;
    float scale;
    int ring = 0;  // > 0: the cache is a ring of this many rows (position t at row t % ring)
  };
  const C cases[] = {
      {4, 1, 256, 1024, 700, 512, 0.0625f},  // gemma3-270m local layer, window full
      {4, 1, 256, 1024, 300, 512, 0.0625f},  // window not yet full
      {4, 1, 256, 1024, 900, 0, 0.0625f},    // gemma3 global layer
      {9, 3, 64, 512, 400, 37, 0.f},         // odd window, split context
      {8, 4, 16, 64, 63, 8, 0.3f},           // tiny window, explicit scale
      {2, 2, 128, 4096, 3000, 1000, 0.f},    // many splits inside the window
      // head_dim 256 at short contexts (32-position sub-chunks): 3 and 5 splits, combined
      {4, 1, 256, 1024, 65, 0, 0.0625f},
      {4, 1, 256, 1024, 128, 0, 0.0625f},
      // ring caches (a sliding-window layer's, window + prefill chunk rows): the window wraps
      {4, 1, 256, 1024, 700, 512, 0.0625f, 520},
      {9, 3, 64, 512, 400, 37, 0.f, 40},
      {8, 4, 16, 64, 63, 8, 0.3f, 13},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(testing::Message() << c.nh << "/" << c.nkv << "x" << c.hd << " pos " << c.pos
                                    << " window " << c.window << " ring " << c.ring);
    const int kv_dim = c.nkv * c.hd, q_dim = c.nh * c.hd;
    const int lo = c.window > 0 && c.pos + 1 > c.window ? c.pos + 1 - c.window : 0;
    std::vector<int> slot_of(c.ctx);
    for (int t = 0; t < c.ctx; ++t) slot_of[t] = c.ring > 0 ? t % c.ring : t;
    const int rows = c.ring > 0 ? c.ring : c.ctx;
    const std::vector<float> q = test::randn(q_dim, 11, 2.f);
    const std::vector<float> kc = window_cache(rows, kv_dim, slot_of, lo, c.pos + 1, 12),
                             vc = window_cache(rows, kv_dim, slot_of, lo, c.pos + 1, 13);
    const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt((double)c.hd);
    const std::vector<double> ref =
        ref_attention(q.data(), kc, vc, slot_of, lo, c.pos, c.nh, c.nkv, c.hd, scale);
    Dev<float> dq(q), dk(kc), dv(vc), out((size_t)q_dim),
        part((size_t)c.nh * cuda::attn_splits(c.ctx, c.hd) * (c.hd + 2));
    Dev<int> cnt(std::vector<int>(c.nh, 0)), dpos(std::vector<int>{c.pos});
    for (int rep = 0; rep < 2; ++rep) {  // the split counters reset themselves
      out.poison();
      cuda::attention_decode(out.p(), dq.p(), dk.p(), dv.p(), dpos.p(), c.ctx, c.nh, c.nkv, c.hd,
                             {part.p(), cnt.p()}, nullptr, {}, c.window, c.scale, c.ring);
      const std::vector<float> got = out.get();
      for (int i = 0; i < q_dim; ++i) ASSERT_NEAR(got[i], ref[i], 2e-5) << "out " << i;
    }
  }
}

TEST(ArchKernels, PagedAttentionWindowInOrderAndShuffledPages) {
  REQUIRE_GPU();
  const int nh = 4, nkv = 1, hd = 256, n = 6, pos0 = 90, window = 40, page = 16;
  const int kv_dim = nkv * hd, q_dim = nh * hd, npos = pos0 + n, n_pages = (npos + page - 1) / page;
  for (bool table : {false, true}) {
    SCOPED_TRACE(table ? "pages reversed" : "pages in order");
    // Pages in order, or in reverse order inside a pool of n_pages + 3 pages.
    std::vector<int> pages(n_pages), slot_of(npos);
    for (int i = 0; i < n_pages; ++i) pages[i] = table ? n_pages + 2 - i : i;
    for (int t = 0; t < npos; ++t) slot_of[t] = pages[t / page] * page + t % page;
    const int rows = (n_pages + 3) * page;
    const int lo0 = pos0 + 1 - window;  // the first row's window start; keys before: NaN
    const std::vector<float> kc = window_cache(rows, kv_dim, slot_of, lo0, npos, 21),
                             vc = window_cache(rows, kv_dim, slot_of, lo0, npos, 22);
    const std::vector<float> q = test::randn((size_t)n * q_dim, 23, 2.f);
    Dev<float> dq(q), dk(kc), dv(vc), out((size_t)n * q_dim),
        part((size_t)n * nh * cuda::kAttnPagedSplits * (hd + 2));
    Dev<int> cnt(std::vector<int>(n * nkv, 0)), dpages(pages);
    std::vector<int> rp(n), rs(n, 0);
    for (int i = 0; i < n; ++i) rp[i] = pos0 + i;
    Dev<int> dpos(rp), dseq(rs);
    cuda::PagedAttnArgs a;
    a.q = dq.p(), a.ldq = q_dim, a.k_pool = dk.p(), a.v_pool = dv.p(), a.out = out.p();
    a.ldo = q_dim, a.n = n, a.n_heads = nh, a.n_kv_heads = nkv, a.head_dim = hd;
    a.window = window, a.scale = 0.0625f, a.partials = part.p(), a.counters = cnt.p();
    a.row_pos = dpos.p(), a.row_seq = dseq.p(), a.tables = dpages.p();
    a.table_stride = n_pages, a.page_size = page;
    cuda::attention_paged(a, nullptr);
    const std::vector<float> got = out.get();
    for (int i = 0; i < n; ++i) {
      const int pos = pos0 + i;
      const std::vector<double> ref = ref_attention(&q[(size_t)i * q_dim], kc, vc, slot_of,
                                                    pos + 1 - window, pos, nh, nkv, hd, 0.0625);
      // Keys outside the window are NaN in the pool: one read would make the row non-finite
      // (rel_l2: +inf). The paged kernel runs on tensor cores: q, P, K and V (an fp32 pool)
      // rounded to fp16 (2^-11 relative each, ~1e-3 relative L2 per row in total); 3e-3 bounds
      // that with room, far below a masking or indexing error (~1).
      const std::vector<float> out_row(got.begin() + (size_t)i * q_dim,
                                       got.begin() + (size_t)(i + 1) * q_dim);
      EXPECT_LT(test::rel_l2(out_row, ref), 3e-3) << "row " << i;
    }
  }
}

TEST(ArchKernels, PostNormResidualMatchesFloat64) {
  REQUIRE_GPU();
  const int dim = 640, rows = 3, ld = 648;
  const std::vector<float> x = test::randn((size_t)rows * ld, 31),
                           y = test::randn((size_t)rows * ld, 32, 30.f), w = test::randn(dim, 33);
  Dev<float> dx(x), dy(y), dw(w);
  cuda::rmsnorm_add(dx.p(), ld, dy.p(), ld, dw.p(), dim, rows, 1e-6f, nullptr);
  const std::vector<float> got = dx.get();
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += (double)y[r * ld + i] * y[r * ld + i];
    const double s = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int i = 0; i < ld; ++i) {
      const double want = i < dim ? x[r * ld + i] + y[r * ld + i] * s * w[i] : x[r * ld + i];
      ASSERT_NEAR(got[r * ld + i], want, 1e-5 * (1 + std::fabs(want))) << r << "," << i;
    }
  }
}

}  // namespace
}  // namespace smolrt
