// Host bookkeeping of a paged KV pool, shared by every BatchBackend: which pages each sequence
// holds (its block table), its position, and the free list. Token slot s of the pool is page
// s / page_size, row s % page_size; position p of sequence q lives in slot(q, p). Backends keep
// the K/V rows themselves ([layer][slot][kv_dim] each) and ask this class where they go.
#pragma once

#include <span>
#include <vector>

namespace smolrt {

class KvPages {
 public:
  // Throws Error when a count is not positive.
  KvPages(int n_pages, int page_size, int max_seqs, int seq_ctx);

  int page_size() const { return page_size_; }
  int pages_total() const { return n_pages_; }
  int pages_free() const { return static_cast<int>(free_.size()); }
  int max_seqs() const { return max_seqs_; }
  int seq_ctx() const { return seq_ctx_; }
  int live() const { return live_; }  // sequences that exist

  // The lowest free sequence id; Error when max_seqs sequences exist.
  int add();
  // Returns the sequence's pages; Error for an id that does not exist.
  void remove(int seq);
  bool exists(int seq) const;
  int position(int seq) const;  // tokens the sequence holds
  // Pages the sequence must take to hold n more tokens.
  int pages_needed(int seq, int n) const;
  // Takes the pages for n more tokens and advances the position; Error (nothing changed) when
  // the pool lacks them or the position would pass seq_ctx.
  void grow(int seq, int n);
  // Keeps positions [0, pos); pages past them go back to the pool. Error when pos > position.
  void truncate(int seq, int pos);
  // Pool slot of position pos (< position(seq)) of seq.
  int slot(int seq, int pos) const;
  // The sequence's pages in order (ceil(position / page_size) of them).
  std::span<const int> block_table(int seq) const;

 private:
  struct Seq {
    bool used = false;
    int pos = 0;
    std::vector<int> pages;
  };
  void check(int seq) const;
  int n_pages_, page_size_, max_seqs_, seq_ctx_;
  int live_ = 0;
  std::vector<int> free_;  // free page ids; taken from the back
  std::vector<Seq> seqs_;
};

}  // namespace smolrt
