// The multi-sequence backend: KvPages bookkeeping, and the CPU BatchBackend against the
// single-sequence CpuBackend of the same kind (the oracle, cpu-ref, and the fast path, cpu). Every
// sequence's tokens and logits must be bit-identical to running it alone, whatever shares its
// steps, however its prompt is chunked, and whichever pages it gets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "backend/backend.h"
#include "backend/batch.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/sample.h"
#include "backend/kv_pages.h"
#include "core/error.h"
#include "cpu_test_util.h"
#include "model/synth.h"
#include "runtime/sampler.h"

namespace smolrt {
namespace {

// Expects `f` to throw an Error whose message contains `what`.
void expect_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no Error; expected one mentioning '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// --- KvPages
// --------------------------------------------------------------------------------------

// Grows seq by n tokens (ids counting on from its position: distinct contents); returns the
// copy-on-write pages the step would copy first.
std::vector<PageCopy> grow(KvPages& kv, int seq, int n, int salt = 0) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 1000 * salt + kv.position(seq) + i;
  std::vector<PageCopy> copies;
  kv.grow(seq, t, copies);
  return copies;
}

TEST(KvPages, AddRemoveReusesTheLowestId) {
  KvPages kv(8, 4, 3, 32);
  EXPECT_EQ(kv.add(), 0);
  EXPECT_EQ(kv.add(), 1);
  EXPECT_EQ(kv.add(), 2);
  EXPECT_EQ(kv.live(), 3);
  expect_error([&] { kv.add(); }, "sequence slots are in use");
  kv.remove(1);
  EXPECT_FALSE(kv.exists(1));
  EXPECT_EQ(kv.live(), 2);
  EXPECT_EQ(kv.add(), 1);
  expect_error([&] { kv.remove(7); }, "does not exist");
  expect_error([&] { kv.position(-1); }, "does not exist");
  expect_error([] { KvPages(0, 4, 1, 8); }, "must all be positive");
  expect_error([] { KvPages(1 << 20, 1 << 12, 1, 8); }, "exceed 2^31 slots");
}

TEST(KvPages, GrowTakesPagesAndRemoveReturnsThem) {
  KvPages kv(8, 4, 2, 32);
  const int a = kv.add(), b = kv.add();
  EXPECT_EQ(kv.pages_needed(a, 0), 0);
  EXPECT_EQ(kv.pages_needed(a, 1), 1);
  EXPECT_EQ(kv.pages_needed(a, 4), 1);
  EXPECT_EQ(kv.pages_needed(a, 5), 2);
  EXPECT_EQ(kv.pages_needed(a, INT32_MAX), INT32_MAX / 4 + 1);  // no overflow
  EXPECT_EQ(kv.pages_needed(a, -3), 0);
  grow(kv, a, 3);
  EXPECT_EQ(kv.position(a), 3);
  EXPECT_EQ(kv.pages_free(), 7);
  EXPECT_EQ(kv.pages_needed(a, 1), 0);  // the last page has room
  EXPECT_EQ(kv.pages_needed(a, 2), 1);
  grow(kv, a, 1);
  EXPECT_EQ(kv.pages_free(), 7);
  grow(kv, b, 9);
  EXPECT_EQ(kv.pages_free(), 4);
  EXPECT_EQ(kv.block_table(b).size(), 3u);
  kv.remove(b);
  EXPECT_EQ(kv.pages_free(), 7);
  kv.remove(a);
  EXPECT_EQ(kv.pages_free(), 8);
}

TEST(KvPages, FailedGrowChangesNothing) {
  KvPages kv(4, 4, 2, 12);
  const int a = kv.add(), b = kv.add();
  grow(kv, a, 5);
  grow(kv, b, 5);
  const std::vector<int> ta(kv.block_table(a).begin(), kv.block_table(a).end());
  expect_error([&] { grow(kv, a, 4); }, "free pages");  // needs 2 pages, 0 left
  expect_error([&] { grow(kv, b, 8); }, "past its context");
  EXPECT_EQ(kv.position(a), 5);
  EXPECT_EQ(kv.position(b), 5);
  EXPECT_EQ(kv.pages_free(), 0);
  EXPECT_EQ(std::vector<int>(kv.block_table(a).begin(), kv.block_table(a).end()), ta);
  grow(kv, a, 3);  // fits in its last page
  EXPECT_EQ(kv.position(a), 8);
}

TEST(KvPages, TruncateReturnsPagesPastThePosition) {
  KvPages kv(8, 4, 1, 32);
  const int a = kv.add();
  grow(kv, a, 13);  // 4 pages
  EXPECT_EQ(kv.pages_free(), 4);
  kv.truncate(a, 9);  // keeps 3
  EXPECT_EQ(kv.position(a), 9);
  EXPECT_EQ(kv.pages_free(), 5);
  kv.truncate(a, 8);  // exactly 2 pages
  EXPECT_EQ(kv.pages_free(), 6);
  expect_error([&] { kv.truncate(a, 9); }, "invalid");
  expect_error([&] { kv.truncate(a, -1); }, "invalid");
  kv.truncate(a, 0);
  EXPECT_EQ(kv.pages_free(), 8);
  EXPECT_TRUE(kv.block_table(a).empty());
}

TEST(KvPages, SlotFollowsTheBlockTable) {
  KvPages kv(6, 4, 2, 24);
  const int a = kv.add(), b = kv.add();
  grow(kv, a, 4);  // page 0
  grow(kv, b, 4);  // page 1
  grow(kv, a, 4);  // page 2
  EXPECT_EQ(kv.slot(a, 0), 0);
  EXPECT_EQ(kv.slot(a, 3), 3);
  EXPECT_EQ(kv.slot(b, 2), 6);
  EXPECT_EQ(kv.slot(a, 5), 9);
  expect_error([&] { kv.slot(a, 8); }, "has no position");
  // The page after a's last is free again: its next grow takes it.
  kv.remove(b);
  grow(kv, a, 1);
  EXPECT_EQ(kv.slot(a, 8), 12);
  for (int p = 0; p < kv.position(a); ++p) {
    const auto t = kv.block_table(a);
    EXPECT_EQ(kv.slot(a, p), t[p / 4] * 4 + p % 4);
  }
}

// --- prefix cache, copy-on-write, fork ----------------------------------------------------------

std::vector<int> block(const KvPages& kv, int seq) {
  return std::vector<int>(kv.block_table(seq).begin(), kv.block_table(seq).end());
}

TEST(KvPages, PublishedPagesAreMatchedByLaterPrompts) {
  KvPages kv(16, 4, 4, 64);
  const std::vector<int> p = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};  // 2 full pages + 2 tokens
  std::vector<PageCopy> copies;
  const int a = kv.add();
  kv.grow(a, p, copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(kv.stats().cached_pages, 0);  // nothing before the step wrote them
  kv.publish(a);
  EXPECT_EQ(kv.stats().cached_pages, 2);
  const std::vector<int> ta = block(kv, a);
  kv.remove(a);
  EXPECT_EQ(kv.pages_free(), 16);  // cached pages nobody holds count as free
  const int b = kv.add();
  EXPECT_EQ(kv.match_prefix(b, p), 8);  // at most 9 tokens: two whole pages
  EXPECT_EQ(kv.position(b), 8);
  EXPECT_EQ(block(kv, b), std::vector<int>(ta.begin(), ta.begin() + 2));
  EXPECT_EQ(kv.pages_free(), 14);
  const int c = kv.add();  // an 8-token prompt keeps its last token to compute: one page
  EXPECT_EQ(kv.match_prefix(c, std::span<const int>(p).first(8)), 4);
  const int d = kv.add();  // another first page: the chain breaks at once
  std::vector<int> q = p;
  q[0] = 99;
  EXPECT_EQ(kv.match_prefix(d, q), 0);
  const int e = kv.add();  // the second page alone does not match without the first
  EXPECT_EQ(kv.match_prefix(e, std::span<const int>(p).subspan(4)), 0);
  const PrefixStats st = kv.stats();
  EXPECT_EQ(st.cached_tokens, 12);
  EXPECT_EQ(st.queried_tokens, 10 + 8 + 10 + 6);
  expect_error([&] { kv.match_prefix(b, p); }, "is not empty");
}

TEST(KvPages, SharedPagesAreCopiedBeforeAWrite) {
  KvPages kv(16, 4, 4, 64);
  std::vector<PageCopy> copies;
  const std::vector<int> p = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const int a = kv.add();
  kv.grow(a, p, copies);
  kv.publish(a);
  const int b = kv.add();
  ASSERT_EQ(kv.match_prefix(b, p), 8);
  // b writes on past the shared pages: a page of its own, no copy.
  EXPECT_EQ(kv.pages_needed(b, 2), 1);
  EXPECT_TRUE(grow(kv, b, 2).empty());
  // Rolled back into a shared page, b's next write copies that page first.
  kv.truncate(b, 6);
  EXPECT_EQ(kv.pages_needed(b, 1), 1);
  const int shared = block(kv, b)[1];
  const std::vector<PageCopy> c1 = grow(kv, b, 1);
  ASSERT_EQ(c1.size(), 1u);
  EXPECT_EQ(c1[0].src, shared);
  EXPECT_EQ(block(kv, b)[1], c1[0].dst);
  EXPECT_EQ(block(kv, a)[1], shared);  // a keeps the original
  // A fork shares even the partial last page: the first of the two to write into it copies it.
  const int f = kv.fork(a);
  EXPECT_EQ(kv.position(f), 10);
  EXPECT_EQ(block(kv, f), block(kv, a));
  const std::vector<PageCopy> c2 = grow(kv, f, 1);
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_EQ(c2[0].src, block(kv, a)[2]);
  EXPECT_TRUE(grow(kv, a, 1).empty());  // a alone holds its last page now
  kv.remove(a), kv.remove(b), kv.remove(f);
  EXPECT_EQ(kv.pages_free(), 16);
}

TEST(KvPages, TheCacheGivesWayLeastRecentlyUsedFirst) {
  KvPages kv(4, 4, 2, 64);
  std::vector<PageCopy> copies;
  const std::vector<int> p = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const int a = kv.add();
  kv.grow(a, p, copies);
  kv.publish(a);
  kv.remove(a);  // 4 cached pages, none held: the last page is released first, evicted first
  EXPECT_EQ(kv.stats().cached_pages, 4);
  const int b = kv.add();
  grow(kv, b, 8, 7);  // other tokens: takes 2 pages, evicting the chain's tail
  EXPECT_EQ(kv.stats().evicted_pages, 2);
  EXPECT_EQ(kv.stats().cached_pages, 2);
  kv.remove(b);
  const int c = kv.add();
  EXPECT_EQ(kv.match_prefix(c, p), 8);  // the chain's head survived
  expect_error([&] { grow(kv, c, 20); }, "free pages");
}

TEST(KvPages, PrefixCacheOffMatchesNothing) {
  KvPages kv(8, 4, 2, 32, /*prefix_cache=*/false);
  std::vector<PageCopy> copies;
  const std::vector<int> p = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const int a = kv.add();
  kv.grow(a, p, copies);
  kv.publish(a);
  kv.remove(a);
  const int b = kv.add();
  EXPECT_EQ(kv.match_prefix(b, p), 0);
  EXPECT_EQ(kv.stats().cached_pages, 0);
}

std::vector<int> table(const KvPages& kv, int seq) {
  return {kv.block_table(seq).begin(), kv.block_table(seq).end()};
}

TEST(KvPages, ASequenceGrowsIntoThePageAfterItsLast) {
  KvPages kv(16, 4, 3, 64);
  const int a = kv.add(), b = kv.add();
  grow(kv, a, 4);  // page 0
  grow(kv, b, 4);  // page 1
  grow(kv, a, 4);  // page 1 is b's: the free list's next, 2
  EXPECT_EQ(table(kv, a), (std::vector<int>{0, 2}));
  EXPECT_FALSE(kv.consecutive(a));
  grow(kv, a, 4);  // page 3 follows 2 and is free
  EXPECT_EQ(table(kv, a), (std::vector<int>{0, 2, 3}));
  kv.truncate(a, 4);  // back to page 0 alone; 2 and 3 free
  EXPECT_TRUE(kv.consecutive(a));
  kv.remove(b);  // 1 free, the free list's next
  const int c = kv.add();
  grow(kv, c, 12);  // 1, then the free pages after it
  EXPECT_EQ(table(kv, c), (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(kv.consecutive(c));
}

TEST(KvPages, GatherMovesAPrefixHitsPagesIntoOneRun) {
  KvPages kv(16, 4, 3, 64);
  const std::vector<int> p = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<PageCopy> copies;
  const int a = kv.add();
  kv.grow(a, p, copies);  // pages 0, 1, 2 (the last partial)
  kv.publish(a);          // 0 and 1 cached
  kv.remove(a);
  const int b = kv.add();
  grow(kv, b, 4);  // takes page 2, freed by a
  const int c = kv.add();
  EXPECT_EQ(kv.match_prefix(c, p), 8);
  grow(kv, c, 2);  // page 2 is b's: out of order
  const std::vector<int> before = table(kv, c);
  ASSERT_EQ(before.size(), 3u);
  EXPECT_EQ(before[0], 0);
  EXPECT_EQ(before[1], 1);
  EXPECT_FALSE(kv.consecutive(c));
  const int free_before = kv.pages_free();
  const std::vector<int> tb = table(kv, b);
  copies.clear();
  ASSERT_TRUE(kv.gather(c, 5, copies));
  EXPECT_TRUE(kv.consecutive(c));
  const std::vector<int> after = table(kv, c);
  ASSERT_EQ(after.size(), before.size());
  ASSERT_EQ(copies.size(), before.size());  // every page moved, contents copied in order
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(copies[i].src, before[i]);
    EXPECT_EQ(copies[i].dst, after[i]);
    EXPECT_EQ(after[i], after[0] + int(i));
    EXPECT_NE(after[i], tb[0]);
  }
  EXPECT_EQ(kv.pages_free(), free_before);  // as many taken as released
  EXPECT_EQ(table(kv, b), tb);
  EXPECT_EQ(kv.position(c), 10);
  // The cached pages stayed cached: a new sequence still finds them.
  const int d = kv.add();
  EXPECT_EQ(kv.match_prefix(d, p), 8);
  EXPECT_EQ(kv.block_table(d)[0], 0);
  // Its growth continues the run (the extra 5 tokens' pages were left free after it).
  copies.clear();
  EXPECT_TRUE(kv.gather(c, 5, copies));  // already consecutive: nothing to do
  EXPECT_TRUE(copies.empty());
  grow(kv, c, 5);
  EXPECT_TRUE(kv.consecutive(c));
}

TEST(KvPages, GatherWithoutAFreeRunChangesNothing) {
  KvPages kv(6, 4, 3, 64);
  const int a = kv.add(), b = kv.add();
  for (int i = 0; i < 3; ++i) grow(kv, a, 4), grow(kv, b, 4);  // a: 0 2 4, b: 1 3 5
  kv.remove(b);                                                // free runs of one page
  const std::vector<int> ta = table(kv, a);
  std::vector<PageCopy> copies;
  EXPECT_FALSE(kv.gather(a, 0, copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(table(kv, a), ta);
  EXPECT_EQ(kv.pages_free(), 3);
}

// --- paged attention
// ------------------------------------------------------------------------------

// attention_paged over scrambled pages (the rest of the pool NaN) equals attention over the same
// rows stored contiguously, bit for bit, at every length around page boundaries.
TEST(CpuOps, PagedAttentionEqualsContiguous) {
  const int n_heads = 6, n_kv = 2, hd = 16, kv_dim = n_kv * hd, page = 5, n_pages = 12;
  const std::vector<int> pages = {7, 2, 11, 0, 5, 9, 3, 10};  // 40 positions
  const std::vector<float> q = test::randn(n_heads * hd, 1), k = test::randn(40 * kv_dim, 2),
                           v = test::randn(40 * kv_dim, 3);
  std::vector<float> kp(size_t(n_pages) * page * kv_dim, NAN), vp = kp;
  for (int t = 0; t < 40; ++t) {
    const size_t slot = size_t(pages[t / page]) * page + t % page;
    std::copy_n(k.begin() + t * kv_dim, kv_dim, kp.begin() + slot * kv_dim);
    std::copy_n(v.begin() + t * kv_dim, kv_dim, vp.begin() + slot * kv_dim);
  }
  std::vector<float> want(n_heads * hd), got(n_heads * hd, NAN), scratch(40);
  for (int n_pos : {1, 4, 5, 6, 10, 23, 40}) {
    cpu::attention_decode(want.data(), q.data(), k.data(), v.data(), n_pos, n_heads, n_kv, hd,
                          scratch.data());
    cpu::attention_paged(got.data(), q.data(), kp.data(), vp.data(), pages.data(), page, n_pos,
                         n_heads, n_kv, hd, scratch.data());
    EXPECT_EQ(got, want) << "n_pos " << n_pos;
  }
}

// --- the CPU BatchBackend against the single-sequence CpuBackend ---------------------------------

std::vector<int> some_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> t(n);
  for (int& x : t) x = static_cast<int>(rng() % vocab);
  return t;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temp = 0.0f;
  return p;
}

SamplingParams sampled(int64_t seed) {
  SamplingParams p;
  p.temp = 0.8f;
  p.repeat_penalty = 1.1f;  // exercises the history too
  p.seed = seed;
  return p;
}

// What one sequence produced: each sampled token and the logits it was sampled from.
struct Trace {
  std::vector<int> tokens;
  std::vector<std::vector<float>> logits;
};

// The sequence alone through CpuBackend: the prompt, then n_gen sampled tokens (each fed back
// but the last), sampling as Backend::forward_token_sample's default does.
Trace run_alone(const Model& m, const std::string& kind, const std::vector<int>& prompt, int n_gen,
                const SamplingParams& p) {
  auto be = make_cpu_backend(m, BackendOptions{kind, 0, 2});
  TokenSampler s(p);
  s.accept(prompt);
  cpu::SampleScratch scratch;
  Trace t;
  std::span<const float> logits = be->forward_prompt(prompt);
  for (int i = 0; i < n_gen; ++i) {
    t.logits.emplace_back(logits.begin(), logits.end());
    t.tokens.push_back(cpu::sample(logits, p, s.step_draw(), s.history(), scratch));
    s.accept(t.tokens.back());
    if (i + 1 < n_gen) logits = be->forward_token(t.tokens.back(), be->position());
  }
  return t;
}

// The same through the Backend sampling entry points (tokens only).
std::vector<int> run_alone_sample_api(const Model& m, const std::string& kind,
                                      const std::vector<int>& prompt, int n_gen,
                                      const SamplingParams& p) {
  auto be = make_cpu_backend(m, BackendOptions{kind, 0, 2});
  TokenSampler s(p);
  s.accept(prompt);
  std::vector<int> out{be->forward_prompt_sample(prompt, p, s.step_draw(), s.history())};
  for (int i = 1; i < n_gen; ++i) {
    s.accept(out.back());
    out.push_back(
        be->forward_token_sample(out.back(), be->position(), p, s.step_draw(), s.history()));
  }
  return out;
}

// One sequence driven through a BatchBackend: feeds its prompt in chunks, then its last token,
// until it has n_gen tokens.
struct Driven {
  Driven(BatchBackend& be, std::vector<int> prompt_, int n_gen_, SamplingParams p, int chunk_)
      : prompt(std::move(prompt_)), n_gen(n_gen_), chunk(chunk_), params(p), sampler(p) {
    id = be.add_sequence();
    sampler.accept(prompt);
  }
  bool done() const { return static_cast<int>(trace.tokens.size()) == n_gen; }

  // Its entry for the next step.
  SeqStep next() {
    SeqStep s;
    s.seq = id;
    const size_t left = prompt.size() - fed;
    if (left > 0) {
      const size_t n = std::min<size_t>(left, static_cast<size_t>(chunk));
      s.tokens = std::span<const int>(prompt).subspan(fed, n);
      fed += n;
      s.sample = fed == prompt.size();  // only the prompt's last chunk samples
    } else {
      s.tokens = std::span<const int>(&trace.tokens.back(), 1);
    }
    s.logits = s.sample ? 1 : 0;
    s.params = params;
    if (s.sample) s.u = sampler.step_draw();
    s.history = sampler.history();
    return s;
  }
  void take(const SeqResult& r, const SeqStep& s) {
    if (!s.sample) {
      EXPECT_EQ(r.token, -1);
      EXPECT_TRUE(r.logits.empty());
      return;
    }
    trace.tokens.push_back(r.token);
    trace.logits.push_back(r.logits);
    sampler.accept(r.token);
  }

  std::vector<int> prompt;
  int n_gen, chunk;
  SamplingParams params;
  TokenSampler sampler;
  int id = -1;
  size_t fed = 0;
  Trace trace;
};

// One step over the sequences that are not done.
void step_once(BatchBackend& be, std::vector<Driven*> seqs) {
  std::vector<SeqStep> batch;
  std::vector<Driven*> who;
  for (Driven* d : seqs) {
    if (d->done()) continue;
    batch.push_back(d->next());
    who.push_back(d);
  }
  if (batch.empty()) return;
  const std::vector<SeqResult> res = be.step(batch);
  ASSERT_EQ(res.size(), batch.size());
  for (size_t i = 0; i < res.size(); ++i) who[i]->take(res[i], batch[i]);
}

void step_until_done(BatchBackend& be, std::vector<Driven*> seqs) {
  for (int guard = 0; guard < 1000; ++guard) {
    if (std::all_of(seqs.begin(), seqs.end(), [](Driven* d) { return d->done(); })) return;
    step_once(be, seqs);
  }
  FAIL() << "sequences never finished";
}

void expect_same_as_alone(const Model& m, const std::string& kind, const Driven& d) {
  const Trace alone = run_alone(m, kind, d.prompt, d.n_gen, d.params);
  EXPECT_EQ(d.trace.tokens, alone.tokens) << "sequence " << d.id;
  ASSERT_EQ(d.trace.logits.size(), alone.logits.size());
  for (size_t i = 0; i < alone.logits.size(); ++i)
    EXPECT_EQ(d.trace.logits[i], alone.logits[i]) << "sequence " << d.id << " token " << i;
}

BatchOptions cpu_opts(const std::string& kind, int max_seqs = 4, int page_size = 16,
                      int kv_tokens = 0) {
  BatchOptions o;
  o.kind = kind;
  o.max_seqs = max_seqs;
  o.page_size = page_size;
  o.kv_tokens = kv_tokens;
  o.n_threads = 2;
  return o;
}

// (a) Four prompts in one step, then 20 greedy decode steps together.
void check_prompts_then_decode(const Model& m, const std::string& kind, int page_size) {
  auto be = make_batch_backend(m, cpu_opts(kind, 4, page_size));
  const int vocab = m.config.vocab_size;
  std::vector<Driven> d;
  d.reserve(4);
  const int lens[4] = {5, 9, 17, 33};
  for (int i = 0; i < 4; ++i)
    d.emplace_back(*be, some_tokens(lens[i], vocab, 100 + i), 21, greedy(), 64);
  std::vector<Driven*> all;
  for (Driven& x : d) all.push_back(&x);
  step_once(*be, all);  // every prompt in one step
  for (const Driven& x : d) EXPECT_EQ(x.trace.tokens.size(), 1u);
  step_until_done(*be, all);  // 20 decode steps together
  for (const Driven& x : d) {
    expect_same_as_alone(m, kind, x);
    EXPECT_EQ(be->position(x.id), static_cast<int>(x.prompt.size()) + 20);
  }
}

// The same checks on stories260K (a trained model, vocab 512), on a tiny random model (GQA,
// mixed weight types; needs no fixtures) and on the qwen2 / llama3 / gemma3 tiny synth presets.
class CpuBatchModel : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    const std::string model = std::get<0>(GetParam());
    if (model == "tiny") {
      tiny_ = test::make_tiny_model({}, 7);
      m_ = &tiny_->model;
      return;
    }
    if (model.rfind("synth_", 0) == 0) {  // a family's tiny synth preset, q8_0
      SynthOptions o;
      o.preset = model.substr(6);
      std::replace(o.preset.begin(), o.preset.end(), '_', '-');
      o.type = GgmlType::Q8_0;
      o.seed = 11;
      loaded_.file = gguf::File::parse(synth_model(o).writer.to_bytes(), o.preset);
      loaded_.config = load_config(*loaded_.file);
      loaded_.weights = load_weights(*loaded_.file, loaded_.config);
      m_ = &loaded_;
      return;
    }
    REQUIRE_FIXTURE(path, "models/stories260K.gguf");
    loaded_ = load_model(path.string());
    m_ = &loaded_;
  }
  const Model& m() const { return *m_; }
  const std::string& kind() const { return std::get<1>(GetParam()); }
  int vocab() const { return m_->config.vocab_size; }

 private:
  std::unique_ptr<test::TinyModel> tiny_;
  Model loaded_;
  const Model* m_ = nullptr;
};
// synth_tiny_gemma3: prompts of up to 33 tokens against a window of 8 on pages of 16 and 3, so a
// local layer's attention starts inside a page and skips whole pages.
INSTANTIATE_TEST_SUITE_P(
    Models, CpuBatchModel,
    ::testing::Combine(::testing::Values("tiny", "stories260K", "synth_tiny_qwen2",
                                         "synth_tiny_llama3", "synth_tiny_gemma3"),
                       ::testing::Values("cpu-ref", "cpu")),
    [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& p) {
      return std::get<0>(p.param) + (std::get<1>(p.param) == "cpu" ? "_fast" : "_ref");
    });

TEST_P(CpuBatchModel, PromptsThenDecodeMatchAlone) {
  check_prompts_then_decode(m(), kind(), 16);
  check_prompts_then_decode(m(), kind(), 3);  // pages smaller than any chunk
}

// (b) A prompt chunked across steps while others decode.
TEST_P(CpuBatchModel, ChunkedPromptInterleavedWithDecodes) {
  const Model& m = this->m();
  auto be = make_batch_backend(m, cpu_opts(kind(), 4, 5));
  Driven a(*be, some_tokens(40, vocab(), 1), 12, greedy(), 7);
  Driven b(*be, some_tokens(6, vocab(), 2), 25, greedy(), 64);
  Driven c(*be, some_tokens(11, vocab(), 3), 25, greedy(), 4);
  step_once(*be, {&b});
  step_until_done(*be, {&a, &b, &c});
  for (const Driven* x : {&a, &b, &c}) expect_same_as_alone(m, kind(), *x);
}

// (c) A freed id and its pages, reused, behave as a fresh sequence.
TEST_P(CpuBatchModel, FreedSequenceReusedMatchesFresh) {
  const Model& m = this->m();
  auto be = make_batch_backend(m, cpu_opts(kind(), 2, 4));
  const int total = be->kv_pages_free();
  auto x = std::make_unique<Driven>(*be, some_tokens(13, vocab(), 4), 10, greedy(), 64);
  Driven y(*be, some_tokens(9, vocab(), 5), 30, greedy(), 3);
  step_until_done(*be, {x.get(), &y});
  const int x_id = x->id;
  EXPECT_LT(be->kv_pages_free(), total);
  be->free_sequence(x_id);
  expect_error([&] { be->position(x_id); }, "does not exist");
  expect_error([&] { be->free_sequence(x_id); }, "does not exist");
  // The reused pages come back in another order, interleaved with y's.
  Driven z(*be, some_tokens(21, vocab(), 6), 15, greedy(), 8);
  EXPECT_EQ(z.id, x_id);
  y.n_gen += 15;
  step_until_done(*be, {&z, &y});
  expect_same_as_alone(m, kind(), z);
  expect_same_as_alone(m, kind(), y);
  be->free_sequence(z.id);
  be->free_sequence(y.id);
  EXPECT_EQ(be->kv_pages_free(), total);
}

// (d) Sampled tokens (temp 0.8, penalties, seeded draws) equal the single-sequence path.
TEST_P(CpuBatchModel, SampledMatchesForwardTokenSample) {
  const Model& m = this->m();
  auto be = make_batch_backend(m, cpu_opts(kind(), 3, 16));
  std::vector<Driven> d;
  d.reserve(3);
  for (int i = 0; i < 3; ++i)
    d.emplace_back(*be, some_tokens(8 + 5 * i, vocab(), 20 + i), 24, sampled(1234 + i), 6);
  step_until_done(*be, {&d[0], &d[1], &d[2]});
  for (const Driven& x : d) {
    expect_same_as_alone(m, kind(), x);
    EXPECT_EQ(x.trace.tokens, run_alone_sample_api(m, kind(), x.prompt, x.n_gen, x.params));
  }
}

// (e) logits = 2 returns every row of the chunk, as forward_prompt_all.
TEST_P(CpuBatchModel, EveryRowLogitsEqualForwardPromptAll) {
  const Model& m = this->m();
  const std::vector<int> prompt = some_tokens(30, vocab(), 9), other = some_tokens(7, vocab(), 10);
  auto single = make_cpu_backend(m, BackendOptions{kind(), 0, 2});
  const std::vector<float> want = single->forward_prompt_all(prompt);

  auto be = make_batch_backend(m, cpu_opts(kind(), 2, 16));
  const int a = be->add_sequence(), b = be->add_sequence();
  std::vector<float> got;
  for (auto [from, to] : {std::pair{0, 12}, std::pair{12, 30}}) {
    SeqStep sa, sb;
    sa.seq = a;
    sa.tokens = std::span<const int>(prompt).subspan(from, to - from);
    sa.sample = false;
    sa.logits = 2;
    sb.seq = b;  // a whole prompt, then one decode token
    sb.tokens = from == 0 ? std::span<const int>(other) : std::span<const int>(other).first(1);
    const std::vector<SeqResult> r = be->step(std::vector<SeqStep>{sb, sa});
    EXPECT_EQ(r[1].token, -1);
    EXPECT_EQ(r[1].logits.size(), size_t(to - from) * vocab());
    EXPECT_TRUE(r[0].logits.empty());
    EXPECT_GE(r[0].token, 0);
    got.insert(got.end(), r[1].logits.begin(), r[1].logits.end());
  }
  EXPECT_EQ(got, want);
}

// (f) A prompt whose pages a finished sequence left in the prefix cache: its remaining tokens'
// logits and its greedy continuation equal computing it all (bit for bit on the CPU).
TEST_P(CpuBatchModel, PrefixCachedPromptMatchesUncached) {
  const Model& m = this->m();
  auto be = make_batch_backend(m, cpu_opts(kind(), 2, 4));
  const std::vector<int> prompt = some_tokens(23, vocab(), 31);
  Driven a(*be, prompt, 6, greedy(), 64);
  step_until_done(*be, {&a});
  be->free_sequence(a.id);
  const int b = be->add_sequence();
  const int hit = be->match_prefix(b, prompt);
  EXPECT_EQ(hit, 20);
  EXPECT_EQ(be->prefix_stats().cached_tokens, 20);
  std::vector<int> toks;
  SeqStep s;
  s.seq = b, s.tokens = std::span<const int>(prompt).subspan(hit), s.params = greedy(),
  s.logits = 1;
  std::vector<SeqResult> r = be->step(std::vector<SeqStep>{s});
  EXPECT_EQ(r[0].logits, a.trace.logits[0]);
  toks.push_back(r[0].token);
  for (int i = 1; i < 6; ++i) {
    s.tokens = std::span<const int>(&toks.back(), 1);
    r = be->step(std::vector<SeqStep>{s});
    EXPECT_EQ(r[0].logits, a.trace.logits[i]) << "token " << i;
    toks.push_back(r[0].token);
  }
  EXPECT_EQ(toks, a.trace.tokens);
}

// (g) n > 1: a prompt prefilled once, forked; each fork continues as a sequence of its own would.
TEST_P(CpuBatchModel, ForkedSequencesMatchFreshOnes) {
  const Model& m = this->m();
  auto be = make_batch_backend(m, cpu_opts(kind(), 4, 4));
  const std::vector<int> prompt = some_tokens(14, vocab(), 41);
  const int a = be->add_sequence();
  SeqStep s;
  s.seq = a, s.tokens = std::span<const int>(prompt).first(13), s.sample = false;
  be->step(std::vector<SeqStep>{s});
  const int f = be->fork_sequence(a);
  EXPECT_EQ(be->position(f), 13);
  const int x = 5 % vocab(), y = 9 % vocab();
  std::vector<int> ax = prompt, fy = prompt;
  ax.push_back(x), fy.push_back(y);
  SeqStep sa, sf;  // both write into their shared last page: each gets its own copy first
  sa.seq = a, sa.tokens = std::span<const int>(ax).subspan(13), sa.params = greedy(), sa.logits = 1;
  sf.seq = f, sf.tokens = std::span<const int>(fy).subspan(13), sf.params = greedy(), sf.logits = 1;
  const std::vector<SeqResult> r = be->step(std::vector<SeqStep>{sa, sf});
  auto fresh = [&](const std::vector<int>& t) {
    auto single = make_cpu_backend(m, BackendOptions{kind(), 0, 2});
    const std::span<const float> l = single->forward_prompt(t);
    return std::vector<float>(l.begin(), l.end());
  };
  EXPECT_EQ(r[0].logits, fresh(ax));
  EXPECT_EQ(r[1].logits, fresh(fy));
}

// (h) An allowed-token mask: the sampled token is the best allowed one; the others' logits are
// -inf, the allowed ones as without the mask.
TEST_P(CpuBatchModel, AllowedTokenMaskConstrainsTheSample) {
  const Model& m = this->m();
  const int V = vocab();
  auto be = make_batch_backend(m, cpu_opts(kind(), 2, 16));
  const std::vector<int> prompt = some_tokens(9, V, 51);
  std::vector<uint32_t> mask((V + 31) / 32, 0);
  for (int t = 0; t < V; t += 3) mask[t / 32] |= 1u << (t % 32);
  std::vector<float> plain;
  for (bool masked : {false, true}) {
    const int a = be->add_sequence();
    SeqStep s;
    s.seq = a, s.tokens = prompt, s.params = greedy(), s.logits = 1;
    if (masked) s.allowed = mask;
    const std::vector<SeqResult> r = be->step(std::vector<SeqStep>{s});
    be->free_sequence(a);
    if (!masked) {
      plain = r[0].logits;
      continue;
    }
    int best = -1;
    for (int t = 0; t < V; ++t) {
      if (t % 3 == 0) {
        EXPECT_EQ(r[0].logits[t], plain[t]);
        if (best < 0 || plain[t] > plain[best]) best = t;
      } else {
        EXPECT_EQ(r[0].logits[t], -INFINITY);
      }
    }
    EXPECT_EQ(r[0].token, best);
  }
  SeqStep bad;
  bad.seq = be->add_sequence(), bad.tokens = prompt, bad.params = greedy();
  const std::vector<uint32_t> short_mask(1, ~0u);
  if (V > 32) {
    bad.allowed = short_mask;
    expect_error([&] { be->step(std::vector<SeqStep>{bad}); }, "allowed-token mask");
  }
}

// rollback then re-feeding gives the same logits as the first time.
TEST(CpuBatch, TinyModelRollbackRefeeds) {
  const auto tm = test::make_tiny_model({}, 3);
  for (const std::string kind : {"cpu-ref", "cpu"}) {
    auto be = make_batch_backend(tm->model, cpu_opts(kind, 1, 4));
    const std::vector<int> toks = some_tokens(20, 100, 4);
    const int a = be->add_sequence();
    SeqStep s;
    s.seq = a;
    s.tokens = toks;
    s.sample = false;
    s.logits = 2;
    const std::vector<float> first = be->step(std::span<const SeqStep>(&s, 1))[0].logits;
    be->rollback(a, 6);
    EXPECT_EQ(be->position(a), 6);
    EXPECT_EQ(be->kv_pages_free(), be->kv_pages_total() - 2);
    s.tokens = std::span<const int>(toks).subspan(6);
    const std::vector<float> again = be->step(std::span<const SeqStep>(&s, 1))[0].logits;
    EXPECT_EQ(again, std::vector<float>(first.begin() + 6 * 100, first.end()));
    expect_error([&] { be->rollback(a, 21); }, "invalid");
  }
}

// --- options and errors
// ---------------------------------------------------------------------------

TEST(CpuBatch, OptionsDefaultsAndErrors) {
  const auto tm = test::make_tiny_model({}, 2);  // n_ctx_train 64
  const Model& m = tm->model;
  EXPECT_EQ(make_batch_backend(m, cpu_opts("cpu", 3, 16))->name(), "cpu");
  auto be = make_batch_backend(m, cpu_opts("cpu-ref", 3, 16));
  EXPECT_EQ(be->name(), "cpu-ref");
  EXPECT_EQ(be->seq_ctx(), 64);
  EXPECT_EQ(be->max_seqs(), 3);
  EXPECT_EQ(be->kv_tokens(), 64 * 3);
  EXPECT_EQ(be->kv_pages_free(), 12);
  EXPECT_EQ(be->max_step_tokens(), kCpuStepTokens);  // 0 asks for the backend's default

  BatchOptions o = cpu_opts("cpu-ref", 2, 16, 40);  // rounded up to whole pages
  o.seq_ctx = 20;
  be = make_batch_backend(m, o);
  EXPECT_EQ(be->kv_tokens(), 48);
  EXPECT_EQ(be->seq_ctx(), 20);

  // The default pool is capped by memory, but holds at least one whole sequence.
  const ModelConfig& c = m.config;
  const int64_t per_token = int64_t(2) * c.n_layers * c.kv_dim() * 4;
  BatchOptions big = cpu_opts("cpu-ref", 1000, 16);
  EXPECT_EQ(batch_geometry(c, big, per_token, per_token * 100).n_pages, 7);  // 100 -> 112
  EXPECT_EQ(batch_geometry(c, big, per_token, per_token * 10).n_pages, 4);   // 64

  auto bad = [&](auto edit, const std::string& what) {
    BatchOptions b = cpu_opts("cpu-ref");
    edit(b);
    expect_error([&] { make_batch_backend(m, b); }, what);
  };
  bad([](BatchOptions& b) { b.max_seqs = 0; }, "max_seqs 0");
  bad([](BatchOptions& b) { b.page_size = -1; }, "page_size -1");
  bad([](BatchOptions& b) { b.max_step_tokens = -1; }, "max_step_tokens -1");
  bad([](BatchOptions& b) { b.seq_ctx = 65; }, "training context");
  bad([](BatchOptions& b) { b.seq_ctx = -2; }, "seq_ctx -2");
  bad([](BatchOptions& b) { b.kv_tokens = -1; }, "kv_tokens -1");
  bad([](BatchOptions& b) { b.n_threads = -1; }, "--threads");
  bad([](BatchOptions& b) { b.kind = "tpu"; }, "unknown backend");
#if !defined(SMOLRT_HAVE_CUDA)
  bad([](BatchOptions& b) { b.kind = "cuda"; }, "no CUDA support");
#endif
}

TEST(CpuBatch, TooManySequences) {
  const auto tm = test::make_tiny_model({}, 2);
  auto be = make_batch_backend(tm->model, cpu_opts("cpu-ref", 2, 16));
  be->add_sequence();
  be->add_sequence();
  expect_error([&] { be->add_sequence(); }, "sequence slots are in use");
}

TEST(CpuBatch, BadStepsThrowAndChangeNothing) {
  const auto tm = test::make_tiny_model({}, 2);    // vocab 100, n_ctx_train 64
  BatchOptions o = cpu_opts("cpu-ref", 3, 8, 48);  // 6 pages
  o.max_step_tokens = 40;
  auto be = make_batch_backend(tm->model, o);
  const int a = be->add_sequence(), b = be->add_sequence(), c = be->add_sequence();
  const std::vector<int> five = some_tokens(5, 100, 1);
  SeqStep sa, sb;
  sa.seq = a;
  sa.tokens = five;
  sb.seq = b;
  sb.tokens = five;
  be->step(std::vector<SeqStep>{sa, sb});  // a, b at 5; 2 pages taken

  const std::vector<int> big = some_tokens(36, 100, 2), ok = {1};
  const std::vector<int> bad_id = {3, 100}, neg_id = {-1};
  auto expect_unchanged_after = [&](std::vector<SeqStep> batch, const std::string& what) {
    expect_error([&] { be->step(batch); }, what);
    EXPECT_EQ(be->position(a), 5);
    EXPECT_EQ(be->position(b), 5);
    EXPECT_EQ(be->position(c), 0);
    EXPECT_EQ(be->kv_pages_free(), 4);
  };
  auto one = [&](int seq, std::span<const int> t) {
    SeqStep s;
    s.seq = seq;
    s.tokens = t;
    return s;
  };
  EXPECT_TRUE(be->step({}).empty());  // nothing to do is not an error
  expect_unchanged_after({one(a, ok), one(7, ok)}, "sequence 7 does not exist");
  expect_unchanged_after({one(a, ok), one(-1, ok)}, "sequence -1 does not exist");
  expect_unchanged_after({one(a, ok), one(b, ok), one(a, ok)}, "appears twice");
  expect_unchanged_after({one(a, ok), one(b, {})}, "has no tokens");
  expect_unchanged_after({one(a, ok), one(b, bad_id)}, "token id 100 is out of range");
  expect_unchanged_after({one(a, neg_id)}, "token id -1 is out of range");
  // 36 + 5 tokens > 40
  expect_unchanged_after({one(c, big), one(a, five)}, "exceed the step limit of 40");
  // The pool: a needs one more page, c 5 (33 tokens): 6 > 4 free.
  const std::vector<int> big33(big.begin(), big.begin() + 33);
  expect_unchanged_after({one(a, five), one(c, big33)}, "free pages");
  SeqStep s = one(a, ok);
  s.logits = 3;
  expect_unchanged_after({one(b, ok), s}, "logits = 3");
  s = one(a, ok);
  s.params.top_p = 0.0f;
  expect_unchanged_after({one(b, ok), s}, "--top-p");
  s = one(a, ok);
  s.u = 1.0f;
  expect_unchanged_after({one(b, ok), s}, "outside [0, 1)");
  const std::vector<int> bad_history = {5, 100};
  s = one(a, ok);
  s.params.repeat_penalty = 1.1f;
  s.history = bad_history;
  expect_unchanged_after({one(b, ok), s}, "sampling history");

  // Past seq_ctx: grow a to 60 of 64, then 5 more.
  o.kv_tokens = 0;
  o.max_step_tokens = 512;
  be = make_batch_backend(tm->model, o);
  const int d = be->add_sequence();
  const std::vector<int> sixty = some_tokens(60, 100, 3);
  be->step(std::vector<SeqStep>{one(d, sixty)});
  expect_error([&] { be->step(std::vector<SeqStep>{one(d, five)}); }, "pass its context of 64");
  EXPECT_EQ(be->position(d), 60);
  be->step(std::vector<SeqStep>{one(d, std::span<const int>(five).first(4))});  // exactly fills it
  EXPECT_EQ(be->position(d), 64);
}

}  // namespace
}  // namespace smolrt
