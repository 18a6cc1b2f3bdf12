#include "tokenizer/bpe.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace smolrt {

BpeModel::BpeModel(const std::vector<std::string>& merges, const PieceMap& piece_to_id, int unk,
                   bool ignore_merges)
    : unk_(unk) {
  if (ignore_merges) whole_ = piece_to_id;
  // Vocabularies trained on valid UTF-8 (StarCoder, SmolLM) lack the bytes that never occur in
  // it (0xC0, 0xC1, 0xF5..0xFF); those bytes, only found in invalid input, become `unk`.
  for (int b = 0; b < 256; ++b) {
    auto it = piece_to_id.find(unicode::byte_to_utf8(static_cast<uint8_t>(b)));
    byte_id_[b] = it == piece_to_id.end() ? -1 : it->second;
  }
  merges_.reserve(merges.size() * 2);
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ', 1);  // a piece may itself start with a space only in raw vocabs
    if (sp == std::string::npos || sp + 1 >= m.size()) {
      fail("tokenizer.ggml.merges[", r, "] = '", m,
           "' is not of the form 'left right'; the merges array is corrupt");
    }
    const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
    auto a = piece_to_id.find(left), b = piece_to_id.find(right);
    joined.assign(left);
    joined.append(right);
    auto ab = piece_to_id.find(joined);
    if (a == piece_to_id.end() || b == piece_to_id.end() || ab == piece_to_id.end()) {
      fail("tokenizer.ggml.merges[", r, "] = '", m, "' names a piece ('",
           a == piece_to_id.end()   ? left
           : b == piece_to_id.end() ? right
                                    : joined,
           "') missing from tokenizer.ggml.tokens; the vocab and merges do not belong together");
    }
    // The first (lowest-rank) occurrence of a pair wins, as in Hugging Face's BPE.
    merges_.emplace(key(a->second, b->second),
                    Merge{static_cast<int32_t>(r), static_cast<int32_t>(ab->second)});
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int>& out) const {
  if (word.size() == 1) {  // no merge possible
    const int id = byte_id_[static_cast<unsigned char>(word[0])];
    if (id >= 0 || unk_ >= 0) out.push_back(id >= 0 ? id : unk_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  if (const int id = whole_word(word); id >= 0) {
    out.push_back(id);
  } else {
    merge_word(word, out);
  }
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= kCacheMax) cache_.clear();
  cache_.emplace(std::string(word),
                 std::vector<int>(out.begin() + static_cast<long>(start), out.end()));
}

int BpeModel::whole_word(std::string_view word) const {
  if (whole_.empty()) return -1;
  std::string piece;  // the word in the vocab's byte-level spelling
  for (const char c : word) piece += unicode::byte_to_utf8(static_cast<uint8_t>(c));
  const auto it = whole_.find(piece);
  return it == whole_.end() ? -1 : it->second;
}

void BpeModel::merge_word(std::string_view word, std::vector<int>& out) const {
  struct Sym {
    int id, prev, next;
  };
  struct Cand {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  // Initial symbols: one per byte. A byte without a token becomes unk, or is dropped before
  // merging (so its neighbours may merge), as Hugging Face's BPE does.
  // Scratch reused across words (no allocation per word on the hot path).
  thread_local std::vector<Sym> sym;
  thread_local std::vector<Cand> heap;  // min-heap on (rank, pos)
  sym.clear();
  heap.clear();
  for (unsigned char b : word) {
    const int id = byte_id_[b] >= 0 ? byte_id_[b] : unk_;
    if (id < 0) continue;
    const int i = static_cast<int>(sym.size());
    sym.push_back({id, i - 1, -1});
    if (i > 0) sym[i - 1].next = i;
  }
  const int n = static_cast<int>(sym.size());
  if (n == 0) return;
  auto consider = [&](int l) {
    if (l < 0 || sym[l].next < 0) return;
    auto it = merges_.find(key(sym[l].id, sym[sym[l].next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, l, sym[l].id, sym[sym[l].next].id, it->second.merged});
    std::push_heap(heap.begin(), heap.end(), std::greater<Cand>());
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& l = sym[c.pos];
    // Stale entries: the left symbol merged away or changed, or its neighbour changed.
    if (l.id != c.left || l.next < 0 || sym[l.next].id != c.right) continue;
    const int r = l.next;
    l.id = c.merged;
    l.next = sym[r].next;
    if (l.next >= 0) sym[l.next].prev = c.pos;
    sym[r].id = -1;
    consider(l.prev);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

}  // namespace smolrt
