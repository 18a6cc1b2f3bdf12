// The compiled form of a grammar (internal to src/grammar/): a recursive transition network of
// byte-level DFAs. Each rule that is called (not inlined) has a start state; a state has byte
// transitions (through byte equivalence classes), call edges (enter rule R, resume at `ret` when
// it ends) and an accept flag (its rule may end here). Non-recursive rules small enough are
// inlined into their callers, so a JSON-schema grammar without recursion is mostly one DFA and
// its matcher stack stays one frame deep. Every state left can reach its rule's end: transitions
// into states that cannot are removed at build time, so a matcher never walks into a dead end.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace smolrt::grammar::detail {

enum StateFlag : uint8_t {
  kAccept = 1,     // the state's rule may end here
  kHasBytes = 2,   // some byte transition
  kHasCalls = 4,   // some call edge
  kPlain = 8,      // kHasBytes only: a thread here needs no closure work
  kSinkFinal = 16  // kAccept only: returning here is returning from the caller (tail call)
};

struct Automaton {
  struct Call {
    int32_t rule;  // the rule entered
    int32_t ret;   // the state to resume at when it ends
  };

  int n_states = 0;
  int n_classes = 0;
  std::array<uint8_t, 256> byte_class{};
  std::vector<uint8_t> class_byte;  // a byte of each class (for shortest completions)
  std::vector<int32_t> next;        // [state * n_classes + class] -> state, -1 = none
  std::vector<int32_t> call_begin;  // n_states + 1 offsets into calls
  std::vector<Call> calls;
  std::vector<uint8_t> flags;  // StateFlag bits per state
  std::vector<int64_t> dist;   // fewest bytes from the state to its rule's end
  // The order in which dist became final: an edge achieving dist[s] whose targets rank below s
  // is a step of a shortest completion (following such steps always terminates).
  std::vector<int32_t> rank;
  // Fewest rule calls that must nest above a state to finish its rule (kMaxStackDepth + 1: more
  // than the limit allows). A thread at stack depth d is kept only while d + min_depth[state] <=
  // kMaxStackDepth (and every frame below it likewise), so every thread can still finish.
  std::vector<uint16_t> min_depth;
  int32_t max_min_depth = 0;  // over the live states: a thread with this much room fits anywhere
  // The calls nesting above a state along the shortest completion (the fewest among the shortest
  // steps of `rank`; kMaxStackDepth + 1 when more): where it does not fit, shortest_completion()
  // plans within the nesting left (bounded_distances).
  std::vector<uint16_t> dist_depth;
  std::vector<int32_t> rule_start;  // per grammar rule: its start state, -1 = never called
  std::vector<std::string> rule_names;
  int root_start = -1;

  int32_t step(int32_t state, uint8_t byte) const {
    return next[static_cast<size_t>(state) * static_cast<size_t>(n_classes) + byte_class[byte]];
  }
};

// Rule calls nest at most this deep (GrammarMatcher::kMaxStackDepth).
inline constexpr int kMaxStackDepth = 256;

// Limits: compiling stops with GrammarError beyond these (a request cannot make the server build
// an automaton of unbounded size).
inline constexpr int kMaxNfaStates = 400000;
inline constexpr int kMaxDfaStates = 60000;

// Throws GrammarError for left recursion (a rule reaching itself before consuming any text), a
// root that matches no finite text or none within kMaxStackDepth nested calls, or the size limits
// above.
Automaton build_automaton(const Grammar& g);

// dist and rank as in Automaton, for finishing with at most k calls nesting above each state:
// `below` holds the distances for k - 1 (empty for k = 0: no call may nest; a tail call nests
// nothing). Values from kUnreachable on mean "cannot within k".
inline constexpr int64_t kUnreachable = INT64_MAX / 4;
void bounded_distances(const Automaton& a, std::span<const int64_t> below,
                       std::vector<int64_t>& dist, std::vector<int32_t>& rank);

}  // namespace smolrt::grammar::detail
