// Mask computation: one depth-first walk of the token trie in preorder, carrying the
// configuration after each prefix; a prefix no thread survives skips its whole subtree.
#include <algorithm>

#include "grammar/closure.h"

namespace smolrt::grammar::detail {

void Work::too_ambiguous() {
  throw GrammarError(cat("grammar too ambiguous: a token's mask would take over ", kMaxStepWork,
                         " automaton steps (rules that can match nothing, called from each other, "
                         "multiply with every byte); simplify the grammar"));
}

void Work::too_many_threads() {
  throw GrammarError(cat("grammar too ambiguous: over ", kMaxThreads,
                         " parses of the text at once (rules that can match nothing, called from "
                         "each other, multiply with every byte); simplify the grammar"));
}

namespace {

// Nodes of the matcher (read-only, ids below base) plus nodes made on the walk's current path
// (truncated as it backtracks), hash-consed across both exactly as the matcher's store would.
struct WalkStore {
  std::span<const Node> base;
  const NodeIds* base_ids;
  std::vector<Node>* scratch;

  Node at(int32_t id) const {
    const auto i = static_cast<size_t>(id);
    return i < base.size() ? base[i] : (*scratch)[i - base.size()];
  }
  int32_t add(int32_t state, int32_t parent) {
    const int32_t depth = parent < 0 ? 1 : at(parent).depth + 1;
    if (parent < static_cast<int32_t>(base.size())) {
      if (auto it = base_ids->find(node_key(state, parent)); it != base_ids->end())
        return it->second;
    }
    for (size_t i = 0; i < scratch->size(); ++i) {
      const Node& n = (*scratch)[i];
      if (n.state == state && n.parent == parent) return static_cast<int32_t>(base.size() + i);
    }
    scratch->push_back({state, parent, depth});
    return static_cast<int32_t>(base.size() + scratch->size() - 1);
  }
};

// The configuration after a trie node's prefix: one thread kept in the level itself (the common
// case, stepped without touching the buffer), or the threads buf[begin, end). `end` is also
// where the buffer is cut back to for the level's children; `nodes` the scratch nodes in use.
struct Level {
  int32_t state;  // >= 0: the one thread (state, parent)
  int32_t parent;
  int32_t begin;  // one thread: its room_above(parent) instead (a 20-byte level walks faster)
  uint32_t end, nodes;
};

struct Scratch {
  std::vector<Thread> buf, work, seen;
  std::vector<Node> nodes;
  std::vector<Level> levels;
};

}  // namespace

void compute_mask(const Automaton& a, const TokenVocab& vocab, std::span<const Thread> threads,
                  std::span<const Node> nodes, const NodeIds& ids, bool can_end, uint64_t* out) {
  std::fill(out, out + vocab.mask_words(), 0);
  if (can_end) {
    for (int id : vocab.eog_ids()) out[id >> 6] |= uint64_t{1} << (id & 63);
  }
  if (threads.empty()) return;
  Work w;
  thread_local Scratch sc;
  const TokenVocab::Trie& trie = vocab.trie();
  const TokenVocab::TrieNode* tn = trie.nodes.data();
  const int32_t* tokens = trie.tokens.data();
  sc.buf.assign(threads.begin(), threads.end());
  sc.nodes.clear();
  sc.levels.resize(static_cast<size_t>(trie.max_depth) + 1);
  const auto n0 = static_cast<uint32_t>(threads.size());
  WalkStore store{nodes, &ids, &sc.nodes};
  sc.levels[0] = threads.size() == 1 ? Level{threads[0].state, threads[0].parent,
                                             room_above(store, threads[0].parent), n0, 0}
                                     : Level{-1, -1, 0, n0, 0};
  const auto nc = static_cast<size_t>(a.n_classes);
  const int32_t* next = a.next.data();
  const uint8_t* flags = a.flags.data();
  const uint16_t* min_depth = a.min_depth.data();
  const int32_t fits_anywhere = a.max_min_depth;  // a level with this much room skips the check
  auto set_tokens = [&](size_t i) {
    for (int32_t k = tn[i].tok_begin; k < tn[i + 1].tok_begin; ++k)
      out[tokens[k] >> 6] |= uint64_t{1} << (tokens[k] & 63);
  };
  const size_t n = trie.n_nodes();
  for (size_t i = 0; i < n;) {
    const TokenVocab::TrieNode node = tn[i];
    const Level lv = sc.levels[node.depth - 1u];
    const size_t c = a.byte_class[node.byte];
    int32_t s2 = -1;
    if (lv.state >= 0) {  // the fast path: one thread, a plain step
      s2 = next[static_cast<size_t>(lv.state) * nc + c];
      const int32_t room = lv.begin;
      if (s2 < 0 || (room < fits_anywhere && min_depth[s2] > room)) {  // none, or too deep
        i = static_cast<size_t>(node.skip);
        continue;
      }
      if (flags[s2] & kPlain) {
        set_tokens(i);
        sc.levels[node.depth] = {s2, lv.parent, room, lv.end, lv.nodes};
        ++i;
        continue;
      }
    }
    sc.buf.resize(lv.end);
    sc.nodes.resize(lv.nodes);
    const size_t begin = sc.buf.size();
    bool ends = false;  // the prefix completes the grammar
    if (lv.state >= 0) {
      ends = close_into(a, store, {s2, lv.parent}, sc.buf, begin, sc.work, sc.seen, w);
    } else {
      for (size_t k = static_cast<size_t>(lv.begin); k < lv.end; ++k) {
        const Thread t = sc.buf[k];
        const int32_t to = next[static_cast<size_t>(t.state) * nc + c];
        if (to < 0 || !fits(a, store, to, t.parent)) continue;
        if (flags[to] & kPlain) {
          push_unique(sc.buf, begin, {to, t.parent}, w);
        } else {
          ends = close_into(a, store, {to, t.parent}, sc.buf, begin, sc.work, sc.seen, w) || ends;
        }
      }
    }
    const size_t alive = sc.buf.size() - begin;
    if (alive || ends) set_tokens(i);
    if (!alive) {  // nothing can follow this prefix: skip the longer tokens under it
      i = static_cast<size_t>(node.skip);
      continue;
    }
    const auto b = static_cast<uint32_t>(begin), e = static_cast<uint32_t>(sc.buf.size());
    const auto used = static_cast<uint32_t>(sc.nodes.size());
    const Thread one = sc.buf[begin];
    sc.levels[node.depth] =
        alive == 1 ? Level{one.state, one.parent, room_above(store, one.parent), b, used}
                   : Level{-1, -1, static_cast<int32_t>(b), e, used};
    ++i;
  }
}

}  // namespace smolrt::grammar::detail
