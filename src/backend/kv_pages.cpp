#include "backend/kv_pages.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace smolrt {

KvPages::KvPages(int n_pages, int page_size, int max_seqs, int seq_ctx)
    : n_pages_(n_pages), page_size_(page_size), max_seqs_(max_seqs), seq_ctx_(seq_ctx) {
  if (n_pages <= 0 || page_size <= 0 || max_seqs <= 0 || seq_ctx <= 0)
    fail("KV pool: pages ", n_pages, ", page size ", page_size, ", sequences ", max_seqs,
         ", context ", seq_ctx, " must all be positive");
  // slot() returns an int.
  if (int64_t(n_pages) * page_size > INT32_MAX)
    fail("KV pool: ", n_pages, " pages of ", page_size, " tokens exceed 2^31 slots");
  free_.reserve(n_pages);
  for (int p = n_pages - 1; p >= 0; --p) free_.push_back(p);  // page 0 is taken first
  seqs_.resize(max_seqs);
}

void KvPages::check(int seq) const {
  if (!exists(seq)) fail("sequence ", seq, " does not exist");
}

bool KvPages::exists(int seq) const {
  return seq >= 0 && seq < max_seqs_ && seqs_[seq].used;
}

int KvPages::add() {
  for (int i = 0; i < max_seqs_; ++i) {
    if (!seqs_[i].used) {
      seqs_[i] = Seq{true, 0, {}};
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
  return want > have ? static_cast<int>(std::min<int64_t>(want - have, INT32_MAX)) : 0;
}

void KvPages::grow(int seq, int n) {
  check(seq);
  if (n < 0) fail("KV pool: cannot grow by ", n, " tokens");
  Seq& s = seqs_[seq];
  if (s.pos + static_cast<long>(n) > seq_ctx_)
    fail("sequence ", seq, " would hold ", s.pos + static_cast<long>(n),
         " tokens, past its context of ", seq_ctx_);
  const int need = pages_needed(seq, n);
  if (need > pages_free())
    fail("the KV pool has ", pages_free(), " free pages; ", need, " are needed");
  for (int i = 0; i < need; ++i) {
    s.pages.push_back(free_.back());
    free_.pop_back();
  }
  s.pos += n;
}

void KvPages::truncate(int seq, int pos) {
  check(seq);
  Seq& s = seqs_[seq];
  if (pos < 0 || pos > s.pos)
    fail("rollback of sequence ", seq, " to position ", pos, " is invalid (it holds ", s.pos,
         " tokens)");
  const size_t keep = static_cast<size_t>((pos + page_size_ - 1) / page_size_);
  while (s.pages.size() > keep) {
    free_.push_back(s.pages.back());
    s.pages.pop_back();
  }
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

}  // namespace smolrt
