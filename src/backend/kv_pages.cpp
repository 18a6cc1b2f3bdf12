#include "backend/kv_pages.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "core/error.h"

namespace smolrt {

namespace {

// splitmix64's finalizer: every input bit moves every output bit.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

KvPages::KvPages(int n_pages, int page_size, int max_seqs, int seq_ctx, bool prefix_cache)
    : n_pages_(n_pages),
      page_size_(page_size),
      max_seqs_(max_seqs),
      seq_ctx_(seq_ctx),
      cache_on_(prefix_cache) {
  if (n_pages <= 0 || page_size <= 0 || max_seqs <= 0 || seq_ctx <= 0)
    fail("KV pool: pages ", n_pages, ", page size ", page_size, ", sequences ", max_seqs,
         ", context ", seq_ctx, " must all be positive");
  // slot() returns an int.
  if (int64_t(n_pages) * page_size > INT32_MAX)
    fail("KV pool: ", n_pages, " pages of ", page_size, " tokens exceed 2^31 slots");
  pages_.resize(n_pages);
  free_.reserve(n_pages);
  free_at_.assign(n_pages, -1);
  for (int p = n_pages - 1; p >= 0; --p) {  // page 0 is taken first
    free_at_[p] = static_cast<int>(free_.size());
    free_.push_back(p);
  }
  seqs_.resize(max_seqs);
}

void KvPages::check(int seq) const {
  if (!exists(seq)) fail("sequence ", seq, " does not exist");
}

bool KvPages::exists(int seq) const {
  return seq >= 0 && seq < max_seqs_ && seqs_[seq].used;
}

PrefixStats KvPages::stats() const {
  PrefixStats s = stats_;
  s.cached_pages = static_cast<int>(map_.size());
  return s;
}

uint64_t KvPages::chain(uint64_t parent, std::span<const int> toks) const {
  uint64_t h = mix(parent ^ 0x736d6f6c7274ull);
  for (int t : toks) h = mix(h ^ static_cast<uint32_t>(t));
  return h == 0 ? 1 : h;  // 0 stands for "no parent"
}

int KvPages::take_page(int want) {
  int p;
  if (want >= 0 && want < n_pages_ && free_at_[want] >= 0) {
    // Out of free_ in O(1): the last entry takes its place.
    const int i = free_at_[want];
    free_[i] = free_.back();
    free_at_[free_[i]] = i;
    free_.pop_back();
    free_at_[want] = -1;
    p = want;
  } else if (!free_.empty()) {
    p = free_.back();
    free_.pop_back();
    free_at_[p] = -1;
  } else {
    if (lru_.empty()) fail("KV pool: no page left");  // callers check pages_free() first
    p = lru_.front();
    lru_.pop_front();
    uncache(p);
    ++stats_.evicted_pages;
  }
  pages_[p].ref = 0;
  return p;
}

void KvPages::uncache(int page) {
  Page& pg = pages_[page];
  if (!pg.cached) return;
  auto it = map_.find(pg.key);
  if (it != map_.end() && it->second == page) map_.erase(it);
  pg.cached = false;
  pg.toks.clear();
}

void KvPages::hold(int page) {
  Page& pg = pages_[page];
  if (pg.ref == 0 && pg.cached) lru_.erase(pg.lru);
  ++pg.ref;
}

void KvPages::release(int page) {
  Page& pg = pages_[page];
  if (--pg.ref > 0) return;
  if (pg.cached) {
    lru_.push_back(page);
    pg.lru = std::prev(lru_.end());
  } else {
    free_at_[page] = static_cast<int>(free_.size());
    free_.push_back(page);
  }
}

void KvPages::push_page(Seq& s, int page) {
  if (s.run == static_cast<int>(s.pages.size()) && (s.pages.empty() || page == s.pages.back() + 1))
    ++s.run;
  s.pages.push_back(page);
}

int KvPages::add() {
  for (int i = 0; i < max_seqs_; ++i) {
    if (!seqs_[i].used) {
      seqs_[i] = Seq{};
      seqs_[i].used = true;
      ++live_;
      return i;
    }
  }
  fail("all ", max_seqs_, " sequence slots are in use; free one or allow more (--parallel)");
}

void KvPages::remove(int seq) {
  check(seq);
  truncate(seq, 0);
  seqs_[seq].used = false;
  --live_;
}

int KvPages::position(int seq) const {
  check(seq);
  return seqs_[seq].pos;
}

int KvPages::pages_needed(int seq, int n) const {
  check(seq);
  const Seq& s = seqs_[seq];
  // 64-bit: a caller may ask about any n (check_step sums these before rejecting the step).
  const int64_t want = (s.pos + std::max<int64_t>(n, 0) + page_size_ - 1) / page_size_;
  const int64_t have = static_cast<int64_t>(s.pages.size());
  const int64_t cow = n > 0 && s.pos % page_size_ != 0 && !writable(s.pages.back()) ? 1 : 0;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(want - have, 0) + cow, INT32_MAX));
}

