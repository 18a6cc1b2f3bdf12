// Byte-level BPE (GPT-2 style): a word's bytes map to the vocab's byte tokens, then adjacent pairs
// merge in merge-rank order (lowest rank first, leftmost first on ties), like Hugging Face's BPE
// model. Results are cached per word because prose repeats words.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace smolrt {

// Hash for heterogeneous (string_view) lookup in unordered maps keyed by std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using PieceMap = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // merges: "left right", rank = index; piece_to_id: byte-level piece -> id of the normal tokens;
  // unk: the id for a byte the vocab has no token for (-1: such bytes are dropped);
  // ignore_merges: a word that is itself a piece becomes that one token before any merge
  // (Hugging Face's BPE `ignore_merges`, on for Llama 3). Throws Error for a malformed merge or
  // one naming a piece that is not in the vocab.
  BpeModel(const std::vector<std::string>& merges, const PieceMap& piece_to_id, int unk,
           bool ignore_merges = false);

  // Appends the ids of one pre-tokenized word (raw bytes) to `out`. Thread-safe.
  void encode_word(std::string_view word, std::vector<int>& out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;  // id of left+right
  };
  static uint64_t key(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // ignore_merges: the id of the piece spelling the whole word, or -1.
  int whole_word(std::string_view word) const;
  void merge_word(std::string_view word, std::vector<int>& out) const;

  int byte_id_[256];  // id of the token for each raw byte (-1: none)
  int unk_;
  PieceMap whole_;  // ignore_merges: byte-level piece -> id (empty otherwise)
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id

  // Word -> ids cache, bounded (cleared when full); guarded because encode is const + shared.
  static constexpr size_t kCacheMax = 1 << 17;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int>, StringHash, std::equal_to<>> cache_;
};

}  // namespace smolrt
