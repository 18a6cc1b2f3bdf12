// Token-level matching of a compiled grammar: which tokens may come next (a bitset over the
// vocabulary, cached per automaton configuration) and advancing by the sampled token.
//
//   auto vocab = std::make_shared<TokenVocab>(tokenizer);             // once per model
//   auto g = compile(json_schema_grammar(schema), vocab);             // or via GrammarCache
//   GrammarMatcher m(g);                                              // once per sequence
//   loop: id = m.mask_id() (or bits = m.mask()); sample within it; m.accept_token(token);
//         stop when m.is_done() (or the sampled token was an end-of-generation one).
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/token_vocab.h"

namespace smolrt::grammar {

namespace detail {

struct Thread {
  int32_t state;
  int32_t parent;  // the stack below: a node index, -1 = empty (the root rule)
  bool operator==(const Thread&) const = default;
};

struct Node {
  int32_t state;  // where the caller resumes
  int32_t parent;
  int32_t depth;
};

struct KeyHash {
  size_t operator()(const std::vector<int32_t>& v) const;
};

}  // namespace detail

// A grammar compiled for one vocabulary; immutable but for its mask cache; share it (shared_ptr)
// between every sequence using the grammar, from any thread.
class CompiledGrammar {
 public:
  CompiledGrammar(detail::Automaton a, std::shared_ptr<const TokenVocab> vocab);

  const TokenVocab& vocab() const { return *vocab_; }
  const std::shared_ptr<const TokenVocab>& vocab_ptr() const { return vocab_; }
  const detail::Automaton& automaton() const { return a_; }
  int n_states() const { return a_.n_states; }
  // Configurations whose mask id is cached (for statistics).
  size_t cached_configs() const;

  // The cached mask id of a configuration key, or -2 when not cached.
  int32_t find_mask(const std::vector<int32_t>& key) const;
  void store_mask(const std::vector<int32_t>& key, int32_t id) const;

 private:
  detail::Automaton a_;
  std::shared_ptr<const TokenVocab> vocab_;
  mutable std::shared_mutex mu_;
  mutable std::unordered_map<std::vector<int32_t>, int32_t, detail::KeyHash> masks_;
};

// Throws GrammarError (see build_automaton).
std::shared_ptr<const CompiledGrammar> compile(const Grammar& g,
                                               std::shared_ptr<const TokenVocab> vocab);

// One sequence's position in a grammar. Not thread-safe (one per sequence); cheap to copy.
// Nesting is limited to kMaxStackDepth rule calls: text after which the match could only finish
// by nesting deeper is rejected (and masked), so every position kept can still be completed
// within the limit (no dead ends). Past the parse or work limits of closure.h (a grammar too
// ambiguous), accept_*, mask_id and mask throw GrammarError "grammar too ambiguous" and the
// position is unchanged.
class GrammarMatcher {
 public:
  static constexpr int kMaxStackDepth = detail::kMaxStackDepth;

  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> g);

  // Advances by one token; false (and no change) when the grammar does not allow it. An
  // end-of-generation token is allowed exactly when can_end(), and finishes the match.
  bool accept_token(int id);
  // Advances by raw text (all or nothing); false when the grammar does not allow it.
  bool accept_text(std::string_view text);
  // Undoes the last n accepted tokens/texts (n <= accepted()); Error beyond.
  void rollback(int n);
  void reset();
  int accepted() const { return static_cast<int>(history_.size()); }

  // The text so far is a complete match (an end-of-generation token is allowed now).
  bool can_end() const { return can_end_; }
  // Nothing but the end may follow (or an end-of-generation token was accepted).
  bool is_done() const { return can_end_ && threads_.empty(); }

  // The tokens allowed next: the id of the mask in vocab()'s store (-1 when the store is full),
  // and its bits (vocab().mask_words() words; valid until the next call on this matcher).
  int32_t mask_id();
  const uint64_t* mask();
  // A shortest text that completes the match within the nesting limit ("" when can_end()).
  std::string shortest_completion() const;

  const CompiledGrammar& grammar() const { return *g_; }

 private:
  struct Snapshot {
    size_t threads_at, n_threads, n_nodes;
    bool can_end;
  };

  std::shared_ptr<const CompiledGrammar> g_;
  std::vector<detail::Thread> threads_;  // sorted; each can consume a byte
  bool can_end_ = false;
  std::vector<detail::Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;  // (state, parent) -> node: hash-consing
  std::vector<Snapshot> history_;
  std::vector<detail::Thread> saved_threads_;  // the threads before each accepted step

  // Mask state: the id (or -2 = unknown) for the current position, and scratch buffers.
  int32_t mask_id_ = -2;
  std::vector<uint64_t> bits_;
  std::vector<int32_t> key_;

  void start();
  bool advance(std::string_view bytes);
  void build_key();
  void compute_bits();
  void push_snapshot(size_t n_nodes);
  void truncate_nodes(size_t n);
};

}  // namespace smolrt::grammar
