// A tokenizer's vocabulary as the grammar matcher sees it; build one per served model and share
// it (thread-safe) between every compiled grammar and matcher:
//   - each token's bytes as they appear mid-text (control, unknown and unused tokens have none
//     and never match grammar text; end-of-generation tokens are kept apart: they are allowed
//     exactly when the grammar can end),
//   - a byte trie of those tokens in preorder (mask computation walks it once per automaton
//     configuration, skipping every subtree whose prefix the grammar rejects),
//   - the store of distinct token masks: each gets a small stable id (0, 1, 2, ...) for the life
//     of the vocab, equal masks share one, so a device-side table of masks can be indexed by id.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace smolrt::grammar {

class TokenVocab {
 public:
  // max_masks: how many distinct masks the store keeps (0 = as many as fit in 128 MiB); when it
  // is full, new masks get no id (GrammarMatcher::mask_id returns -1 and mask() still works).
  explicit TokenVocab(const Tokenizer& tok, size_t max_masks = 0);
  TokenVocab(const TokenVocab&) = delete;
  TokenVocab& operator=(const TokenVocab&) = delete;

  int n_vocab() const { return static_cast<int>(bytes_.size()); }
  // uint64 words per mask: bit (id % 64) of word (id / 64) is token id.
  int mask_words() const { return (n_vocab() + 63) / 64; }
  // The token's bytes mid-text ("" for control/unknown/unused and end-of-generation tokens).
  const std::string& token_bytes(int id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_eog(int id) const { return eog_[static_cast<size_t>(id)]; }
  const std::vector<int>& eog_ids() const { return eog_ids_; }

  // The token trie in preorder, one packed node per entry (the mask walk streams through it).
  // Node i spells its parent's bytes plus `byte`; `depth` is its length (1 = a child of the
  // root); `skip` is the index just past its subtree; the tokens spelling exactly its bytes are
  // tokens[nodes[i].tok_begin .. nodes[i + 1].tok_begin). A last sentinel node (depth 0) ends it.
  struct TrieNode {
    int32_t skip;
    int32_t tok_begin;
    uint16_t depth;
    uint8_t byte;
  };
  struct Trie {
    std::vector<TrieNode> nodes;  // n_nodes() + 1 (the sentinel)
    std::vector<int32_t> tokens;
    int max_depth = 0;
    size_t n_nodes() const { return nodes.size() - 1; }
  };
  const Trie& trie() const { return trie_; }

  // The id of a mask with these bits (mask_words() words), adding it when new; -1 when the store
  // is full. Thread-safe.
  int32_t intern_mask(std::span<const uint64_t> bits) const;
  // The bits of a mask id returned by intern_mask (valid for the life of the vocab).
  const uint64_t* mask(int32_t id) const { return slots_[static_cast<size_t>(id)].get(); }
  int32_t n_masks() const { return count_.load(std::memory_order_acquire); }
  size_t max_masks() const { return slots_.size(); }

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> eog_;
  std::vector<int> eog_ids_;
  Trie trie_;

  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<uint64_t[]>> slots_;  // sized once: never reallocates
  mutable std::atomic<int32_t> count_{0};
  mutable std::unordered_multimap<uint64_t, int32_t> by_hash_;
};

}  // namespace smolrt::grammar
