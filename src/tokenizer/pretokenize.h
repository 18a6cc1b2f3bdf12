// Pre-tokenizers of byte-level BPE: split text into the "words" that BPE merges within.
//
// "gpt-2": the GPT-2 pattern, hand-matched over code points:
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// "smollm", "starcoder": first every single \p{N} character is split off on its own, then the
// GPT-2 pattern runs on the pieces between digits (Hugging Face's Digits(individual_digits) +
// ByteLevel, llama.cpp's starcoder pre-tokenizer).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/unicode.h"

namespace smolrt {

enum class PreTokenizer { Gpt2, DigitsThenGpt2 };

// "gpt-2" (also "" and "default") -> Gpt2; "smollm", "starcoder" -> DigitsThenGpt2. Any other
// name throws Error listing the known ones.
PreTokenizer pre_tokenizer_from_name(std::string_view name);

// A word as a byte range [begin, end) of the text the chars were decoded from.
using WordSpan = std::pair<uint32_t, uint32_t>;

// Appends the words of `chars` (decoded text) to `out`, in order, covering every byte once.
void pre_tokenize(PreTokenizer p, std::span<const unicode::Char> chars, std::vector<WordSpan>& out);

}  // namespace smolrt
