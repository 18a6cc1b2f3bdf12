// attention_prefill against a double-precision causal GQA reference, with and without earlier
// cache positions (a prompt continuing a conversation), fp16 and fp32 caches, head_dim 8..256,
// sliding windows and explicit scales (gemma3's local and global layers); the same keys in a
// paged pool through a page table give the same bits, also with the chunk read from device memory
// (spans: twice in one launch, at other rows, with spare tile slots).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "cuda/attention_prefill.h"
#include "cuda/prefill_test_util.h"
#include "test_util.h"

using namespace smolrt;
using namespace smolrt::cuda;
using namespace smolrt::test;

namespace {

// The tile list of AttentionPrefillArgs::tiles for chunks of these lengths (spans 0, 1, ..), their
// tiles interleaved.
std::vector<int> tile_list(const std::vector<int>& lens, int head_dim) {
  const int q = attention_prefill_query_tile(head_dim);
  std::vector<int> t = {0};
  for (int i = 0; i * q < *std::max_element(lens.begin(), lens.end()); ++i)
    for (size_t s = 0; s < lens.size(); ++s)
      if (i * q < lens[s]) t.push_back(int(s) << 16 | i);
  t[0] = int(t.size()) - 1;
  return t;
}

struct Shape {
  int n_heads, n_kv, hd;
  int window = 0;
  float scale = 0.f;
  // A sliding-window layer's ring cache of window + T + 2 rows (key p at row p % ring), also
  // at a start past two wraps of the ring.
  bool ring = false;
};

class AttnTokens : public ::testing::TestWithParam<int> {};

TEST_P(AttnTokens, MatchesReference) {
  REQUIRE_GPU();
  const int T = GetParam();
  const Shape shapes[] = {
      {9, 3, 64},
      {8, 4, 8},
      {4, 4, 32},
      {6, 2, 16},
      {8, 2, 128},
      {4, 1, 256, 0, 0.0625f},  // gemma3 global layer
      {4, 1, 256, 40},          // a local layer (window 512 in the file)
      {9, 3, 64, 33, 0.2f},     // window inside one 64-key tile, own scale
      {8, 4, 8, 17},            // the SIMT kernel's window
      {4, 1, 256, 40, 0.f, true},
      {9, 3, 64, 33, 0.2f, true},
      {8, 4, 8, 17, 0.f, true},
  };
  for (const Shape& s : shapes) {
    const int ring = s.ring ? s.window + T + 2 : 0;
    std::vector<int> starts = {0, 37};
    if (s.ring) starts.push_back(2 * ring + 5);
    for (int start : starts) {
      for (bool half : {true, false}) {
        SCOPED_TRACE(cat("T=", T, " heads=", s.n_heads, "/", s.n_kv, " hd=", s.hd, " start=", start,
                         " half=", half, " window=", s.window, " scale=", s.scale, " ring=", ring));
        const int q_dim = s.n_heads * s.hd, kv_dim = s.n_kv * s.hd;
        const int n_ctx = start + T + 5;
        const uint32_t seed = T * 131 + start + s.hd;
        const auto q = randn((size_t)T * q_dim, seed, 1.0f);
        auto k = randn((size_t)n_ctx * kv_dim, seed + 1, 1.0f);
        auto v = randn((size_t)n_ctx * kv_dim, seed + 2, 1.0f);
        // Round the cache to what the device holds so the reference sees the same values. A
        // ring holds at row r the last position p = r (mod ring) written before the chunk's
        // attention (p < start + T), as the decode backend leaves it.
        const size_t rows = ring > 0 ? ring : n_ctx, esz = half ? 2 : 4;
        std::vector<uint8_t> kb(rows * kv_dim * esz), vb(kb.size());
        for (size_t i = 0; i < k.size(); ++i) {
          const size_t p = i / kv_dim, e = i % kv_dim;
          if (ring > 0 && (int)p >= start + T) continue;
          const size_t at = ((ring > 0 ? p % ring : p) * kv_dim + e) * esz;
          if (half) {
            const uint16_t hk = f32_to_fp16(k[i]), hv = f32_to_fp16(v[i]);
            k[i] = fp16_to_f32(hk), v[i] = fp16_to_f32(hv);
            std::memcpy(&kb[at], &hk, 2), std::memcpy(&vb[at], &hv, 2);
          } else {
            std::memcpy(&kb[at], &k[i], 4), std::memcpy(&vb[at], &v[i], 4);
          }
        }
        std::vector<double> ref((size_t)T * q_dim);
        const int group = s.n_heads / s.n_kv;
        std::vector<double> sc(n_ctx);
        for (int i = 0; i < T; ++i)
          for (int h = 0; h < s.n_heads; ++h) {
            const int kvh = h / group, np = start + i + 1;
            const int p0 = s.window > 0 ? std::max(0, np - s.window) : 0;  // keys pos-window < p
            const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt((double)s.hd);
            double mx = -INFINITY;
            for (int p = p0; p < np; ++p) {
              double d = 0;
              for (int e = 0; e < s.hd; ++e)
                d += (double)q[(size_t)i * q_dim + h * s.hd + e] *
                     k[(size_t)p * kv_dim + kvh * s.hd + e];
              sc[p] = d * scale;
              mx = std::max(mx, sc[p]);
            }
            double sum = 0;
            for (int p = p0; p < np; ++p) sum += (sc[p] = std::exp(sc[p] - mx));
            for (int e = 0; e < s.hd; ++e) {
              double o = 0;
              for (int p = p0; p < np; ++p) o += sc[p] * v[(size_t)p * kv_dim + kvh * s.hd + e];
              ref[(size_t)i * q_dim + h * s.hd + e] = o / sum;
            }
          }
        DevBuf<float> dq(q), dout((size_t)T * q_dim);
        DevBuf<uint8_t> dk(kb), dv(vb);
        AttentionPrefillArgs a;
        a.q = dq.p, a.ldq = q_dim, a.k_cache = dk.p, a.v_cache = dv.p, a.kv_half = half;
        a.out = dout.p, a.ldo = q_dim, a.n_tokens = T, a.start = start;
        a.n_heads = s.n_heads, a.n_kv_heads = s.n_kv, a.head_dim = s.hd;
        a.window = s.window, a.scale = s.scale, a.ring = ring;
        // Wide heads: also with the key-split scratch (up to kAttnPrefillSplits blocks per query
        // tile, merged after), which must give the same result within the same bound.
        const size_t scratch = attention_prefill_scratch(T, s.n_heads, s.hd);
        DevBuf<float> dpart(std::max<size_t>(scratch, 1));
        for (bool split : {false, true}) {
          if (split && scratch == 0) continue;
          SCOPED_TRACE(split ? "key splits" : "one block per query tile");
          dout.poison();
          dpart.poison();
          a.partials = split ? dpart.p : nullptr;
          attention_prefill(a, nullptr);
          // SIMT path (head_dim 8): fp32 math with exp2f and online rescaling, ~1e-6 relative;
          // 1e-4 bounds it loosely. Tensor-core path (head_dim 16..256): the query, P and (for an
          // fp32 cache) K and V are rounded to fp16 (2^-11 relative each, ~5e-4..1e-3 rel L2 in
          // total); 3e-3 bounds that with room, far below an indexing or masking error (~1).
          const bool tc = s.hd % 16 == 0;
          const std::vector<float> got = dout.download();
          EXPECT_LT(rel_l2(got, ref), tc ? 3e-3 : 1e-4);
          // The fp16 output (the dense GEMMs' input): the fp32 one rounded to nearest, bit for bit.
          DevBuf<uint16_t> dh((size_t)T * q_dim);
          dh.poison();
          a.out = nullptr, a.out_h = dh.p;
          attention_prefill(a, nullptr);
          a.out = dout.p, a.out_h = nullptr;
          const std::vector<uint16_t> got_h = dh.download();
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_EQ(got_h[i], f32_to_fp16(got[i])) << "element " << i;
          if (ring > 0) continue;
          // The same keys in a paged pool (the multi-sequence engine's), pages shuffled and two
          // spare: key t through the page table. The same arithmetic on the same values: the same
          // bits.
          const int page = 16, np = (n_ctx + page - 1) / page, pool_pages = np + 2;
          std::vector<int> order(pool_pages);
          for (int i = 0; i < pool_pages; ++i) order[i] = i;
          std::shuffle(order.begin(), order.end(), std::mt19937(seed));
          const std::vector<int> table(order.begin(), order.begin() + np);
          const size_t row_bytes = kv_dim * esz;
          std::vector<uint8_t> pk(size_t(pool_pages) * page * row_bytes, 0), pv(pk.size(), 0);
          for (int p = 0; p < n_ctx; ++p) {
            const size_t at = (size_t(table[p / page]) * page + p % page) * row_bytes;
            std::memcpy(&pk[at], &kb[p * row_bytes], row_bytes);
            std::memcpy(&pv[at], &vb[p * row_bytes], row_bytes);
          }
          DevBuf<uint8_t> dpk(pk), dpv(pv);
          DevBuf<int> dtab(table);
          DevBuf<float> dpaged((size_t)T * q_dim);
          dpaged.poison();
          AttentionPrefillArgs b = a;
          b.k_cache = dpk.p, b.v_cache = dpv.p, b.table = dtab.p, b.page_size = page;
          b.out = dpaged.p;
          attention_prefill(b, nullptr);
          const std::vector<float> got_paged = dpaged.download();
          ASSERT_EQ(0, std::memcmp(got.data(), got_paged.data(), got.size() * sizeof(float)))
              << "paged pool";
          {
            // Consecutive pages from page 2 on (a lone sequence's, contiguous): key t at row
            // 2 * page + t, the table read once; directly and through a span. The same bits.
            std::vector<uint8_t> ck((size_t(np) + 2) * page * row_bytes, 0), cv(ck.size(), 0);
            std::memcpy(&ck[size_t(2) * page * row_bytes], kb.data(), size_t(n_ctx) * row_bytes);
            std::memcpy(&cv[size_t(2) * page * row_bytes], vb.data(), size_t(n_ctx) * row_bytes);
            std::vector<int> run(2 * size_t(np), 1 << 20);  // row 0: far out of range
            for (int i = 0; i < np; ++i) run[size_t(np) + i] = 2 + i;
            const std::vector<int> tiles1 = tile_list({T}, s.hd);
            DevBuf<uint8_t> dck(ck), dcv(cv);
            DevBuf<int> drun(run), dspan1(std::vector<int>{start, T, 1, 1, 0}), dtiles1(tiles1);
            AttentionPrefillArgs r = b;
            r.k_cache = dck.p, r.v_cache = dcv.p, r.contiguous = true;
            for (bool via_span : {false, true}) {
              r.table = via_span ? drun.p : drun.p + np;
              r.spans = via_span ? dspan1.p : nullptr, r.table_stride = via_span ? np : 0;
              r.tiles = via_span ? dtiles1.p : nullptr, r.max_tiles = tiles1[0];
              dpaged.poison();
              attention_prefill(r, nullptr);
              const std::vector<float> got_run = dpaged.download();
              // As the span check above: the same kernel configuration gives the same bits.
              if (!via_span || !tc || (s.hd <= 64 && start + T > 64) || (s.hd > 64 && !split)) {
                ASSERT_EQ(0, std::memcmp(got.data(), got_run.data(), got.size() * sizeof(float)))
                    << "consecutive pages" << (via_span ? ", span" : "");
              } else {
                EXPECT_LT(rel_l2(got_run, ref), 3e-3) << "consecutive pages, span";
              }
            }
          }
          // The chunk read from device memory (spans {start, T, table row 1} at rows 3 and T + 8
          // of a launch over T + T + 75 rows, with 3 tile slots to spare, as a graph of a larger
          // bucket): the same result twice, and the rows of no span untouched. The same kernel
          // configuration (SIMT; two key groups; one block per query tile) gives the same bits;
          // the others decide by the known keys and differ in summation order only.
          const int cap = T + T + 75, rows0[2] = {3, T + 8};
          std::vector<float> qcap((size_t)cap * q_dim, 7.f);
          for (int r0 : rows0) std::copy(q.begin(), q.end(), qcap.begin() + (size_t)r0 * q_dim);
          std::vector<int> tables(2 * size_t(np) + 1, 1 << 20);  // row 0: pages far out of range
          std::copy(table.begin(), table.end(), tables.begin() + np);
          const std::vector<int> tiles = tile_list({T, T}, s.hd);
          DevBuf<float> dqcap(qcap), dspanout((size_t)cap * q_dim);
          DevBuf<int> dtables(tables), dtiles(tiles),
              dspans(std::vector<int>{start, T, 1, 0, rows0[0], start, T, 1, 0, rows0[1]});
          DevBuf<float> dpartcap(
              std::max<size_t>(attention_prefill_scratch(cap, s.n_heads, s.hd), 1));
          dspanout.poison();
          AttentionPrefillArgs c = b;
          c.q = dqcap.p, c.out = dspanout.p, c.n_tokens = cap, c.start = 0;
          c.spans = dspans.p, c.tiles = dtiles.p, c.max_tiles = tiles[0] + 3;
          c.table = dtables.p, c.table_stride = np;
          c.partials = split ? dpartcap.p : nullptr;
          attention_prefill(c, nullptr);
          const std::vector<float> got_span = dspanout.download();
          for (int r0 : rows0) {
            const std::vector<float> part(got_span.begin() + (size_t)r0 * q_dim,
                                          got_span.begin() + (size_t)(r0 + T) * q_dim);
            EXPECT_LT(rel_l2(part, ref), tc ? 3e-3 : 1e-4) << "span at row " << r0;
            if (!tc || (s.hd <= 64 && start + T > 64) || (s.hd > 64 && !split)) {
              ASSERT_EQ(0, std::memcmp(got.data(), part.data(), got.size() * sizeof(float)))
                  << "span at row " << r0;
            }
          }
          for (size_t i = 0; i < got_span.size(); ++i) {
            const int row = int(i / q_dim);
            if ((row >= rows0[0] && row < rows0[0] + T) || (row >= rows0[1] && row < rows0[1] + T))
              continue;
            uint32_t bits;
            std::memcpy(&bits, &got_span[i], 4);
            ASSERT_EQ(bits, 0xffffffffu) << "spans wrote row " << row;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Batch, AttnTokens, ::testing::Values(1, 7, 32, 100, 512));

TEST(AttentionPrefill, UnsupportedHeadDimIsAnError) {
  REQUIRE_GPU();
  DevBuf<float> b(4096);
  AttentionPrefillArgs a;
  a.q = b.p, a.k_cache = b.p, a.v_cache = b.p, a.out = b.p;
  a.n_tokens = 1, a.n_heads = 2, a.n_kv_heads = 1, a.head_dim = 96, a.ldq = a.ldo = 192;
  EXPECT_THROW(attention_prefill(a, nullptr), Error);
  EXPECT_FALSE(attention_prefill_supports(96));
  a.head_dim = 64, a.ldq = a.ldo = 128, a.n_kv_heads = 3;  // 2 heads not a multiple of 3
  EXPECT_THROW(attention_prefill(a, nullptr), Error);
  a.n_kv_heads = 1, a.window = -1;
  EXPECT_THROW(attention_prefill(a, nullptr), Error);
  a.window = 0;
  DevBuf<uint16_t> h(4096);
  a.out_h = h.p;  // both outputs set
  EXPECT_THROW(attention_prefill(a, nullptr), Error);
  a.out_h = nullptr;
  DevBuf<int> table(4);
  a.table = table.p, a.page_size = 12;  // not a power of two
  EXPECT_THROW(attention_prefill(a, nullptr), Error);
  a.page_size = 16, a.window = 8, a.ring = 40;  // a ring through a table is the table's job
  EXPECT_THROW(attention_prefill(a, nullptr), Error);
}

}  // namespace
