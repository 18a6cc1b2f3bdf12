// attention_paged: the many-row steps' attention over a paged KV pool (attention_paged.h) against
// cpu::attention_decode over each row's gathered K/V on random data, fp32 and fp16 pools, several
// head sizes, scattered pages, poisoned outputs, a list of rows; and its split count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "cuda/attention_paged.h"
#include "cuda/cuda_test_util.h"
#include "cuda/prefill_test_util.h"
#include "quant/formats.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;
using test::rel_l2;

// n random K and V elements each, as fp16 rounds them when half (the reference then sees the
// values the kernel reads).
void random_kv(size_t n, bool half, std::mt19937& rng, std::vector<float>& k,
               std::vector<float>& v) {
  std::normal_distribution<float> nd(0.f, 1.f);
  k.resize(n), v.resize(n);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  if (half)
    for (auto* a : {&k, &v})
      for (float& x : *a) x = fp16_to_f32(f32_to_fp16(x));
}

// 0..n-1 in random order (pages scattered over the pool).
std::vector<int> shuffled(int n, std::mt19937& rng) {
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  return perm;
}

std::vector<uint16_t> to_fp16(const std::vector<float>& x) {
  std::vector<uint16_t> h;
  for (float f : x) h.push_back(f32_to_fp16(f));
  return h;
}

// --- attention_paged vs cpu::attention_decode over each row's gathered K/V -----------------------

