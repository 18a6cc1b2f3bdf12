// attention_decode: the decode step's split attention (attention_decode.h) against
// cpu::attention_decode, over a contiguous cache and a paged pool (fp32 and fp16).
// Outputs are poisoned (NaN bytes) before each kernel runs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda/attention_decode.h"
#include "cuda/cuda_test_util.h"
#include "quant/formats.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;

// --- attention -------------------------------------------------------------------------------

// One decode-attention case: random q and cache (seeds seed, seed+1, seed+2; positions past
// n_pos hold NaN, which the kernel must never read), the CPU twin's output, and the device copies
// with the split scratch and the position slot.
struct AttnCase {
  int n_heads, n_kv, head_dim, n_ctx, n_pos, q_dim;
  std::vector<float> q, kc, vc, ref;  // ref: cpu::attention_decode
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
    cpu::attention_decode(ref.data(), q.data(), kc.data(), vc.data(), np, nh, nkv, hd,
                          scratch.data());
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
  cpu::attention_decode(ref.data(), q.data(), kc.data(), vc.data(), n_pos, nh, nkv, hd, sc.data());
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

}  // namespace
}  // namespace smolrt
