// The pushdown automaton's step machinery (internal to src/grammar/), shared by the matcher
// (advancing by a token's bytes) and the mask computation (walking the token trie).
//
// A configuration is a set of threads (state, stack); stacks are nodes in a store, linked to
// their parents, hash-consed so that equal stacks have equal ids. After a byte moves a thread to
// a new state, its closure adds what that state implies without consuming input: entering each
// called rule (pushing the return state, or nothing when the return state could only end the
// caller: a tail call), and returning to the caller when the state may end its rule. Only
// threads that can consume a byte, and can still finish within the nesting limit (fits below),
// are kept; reaching the end of the root rule sets can_end.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/matcher.h"

namespace smolrt::grammar::detail {

// Threads (distinct parses) per configuration at most: only highly ambiguous grammars get near
// it. Past it is a GrammarError, like the work limit below, never a silent drop: the threads must
// be every parse of the text. Dropping the extra threads (as once done, alike in the matcher and
// the mask walk) kept masks equal to the matcher but refused text the grammar allows, and broke
// shortest_completion(): it plans on one kept thread, whose continuation a later byte can drop
// once other parses fill the cap, so its text did not complete the match (fuzz_grammar: root ::=
// a "2." with a ::= "" | "x" a a | . a a "  ", after "zxxx." 306 threads, then over 512 within
// the completion "    2.").
inline constexpr size_t kMaxThreads = 512;

// The work one mask walk or one matcher step may take, in closure items plus the duplicate checks
// they cost. A grammar ambiguous enough to need more (nullable rules whose stacks multiply with
// every byte, e.g. a ::= "" | "x" a a | . a a) would stall the server's scheduler for seconds a
// token; the request is refused with a GrammarError instead.
inline constexpr uint64_t kMaxStepWork = uint64_t{1} << 24;  // ~500x what the tests' grammars take

struct Work {
  uint64_t left = kMaxStepWork;
  void spend(uint64_t n) {
    if (n > left) too_ambiguous();
    left -= n;
  }
  [[noreturn]] static void too_ambiguous();
  [[noreturn]] static void too_many_threads();
};

inline void push_unique(std::vector<Thread>& out, size_t begin, Thread t, Work& w) {
  w.spend(out.size() - begin + 1);
  for (size_t i = begin; i < out.size(); ++i)
    if (out[i] == t) return;
  if (out.size() - begin >= kMaxThreads) Work::too_many_threads();
  out.push_back(t);
}

// The calls that may still nest above a thread whose stack is `parent` (a node id, -1 = empty).
template <class Store>
int32_t room_above(const Store& store, int32_t parent) {
  return kMaxStackDepth - (parent < 0 ? 0 : store.at(parent).depth);
}

// Whether a thread in `state` above `parent` can still finish within the nesting limit (every
// frame below it can: a node is made only for a return state that can). Threads that cannot are
// never made, alike in the matcher and the mask walk: they would be dead ends, allowing text
// after which nothing is allowed (or a shortest completion that nests too deep).
template <class Store>
bool fits(const Automaton& a, const Store& store, int32_t state, int32_t parent) {
  const uint16_t need = a.min_depth[static_cast<size_t>(state)];
  return need == 0 || need <= room_above(store, parent);
}

// Store: int32_t add(int32_t state, int32_t parent) (the node id) and Node at(int32_t id).
// Appends seed's closure to out (deduplicated from out_begin) and returns whether the root rule
// can end there; the seed must fit (above). work/seen: scratch; w: the step's work left.
template <class Store>
bool close_into(const Automaton& a, Store& store, Thread seed, std::vector<Thread>& out,
                size_t out_begin, std::vector<Thread>& work, std::vector<Thread>& seen, Work& w) {
  bool can_end = false;
  work.clear();
  seen.clear();
  work.push_back(seed);
  while (!work.empty()) {
    const Thread t = work.back();
    work.pop_back();
    w.spend(1 + seen.size());
    bool was_seen = false;
    for (const Thread& s : seen) was_seen = was_seen || s == t;
    if (was_seen) continue;
    seen.push_back(t);
    const auto ts = static_cast<size_t>(t.state);
    const uint8_t f = a.flags[ts];
    if (f & kHasBytes) push_unique(out, out_begin, t, w);
    if (f & kHasCalls) {
      const int32_t room = room_above(store, t.parent);
      for (int32_t k = a.call_begin[ts]; k < a.call_begin[ts + 1]; ++k) {
        const Automaton::Call c = a.calls[static_cast<size_t>(k)];
        const int32_t start = a.rule_start[static_cast<size_t>(c.rule)];
        const int32_t need = a.min_depth[static_cast<size_t>(start)];
        int32_t cont = t.parent;
        if (a.flags[static_cast<size_t>(c.ret)] & kSinkFinal) {  // a tail call: no frame
          if (need > room) continue;
        } else {  // a frame for c.ret: the callee nests one deeper, then c.ret must fit
          if (need >= room || a.min_depth[static_cast<size_t>(c.ret)] > room) continue;
          cont = store.add(c.ret, t.parent);
        }
        work.push_back({start, cont});
      }
    }
    if (f & kAccept) {
      if (t.parent < 0) {
        can_end = true;
      } else {
        const Node n = store.at(t.parent);
        work.push_back({n.state, n.parent});
      }
    }
  }
  return can_end;
}

// (state, parent) -> node id of a store's nodes: stacks are hash-consed.
using NodeIds = std::unordered_map<uint64_t, int32_t>;
inline uint64_t node_key(int32_t state, int32_t parent) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) |
         static_cast<uint32_t>(parent);
}

// The allowed-token bits (vocab.mask_words() words) of the configuration `threads` over the
// matcher's `nodes` (and their ids): a token is allowed when its bytes keep some thread alive;
// end-of-generation tokens when can_end.
void compute_mask(const Automaton& a, const TokenVocab& vocab, std::span<const Thread> threads,
                  std::span<const Node> nodes, const NodeIds& ids, bool can_end, uint64_t* out);

}  // namespace smolrt::grammar::detail
