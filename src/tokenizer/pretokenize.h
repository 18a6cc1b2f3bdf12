// Pre-tokenizers of byte-level BPE: split text into the "words" that BPE merges within.
//
// "gpt-2": the GPT-2 pattern, hand-matched over code points:
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// "smollm", "starcoder": first every single \p{N} character is split off on its own, then the
// GPT-2 pattern runs on the pieces between digits (Hugging Face's Digits(individual_digits) +
// ByteLevel, llama.cpp's starcoder pre-tokenizer).
// "llama-bpe" (Llama 3; also "llama3") and "qwen2": the Llama 3 pattern, hand-matched,
//     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//      ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Qwen2's is the same with single digits (\p{N} instead of \p{N}{1,3}).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/unicode.h"

namespace smolrt {

enum class PreTokenizer { Gpt2, DigitsThenGpt2, Llama3, Qwen2 };

// "gpt-2" (also "" and "default") -> Gpt2; "smollm", "starcoder" -> DigitsThenGpt2;
// "llama-bpe", "llama3" -> Llama3; "qwen2" -> Qwen2. Any other name throws Error listing them.
PreTokenizer pre_tokenizer_from_name(std::string_view name);

// A word as a byte range [begin, end) of the text the chars were decoded from.
using WordSpan = std::pair<uint32_t, uint32_t>;

// Appends the words of `chars` (decoded text) to `out`, in order, covering every byte once.
void pre_tokenize(PreTokenizer p, std::span<const unicode::Char> chars, std::vector<WordSpan>& out);

}  // namespace smolrt