void check_paged(int head_dim, int n_heads, int n_kv_heads, bool half) {
  const int page = 16, n_pages = 200, kv_dim = n_kv_heads * head_dim;
  const int slots = n_pages * page;
  std::mt19937 rng(head_dim * 31 + n_heads + half);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k, v;
  random_kv(size_t(slots) * kv_dim, half, rng, k, v);
  // 3 sequences over shuffled pages; rows: a prompt chunk of seq 0 (causal), decode rows.
  const std::vector<int> perm = shuffled(n_pages, rng);
  const int stride = 64;  // up to 1024 positions: every split count occurs
  std::vector<int> tables(3 * stride);
  for (int s = 0; s < 3; ++s)
    for (int j = 0; j < stride; ++j) tables[s * stride + j] = perm[s * stride + j];
  std::vector<int> row_seq, row_pos;
  for (int p = 0; p < 20; ++p) row_seq.push_back(0), row_pos.push_back(p);
  for (int p : {0, 1, 31, 32, 33, 127, 128, 190, 255, 256, 300, 511, 700})
    row_seq.push_back(1), row_pos.push_back(p);
  row_seq.push_back(2), row_pos.push_back(stride * page - 1);
  const int n = (int)row_seq.size(), q_dim = n_heads * head_dim;
  std::vector<float> q(size_t(n) * q_dim);
  for (float& x : q) x = nd(rng);

  Dev<float> dq(q), dk(k), dv(v);
  Dev<uint16_t> dkh(to_fp16(k)), dvh(to_fp16(v));
  Dev<int> dt(tables), ds(row_seq), dp(row_pos);
  Dev<float> out(size_t(n) * q_dim);  // poisoned
  Dev<uint16_t> out_h(size_t(n) * q_dim);
  cuda::PagedAttnArgs a;
  a.q = dq.p(), a.ldq = q_dim;
  a.k_pool = half ? (const void*)dkh.p() : dk.p();
  a.v_pool = half ? (const void*)dvh.p() : dv.p();
  a.kv_half = half, a.out = out.p(), a.ldo = q_dim, a.n = n;
  a.row_pos = dp.p(), a.row_seq = ds.p(), a.tables = dt.p(), a.table_stride = stride;
  a.page_size = page, a.n_heads = n_heads, a.n_kv_heads = n_kv_heads, a.head_dim = head_dim;
  Dev<float> partials(size_t(n) * n_heads * cuda::kAttnPagedSplits * (head_dim + 2));
  Dev<int> counters(std::vector<int>(size_t(n) * n_kv_heads, 0));
  a.partials = partials.p(), a.counters = counters.p();

  std::vector<float> kc, vc, ref(size_t(n) * q_dim), att(stride * page);
  for (int r = 0; r < n; ++r) {
    const int np = row_pos[r] + 1;
    kc.resize(size_t(np) * kv_dim), vc.resize(kc.size());
    for (int p = 0; p < np; ++p) {
      const int slot = tables[row_seq[r] * stride + p / page] * page + p % page;
      std::copy_n(&k[size_t(slot) * kv_dim], kv_dim, &kc[size_t(p) * kv_dim]);
      std::copy_n(&v[size_t(slot) * kv_dim], kv_dim, &vc[size_t(p) * kv_dim]);
    }
    cpu::attention_decode(&ref[size_t(r) * q_dim], &q[size_t(r) * q_dim], kc.data(), vc.data(), np,
                          n_heads, n_kv_heads, head_dim, att.data());
  }
  // Where each row's fresh positions start (row_first_new: read after the PDL wait, the rest before
  // it) changes when rows are read, never what: none (null), the whole context, the decode row's
  // last position, and a chunk starting at a pseudo-random position (tile edges included).
  std::vector<int> fresh_last(row_pos), fresh_mid(n);
  for (int r = 0; r < n; ++r) fresh_mid[r] = (row_pos[r] * 7 + r) % (row_pos[r] + 1);
  Dev<int> dn0(std::vector<int>(n, 0)), dn1(fresh_last), dn2(fresh_mid);
  const int* fresh[] = {nullptr, dn0.p(), dn1.p(), dn2.p()};
  // Every split count gives the same attention: fewer splits than a row's context would take
  // (1, 3) give each block more tiles; the maximum spreads the longest rows over 8 blocks. With
  // head_dim 64, 34 rows x 3 KV heads x 8 splits = 816 blocks pass one resident wave of the
  // latency build on a 132-SM Hopper (5 per SM), so the narrow build (2 warps) runs too; at 3
  // splits the wide build (8 warps, 1 split: 102 blocks, within its wave of 264) runs where the
  // head group allows it (G x head_dim <= 512: all but the 256-wide heads).
  for (int fi = 0; fi < 4; ++fi)
    for (int splits : {1, 3, cuda::kAttnPagedSplits}) {
      a.splits = splits;
      a.row_first_new = fresh[fi];
      out.poison();
      cuda::attention_paged(a, nullptr);
      cuda::attention_paged(a, nullptr);  // again: the counters were left at zero
      const std::vector<float> got = out.get();
      for (int r = 0; r < n; ++r) {
        for (int i = 0; i < q_dim; ++i)
          ASSERT_TRUE(std::isfinite(got[size_t(r) * q_dim + i]))
              << "row " << r << " col " << i << " splits " << splits;
        // Tensor cores: q, P and (fp32 pool) K and V are rounded to fp16 (2^-11 relative each,
        // ~5e-4..1e-3 relative L2 per row in total, as the prefill's tensor-core attention);
        // 3e-3 bounds that with room, far below an indexing, masking or combine error (~1).
        EXPECT_LT(rel_l2(&got[size_t(r) * q_dim], &ref[size_t(r) * q_dim], q_dim), 3e-3)
            << "row " << r << " (pos " << row_pos[r] << ") hd " << head_dim << " splits " << splits
            << " fresh pattern " << fi;
      }
      // The fp16 output (the dense GEMMs' input) is the fp32 one rounded to nearest, bit for bit.
      a.out = nullptr, a.out_h = out_h.p();
      out_h.poison();
      cuda::attention_paged(a, nullptr);
      const std::vector<uint16_t> got_h = out_h.get();
      a.out = out.p(), a.out_h = nullptr;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got_h[i], f32_to_fp16(got[i]))
            << "element " << i << " hd " << head_dim << " splits " << splits;
    }
  // A list of rows (PagedAttnArgs::rows: the rows of a step whose prompt chunks take
  // attention_prefill): the listed rows, in any order, get the bits of the launch over every row;
  // the others stay untouched.
  std::vector<int> list;
  for (int r = n - 1; r >= 0; --r)
    if (r % 3 != 1) list.push_back(r);
  list.resize(n, -1);
  Dev<int> dlist(list);
  a.splits = 3, a.row_first_new = nullptr;
  out.poison();
  cuda::attention_paged(a, nullptr);
  const std::vector<float> all = out.get();
  a.rows = dlist.p();
  out.poison();
  cuda::attention_paged(a, nullptr);
  const std::vector<float> some = out.get();
  for (int r = 0; r < n; ++r) {
    const size_t at = size_t(r) * q_dim;
    if (r % 3 != 1) {
      ASSERT_EQ(0, std::memcmp(&all[at], &some[at], sizeof(float) * q_dim)) << "listed row " << r;
    } else {
      for (int i = 0; i < q_dim; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &some[at + i], 4);
        ASSERT_EQ(bits, 0xffffffffu) << "unlisted row " << r << " was written";
      }
    }
  }
}

