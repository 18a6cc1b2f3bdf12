// SentencePiece-style BPE ("llama" vocab): the text (spaces already escaped to U+2581 "▁") starts
// as one symbol per UTF-8 character; the adjacent pair whose concatenation is a vocab piece with
// the highest score merges first (leftmost on ties); symbols left outside the vocab fall back to
// their bytes' <0xXX> tokens (or unk when the vocab has no byte tokens).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.h"

namespace smolrt {

class SpmModel {
 public:
  // tokens/scores/types: the vocab's arrays (types as TokenType ints). Only Normal and
  // UserDefined pieces take part in merges; Byte tokens "<0xXX>" give the byte fallback.
  SpmModel(const std::vector<std::string>& tokens, const std::vector<float>& scores,
           const std::vector<int32_t>& types, int unk);

  // Appends the ids of `text` (already escaped) to `out`. Thread-safe (no shared state).
  void encode(std::string_view text, std::vector<int>& out) const;

 private:
  struct Entry {
    int id;
    float score;
  };
  std::unordered_map<std::string, Entry, StringHash, std::equal_to<>> pieces_;
  int byte_id_[256];
  int unk_;
};

}  // namespace smolrt
