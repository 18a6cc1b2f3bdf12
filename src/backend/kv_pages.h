// Host bookkeeping of a paged KV pool, shared by every BatchBackend: which pages each sequence
// holds (its block table), its position and tokens, the free list, and the prefix cache. Token
// slot s of the pool is page s / page_size, row s % page_size; position p of sequence q lives in
// slot(q, p). Backends keep the K/V rows themselves ([layer][slot][kv_dim] each), ask this class
// where they go, and copy a page's rows when told to (copy-on-write, below).
//
// Prefix cache: once a step has written a sequence's K/V, its full pages are published under a
// hash chain of their tokens (each page's key covers every token before it too: K/V depend on
// the whole prefix). A new sequence whose prompt begins with published pages takes them instead
// of computing them (match_prefix), sharing them by reference count. Pages nobody holds stay
// cached (their K/V intact) until the pool needs them, least recently used first; they count as
// free. A page several holders share, or one in the cache, is never written: the first write
// into it copies it to a fresh page first (the copies grow() returns, which the backend performs
// before the step's forward pass). fork() makes a sequence that shares all of another's pages
// (n > 1 samples of one prompt).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace smolrt {

// Rows [0, page_size) of page src copied to page dst, in every layer, before a step writes.
struct PageCopy {
  int src = 0, dst = 0;
};

// Prefix-cache counters since the pool was made.
struct PrefixStats {
  int64_t queried_tokens = 0;  // prompt tokens looked up (match_prefix)
  int64_t cached_tokens = 0;   // of those, found in the cache (their prefill skipped)
  int64_t evicted_pages = 0;   // cached pages reused for other contents
  int cached_pages = 0;        // pages in the cache now (held or not)
};

// The sliding-window ring rule, one for both CUDA engines. A layer that attends to the last
// `window` positions keeps a ring of window + step - 1 rows for steps (prompt chunks) of up to
// `step` tokens: a step writes all its K/V rows before its first row reads back window - 1
// positions. A sequence may then roll back ring - window + 1 positions: the next step's first row
// reads the window - 1 positions below the rollback point, which the ring still holds.
inline int64_t sliding_ring_rows(int window, int step) {
  return int64_t(window) + step - 1;
}
inline int64_t sliding_ring_back(int64_t ring, int window) {
  return ring - window + 1;
}

class KvPages {
 public:
  // Throws Error when a count is not positive. prefix_cache false: nothing is published or matched.
  KvPages(int n_pages, int page_size, int max_seqs, int seq_ctx, bool prefix_cache = true);

  int page_size() const { return page_size_; }
  int pages_total() const { return n_pages_; }
  // Pages a sequence may take: never used, or cached with no holder (evicted on demand).
  int pages_free() const { return static_cast<int>(free_.size() + lru_.size()); }
  int max_seqs() const { return max_seqs_; }
  int seq_ctx() const { return seq_ctx_; }
  int live() const { return live_; }  // sequences that exist
  bool prefix_cache() const { return cache_on_; }
  PrefixStats stats() const;

  // The lowest free sequence id; Error when max_seqs sequences exist.
  int add();
  // Drops the sequence's pages (cached ones stay cached); Error for an id that does not exist.
  void remove(int seq);
  bool exists(int seq) const;
  int position(int seq) const;  // tokens the sequence holds
  // Pages the sequence must take to hold n more tokens: new pages, plus one when its last page is
  // shared or cached and the first new token lands in it (the copy-on-write page).
  int pages_needed(int seq, int n) const;
  // Takes the pages for `tokens` and advances the position; appends to `copies` the pages to copy
  // before the step writes (copy-on-write). Error (nothing changed) when the pool lacks the pages
  // or the position would pass seq_ctx.
  void grow(int seq, std::span<const int> tokens, std::vector<PageCopy>& copies);
  // After a step wrote the sequence's new K/V rows: its full pages join the prefix cache.
  void publish(int seq);
  // For a new, empty sequence: takes the cached pages that begin `tokens` (at most
  // tokens.size() - 1 tokens' worth, so the last one is still computed and gives logits) and
  // returns how many tokens they hold (a multiple of page_size; 0 without the cache).
  int match_prefix(int seq, std::span<const int> tokens);
  // A new sequence holding the same pages, position and tokens as seq (Error when max_seqs exist).
  int fork(int seq);
  // Keeps positions [0, pos); pages past them are dropped. Error when pos > position.
  void truncate(int seq, int pos);
  // Pool slot of position pos (< position(seq)) of seq.
  int slot(int seq, int pos) const;
  // The sequence's pages in order (ceil(position / page_size) of them).
  std::span<const int> block_table(int seq) const;
  // Whether the sequence's pages are consecutive (page i = page 0 + i), so a row's slot follows
  // from the first page alone. A sequence grows into the page after its last where that one is
  // free, so a lone sequence's pages stay consecutive while the pool has room after them.
  bool consecutive(int seq) const;
  // Makes the sequence's pages consecutive when they are not (a prefix hit's cached pages, then
  // its own) and the pool has a run of never-used free pages for them and `extra` more tokens: each
  // page moves to the run (appended to `copies`, which the backend performs before the step's
  // forward pass; the old pages are released, cached ones stay cached). For a sequence that runs
  // alone, whose attention is faster over consecutive pages. Returns whether they are consecutive
  // now; a run is looked for once per page count of the sequence (the scan is O(pages_total)).
  bool gather(int seq, int extra, std::vector<PageCopy>& copies);

 private:
  struct Page {
    int ref = 0;                   // sequences holding it
    bool cached = false;           // in map_ (its K/V are those of `key`'s prefix)
    uint64_t key = 0;              // hash chain through this page
    uint64_t parent = 0;           // the key of the page before it (0 for a first page)
    std::vector<int> toks;         // its tokens, compared on a match (hash collisions)
    std::list<int>::iterator lru;  // position in lru_ while cached with ref 0
  };
  struct Seq {
    bool used = false;
    int pos = 0;
    std::vector<int> pages;
    int run = 0;            // pages[0, run) are consecutive
    int gather_tried = -1;  // pages.size() when gather last found no run
    std::vector<int> tokens;
    std::vector<uint64_t> keys;  // hash chain of its published full pages
  };
  void check(int seq) const;
  // A free page (`want` if it is one), else the least recently used cached one.
  int take_page(int want = -1);
  void push_page(Seq& s, int page);  // appends a held page, keeping `run`
  void release(int page);            // one holder fewer
  void hold(int page);               // one holder more (leaves the LRU list if it was there)
  bool writable(int page) const { return pages_[page].ref == 1 && !pages_[page].cached; }
  void uncache(int page);
  uint64_t chain(uint64_t parent, std::span<const int> toks) const;

  int n_pages_, page_size_, max_seqs_, seq_ctx_;
  bool cache_on_;
  int live_ = 0;
  std::vector<Page> pages_;
  std::vector<int> free_;     // pages never cached and unheld; taken from the back
  std::vector<int> free_at_;  // each page's index in free_, or -1
  std::list<int> lru_;        // cached pages nobody holds, least recently released first
  std::unordered_map<uint64_t, int> map_;
  std::vector<Seq> seqs_;
  PrefixStats stats_;
};

}  // namespace smolrt