TEST(AttentionPaged, SplitsFollowTheLongestContext) {
  // One split per 4 tiles of 32 positions, in powers of two, at most kAttnPagedSplits (a few
  // (row, KV head) pairs: the grid stays within a wave).
  EXPECT_EQ(cuda::attn_paged_splits(0, 3, 132), 1);
  EXPECT_EQ(cuda::attn_paged_splits(127, 3, 132), 1);
  EXPECT_EQ(cuda::attn_paged_splits(128, 3, 132), 2);
  EXPECT_EQ(cuda::attn_paged_splits(255, 3, 132), 2);
  EXPECT_EQ(cuda::attn_paged_splits(256, 3, 132), 4);
  EXPECT_EQ(cuda::attn_paged_splits(511, 3, 132), 4);
  EXPECT_EQ(cuda::attn_paged_splits(512, 3, 132), 8);
  EXPECT_EQ(cuda::attn_paged_splits(1 << 20, 3, 132), cuda::kAttnPagedSplits);
}

TEST(AttentionPaged, SplitsStayWithinOneWave) {
  // Halved while pairs * splits passes kAttnPagedWavePerSm blocks per SM (792 on 132 SMs), never
  // below 1. 64 sequences x 3 KV heads at 228 positions keep their 2 splits; 256 take 1.
  EXPECT_EQ(cuda::attn_paged_splits(227, 64 * 3, 132), 2);
  EXPECT_EQ(cuda::attn_paged_splits(227, 256 * 3, 132), 1);
  EXPECT_EQ(cuda::attn_paged_splits(527, 64 * 3, 132), 4);  // 8 by the context
  EXPECT_EQ(cuda::attn_paged_splits(1 << 20, 512 * 3, 132), 1);
  EXPECT_EQ(cuda::attn_paged_splits(1 << 20, 99, 132), 8);  // 99 * 8 = 792: exactly a wave
  EXPECT_EQ(cuda::attn_paged_splits(1 << 20, 100, 132), 4);
  for (int pairs : {1, 7, 100, 300, 5000})
    for (int pos : {0, 100, 1000, 100000}) {
      const int z = cuda::attn_paged_splits(pos, pairs, 132);
      EXPECT_LE(z, cuda::attn_paged_splits(pos, 1, 132));
      EXPECT_EQ(z & (z - 1), 0) << z;
      EXPECT_TRUE(z == 1 || (long)pairs * z <= 792L) << pairs << " " << pos;
    }
}

TEST(AttentionPaged, MatchesCpuTwin) {
  REQUIRE_GPU();
  for (bool half : {false, true}) {
    check_paged(64, 9, 3, half);   // SmolLM2
    check_paged(64, 14, 2, half);  // Qwen2.5-0.5B
    check_paged(8, 8, 4, half);    // stories260K
    check_paged(128, 8, 2, half);  // Llama 3.2 1B-like
    check_paged(256, 4, 1, half);  // Gemma 3 270M
    check_paged(256, 8, 4, half);  // Gemma 3 4B-like: too wide for the 8-warp build
  }
}

// --- cascade: the shared pass + attention_paged over the rest, one launch ------------------------

