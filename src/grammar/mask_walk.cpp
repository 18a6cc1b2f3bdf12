// Mask computation: one depth-first walk of the token trie in preorder, carrying the
// configuration after each prefix; a prefix no thread survives skips its whole subtree.
#include <algorithm>

#include "grammar/closure.h"

namespace smolrt::grammar::detail {

namespace {

// Nodes of the matcher (read-only, ids below base) plus nodes made during the walk; those are
// truncated as the walk backtracks, and deduplicated within the current trie level.
struct WalkStore {
  std::span<const Node> base;
  std::vector<Node>* scratch;
  size_t level_base = 0;

  Node at(int32_t id) const {
    const auto i = static_cast<size_t>(id);
    return i < base.size() ? base[i] : (*scratch)[i - base.size()];
  }
  int32_t add(int32_t state, int32_t parent) {
    const int32_t depth = parent < 0 ? 1 : at(parent).depth + 1;
    if (depth > GrammarMatcher::kMaxStackDepth) return -1;
    for (size_t i = level_base; i < scratch->size(); ++i) {
      const Node& n = (*scratch)[i];
      if (n.state == state && n.parent == parent) return static_cast<int32_t>(base.size() + i);
    }
    scratch->push_back({state, parent, depth});
    return static_cast<int32_t>(base.size() + scratch->size() - 1);
  }
};

struct Level {
  size_t begin, end, nodes;
};

struct Scratch {
  std::vector<Thread> buf, work, seen;
  std::vector<Node> nodes;
  std::vector<Level> levels;
};

}  // namespace

void compute_mask(const Automaton& a, const TokenVocab& vocab, std::span<const Thread> threads,
                  std::span<const Node> nodes, bool can_end, uint64_t* out) {
  std::fill(out, out + vocab.mask_words(), 0);
  if (can_end) {
    for (int id : vocab.eog_ids()) out[id >> 6] |= uint64_t{1} << (id & 63);
  }
  if (threads.empty()) return;
  thread_local Scratch sc;
  const TokenVocab::Trie& trie = vocab.trie();
  sc.buf.assign(threads.begin(), threads.end());
  sc.nodes.clear();
  sc.levels.resize(static_cast<size_t>(trie.max_depth) + 1);
  sc.levels[0] = {0, sc.buf.size(), 0};
  WalkStore store{nodes, &sc.nodes};
  const auto nc = static_cast<size_t>(a.n_classes);
  const size_t n = trie.byte.size();
  for (size_t i = 0; i < n;) {
    const size_t d = trie.depth[i];
    const Level lv = sc.levels[d - 1];
    sc.buf.resize(lv.end);
    sc.nodes.resize(lv.nodes);
    store.level_base = lv.nodes;
    const size_t begin = sc.buf.size();
    const size_t c = a.byte_class[trie.byte[i]];
    bool ends = false;  // the prefix completes the grammar
    for (size_t k = lv.begin; k < lv.end; ++k) {
      const Thread t = sc.buf[k];
      const int32_t s2 = a.next[static_cast<size_t>(t.state) * nc + c];
      if (s2 < 0) continue;
      if (a.flags[static_cast<size_t>(s2)] & kPlain) {
        push_unique(sc.buf, begin, {s2, t.parent});
      } else {
        ends = close_into(a, store, {s2, t.parent}, sc.buf, begin, sc.work, sc.seen) || ends;
      }
    }
    const bool alive = sc.buf.size() > begin;
    if (alive || ends) {
      for (int32_t k = trie.tok_begin[i]; k < trie.tok_begin[i + 1]; ++k) {
        const int32_t id = trie.tokens[static_cast<size_t>(k)];
        out[id >> 6] |= uint64_t{1} << (id & 63);
      }
    }
    if (!alive) {  // nothing can follow this prefix: skip the longer tokens under it
      i = static_cast<size_t>(trie.skip[i]);
      continue;
    }
    sc.levels[d] = {begin, sc.buf.size(), sc.nodes.size()};
    ++i;
  }
}

}  // namespace smolrt::grammar::detail