void KvPages::grow(int seq, std::span<const int> tokens, std::vector<PageCopy>& copies) {
  check(seq);
  Seq& s = seqs_[seq];
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (s.pos + n > seq_ctx_)
    fail("sequence ", seq, " would hold ", s.pos + n, " tokens, past its context of ", seq_ctx_);
  const int need = pages_needed(seq, static_cast<int>(n));
  if (need > pages_free())
    fail("the KV pool has ", pages_free(), " free pages; ", need, " are needed");
  if (n > 0 && s.pos % page_size_ != 0 && !writable(s.pages.back())) {
    // The first new row lands in a page others hold or the cache keeps: write a private copy.
    const int last = s.pages.back();
    s.pages.pop_back();
    s.run = std::min(s.run, static_cast<int>(s.pages.size()));
    const int q = take_page(s.pages.empty() ? -1 : s.pages.back() + 1);
    hold(q);
    copies.push_back({last, q});
    release(last);
    push_page(s, q);
  }
  const int64_t want = (s.pos + n + page_size_ - 1) / page_size_;
  while (static_cast<int64_t>(s.pages.size()) < want) {
    const int p = take_page(s.pages.empty() ? -1 : s.pages.back() + 1);
    hold(p);
    push_page(s, p);
  }
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  s.pos += static_cast<int>(n);
}

void KvPages::publish(int seq) {
  check(seq);
  if (!cache_on_) return;
  Seq& s = seqs_[seq];
  const size_t full = static_cast<size_t>(s.pos / page_size_);
  while (s.keys.size() < full) {
    const size_t i = s.keys.size();
    const uint64_t parent = i == 0 ? 0 : s.keys[i - 1];
    const std::span<const int> toks(s.tokens.data() + i * page_size_, page_size_);
    const uint64_t key = chain(parent, toks);
    s.keys.push_back(key);
    Page& pg = pages_[s.pages[i]];
    if (pg.cached || map_.count(key)) continue;  // already there (matched, or a twin computed it)
    pg.cached = true;
    pg.key = key;
    pg.parent = parent;
    pg.toks.assign(toks.begin(), toks.end());
    map_[key] = s.pages[i];
  }
}

int KvPages::match_prefix(int seq, std::span<const int> tokens) {
  check(seq);
  Seq& s = seqs_[seq];
  if (s.pos != 0) fail("match_prefix: sequence ", seq, " is not empty");
  stats_.queried_tokens += static_cast<int64_t>(tokens.size());
  if (!cache_on_ || tokens.size() < 2) return 0;
  const size_t max_pages = (tokens.size() - 1) / page_size_;
  uint64_t parent = 0;
  for (size_t i = 0; i < max_pages; ++i) {
    const std::span<const int> toks = tokens.subspan(i * page_size_, page_size_);
    const uint64_t key = chain(parent, toks);
    const auto it = map_.find(key);
    if (it == map_.end()) break;
    const Page& pg = pages_[it->second];
    if (pg.parent != parent || !std::equal(toks.begin(), toks.end(), pg.toks.begin())) break;
    hold(it->second);
    push_page(s, it->second);
    s.keys.push_back(key);
    parent = key;
  }
  s.pos = static_cast<int>(s.pages.size()) * page_size_;
  s.tokens.assign(tokens.begin(), tokens.begin() + s.pos);
  stats_.cached_tokens += s.pos;
  return s.pos;
}

int KvPages::fork(int seq) {
  check(seq);
  const int f = add();
  Seq& d = seqs_[f];
  d = seqs_[seq];
  for (int p : d.pages) hold(p);
  return f;
}

void KvPages::truncate(int seq, int pos) {
  check(seq);
  Seq& s = seqs_[seq];
  if (pos < 0 || pos > s.pos)
    fail("rollback of sequence ", seq, " to position ", pos, " is invalid (it holds ", s.pos,
         " tokens)");
  const size_t keep = static_cast<size_t>((pos + page_size_ - 1) / page_size_);
  while (s.pages.size() > keep) {
    release(s.pages.back());
    s.pages.pop_back();
  }
  s.run = std::min(s.run, static_cast<int>(s.pages.size()));
  s.gather_tried = -1;
  s.tokens.resize(pos);
  s.keys.resize(std::min(s.keys.size(), static_cast<size_t>(pos / page_size_)));
  s.pos = pos;
}

int KvPages::slot(int seq, int pos) const {
  check(seq);
  const Seq& s = seqs_[seq];
  if (pos < 0 || pos >= s.pos) fail("sequence ", seq, " has no position ", pos);
  return s.pages[pos / page_size_] * page_size_ + pos % page_size_;
}

std::span<const int> KvPages::block_table(int seq) const {
  check(seq);
  return seqs_[seq].pages;
}

bool KvPages::consecutive(int seq) const {
  check(seq);
  return seqs_[seq].run == static_cast<int>(seqs_[seq].pages.size());
}

bool KvPages::gather(int seq, int extra, std::vector<PageCopy>& copies) {
  if (consecutive(seq)) return true;
  Seq& s = seqs_[seq];
  const int have = static_cast<int>(s.pages.size());
  if (s.gather_tried == have) return false;
  const int64_t need = (s.pos + std::max<int64_t>(extra, 0) + page_size_ - 1) / page_size_;
  // The longest run of never-used free pages (their successors stay free for growth), first one
  // of that length.
  int best = -1, best_len = 0;
  for (int p = 0; p < n_pages_;) {
    if (free_at_[p] < 0) {
      ++p;
      continue;
    }
    int e = p + 1;
    while (e < n_pages_ && free_at_[e] >= 0) ++e;
    if (e - p > best_len) best = p, best_len = e - p;
    p = e;
  }
  if (best_len < need) {
    s.gather_tried = have;
    return false;
  }
  for (int i = 0; i < have; ++i) {
    const int q = take_page(best + i);
    hold(q);
    copies.push_back({s.pages[i], q});
    release(s.pages[i]);
    s.pages[i] = q;
  }
  s.run = have;
  return true;
}

}  // namespace smolrt