// Rows of sequences that share their first pages (a cached prefix) take the shared pass over those
// keys and attention_paged over the rest (row_skip), in one launch; the result is each row's whole
// attention, against cpu::attention_decode, and both kinds of counters are left zero. Group A: 10
// sequences over 64 shared pages (1,024 keys: 8 splits) with a decode row each but for a 30-row
// chunk of one (39 rows: two query blocks from 2 heads per KV head on), one row exactly at the
// shared end; group B: 2 sequences whose 6 shared pages (96 keys: one split of 3 tiles) end
// mid-tile of their rows' contexts; a sequence alone (no skip). Spare block slots return at once.
// Rows outside the groups and the others' columns are checked like the members'.
void check_shared(int head_dim, int n_heads, int n_kv_heads, bool half) {
  const int page = 16, stride = 128, n_pages = 2000, kv_dim = n_kv_heads * head_dim;
  const int slots = n_pages * page, G = n_heads / n_kv_heads;
  std::mt19937 rng(head_dim * 17 + n_heads * 3 + half);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k, v;
  random_kv(size_t(slots) * kv_dim, half, rng, k, v);
  const std::vector<int> perm = shuffled(n_pages, rng);
  const int n_seqs = 13;
  std::vector<int> tables(size_t(n_seqs) * stride);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = perm[i];
  for (int s = 1; s < 10; ++s)  // group A: seqs 0..9 share seq 0's first 64 pages
    std::copy_n(&tables[0], 64, &tables[size_t(s) * stride]);
  std::copy_n(&tables[size_t(10) * stride], 6, &tables[size_t(11) * stride]);  // group B
  std::vector<int> row_seq, row_pos, first_new;
  auto add = [&](int s, int p0, int len) {
    for (int j = 0; j < len; ++j)
      row_seq.push_back(s), row_pos.push_back(p0 + j), first_new.push_back(p0);
  };
  add(0, 1030, 1);
  add(1, 1100, 30);
  add(2, 1024, 1);
  add(3, 2047, 1);
  for (int s = 4; s < 10; ++s) add(s, 1024 + 97 * s, 1);
  add(10, 96, 1);
  add(11, 130, 1);
  add(12, 777, 1);
  const int n = (int)row_seq.size(), q_dim = n_heads * head_dim;
  std::vector<int> skip(n, 0), members_a, members_b;
  for (int r = 0; r < n; ++r) {
    if (row_seq[r] < 10) skip[r] = 1024, members_a.push_back(r);
    if (row_seq[r] == 10 || row_seq[r] == 11) skip[r] = 96, members_b.push_back(r);
  }
  std::vector<int> members(members_a);
  members.insert(members.end(), members_b.begin(), members_b.end());
  const std::vector<int> groups = {
      0, 1024, 0, (int)members_a.size(), 10, 96, (int)members_a.size(), (int)members_b.size()};
  std::vector<int> blocks = {0};
  for (int gi = 0; gi < 2; ++gi) {
    const int rows = groups[gi * 4 + 3] * G;
    for (int b = 0; b * cuda::kSharedQueryRows < rows; ++b) blocks.push_back(gi << 16 | b);
  }
  blocks[0] = (int)blocks.size() - 1;
  const int slots_given = blocks[0] + 3;
  blocks.resize(1 + slots_given, -1);

  std::vector<float> q(size_t(n) * q_dim);
  for (float& x : q) x = nd(rng);
  Dev<float> dq(q), dk(k), dv(v);
  Dev<uint16_t> dkh(to_fp16(k)), dvh(to_fp16(v));
  Dev<int> dt(tables), ds(row_seq), dp(row_pos), df(first_new), dskip(skip), dg(groups),
      dm(members), db(blocks);
  Dev<float> out(size_t(n) * q_dim);
  Dev<float> prefix(size_t(n) * n_heads * cuda::kAttnSharedSplits * (head_dim + 2));
  Dev<float> partials(size_t(n) * n_heads * cuda::kAttnPagedSplits * (head_dim + 2));
  Dev<int> counters(std::vector<int>(size_t(n) * n_kv_heads, 0));
  Dev<int> prefix_counters(std::vector<int>(size_t(n) * n_heads, 0));
  cuda::PagedAttnArgs a;
  a.q = dq.p(), a.ldq = q_dim;
  a.k_pool = half ? (const void*)dkh.p() : dk.p();
  a.v_pool = half ? (const void*)dvh.p() : dv.p();
  a.kv_half = half, a.out = out.p(), a.ldo = q_dim, a.n = n;
  a.row_pos = dp.p(), a.row_seq = ds.p(), a.row_first_new = df.p(), a.tables = dt.p();
  a.table_stride = stride, a.page_size = page;
  a.n_heads = n_heads, a.n_kv_heads = n_kv_heads, a.head_dim = head_dim;
  a.partials = partials.p(), a.counters = counters.p();
  a.shared.row_skip = dskip.p(), a.shared.prefix = prefix.p();
  a.shared.counters = prefix_counters.p();
  a.shared.groups = dg.p(), a.shared.members = dm.p(), a.shared.blocks = db.p();
  a.shared.max_blocks = slots_given;

  std::vector<float> kc, vc, ref(size_t(n) * q_dim), att(stride * page);
  for (int r = 0; r < n; ++r) {
    const int np = row_pos[r] + 1;
    kc.resize(size_t(np) * kv_dim), vc.resize(kc.size());
    for (int p = 0; p < np; ++p) {
      const int slot = tables[size_t(row_seq[r]) * stride + p / page] * page + p % page;
      std::copy_n(&k[size_t(slot) * kv_dim], kv_dim, &kc[size_t(p) * kv_dim]);
      std::copy_n(&v[size_t(slot) * kv_dim], kv_dim, &vc[size_t(p) * kv_dim]);
    }
    cpu::attention_decode(&ref[size_t(r) * q_dim], &q[size_t(r) * q_dim], kc.data(), vc.data(), np,
                          n_heads, n_kv_heads, head_dim, att.data());
  }
  // attention_paged's split count changes how the rest is cut, never the result.
  for (int splits : {1, 3, cuda::kAttnPagedSplits}) {
    a.splits = splits;
    out.poison();
    prefix.poison();
    cuda::attention_paged(a, nullptr);
    const std::vector<float> got = out.get();
    for (const std::vector<int>& c : {counters.get(), prefix_counters.get()})
      ASSERT_EQ(std::count(c.begin(), c.end(), 0), (long)c.size()) << "counters left nonzero";
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < q_dim; ++i)
        ASSERT_TRUE(std::isfinite(got[size_t(r) * q_dim + i])) << "row " << r << " col " << i;
      // The bound of attention_paged's test (the same fp16 roundings); a shared split dropped
      // or counted twice, or a wrong query row, is an error of order 1.
      EXPECT_LT(rel_l2(&got[size_t(r) * q_dim], &ref[size_t(r) * q_dim], q_dim), 3e-3)
          << "row " << r << " (seq " << row_seq[r] << ", pos " << row_pos[r] << ", skip " << skip[r]
          << ") hd " << head_dim << " G " << G << " splits " << splits << " half " << half;
    }
  }
}

TEST(AttentionPaged, SharedPrefixMatchesCpuTwin) {
  REQUIRE_GPU();
  for (bool half : {false, true}) {
    check_shared(64, 9, 3, half);   // SmolLM2
    check_shared(64, 14, 2, half);  // Qwen2.5-0.5B: 7 heads per KV head
    check_shared(8, 8, 4, half);    // head_dim 8
    check_shared(128, 8, 2, half);  // Llama 3.2 1B-like
    check_shared(256, 4, 1, half);  // Gemma 3 270M
  }
}

TEST(AttentionPaged, SharedSplitsCoverTheKeys) {
  // At least 4 tiles a split (1 for fewer), at most kAttnSharedSplits; the splits cover the tiles
  // once, none empty.
  for (int tiles = 1; tiles < 300; ++tiles) {
    int per = 0;
    const int n = cuda::shared_splits(tiles, &per);
    EXPECT_GE(n, 1);
    EXPECT_LE(n, cuda::kAttnSharedSplits);
    EXPECT_TRUE(per >= 4 || n == 1) << tiles;
    EXPECT_GE(n * per, tiles) << tiles;
    EXPECT_LT((n - 1) * per, tiles) << tiles;
  }
}

// --- CudaBatchBackend on the synthetic model -----------------------------------------------------

}  // namespace
}  // namespace smolrt
