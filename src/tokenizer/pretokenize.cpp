#include "tokenizer/pretokenize.h"

#include "core/error.h"

namespace smolrt {

using unicode::Char;
using unicode::CharClass;

PreTokenizer pre_tokenizer_from_name(std::string_view name) {
  if (name.empty() || name == "gpt-2" || name == "default") return PreTokenizer::Gpt2;
  if (name == "smollm" || name == "starcoder") return PreTokenizer::DigitsThenGpt2;
  fail("unknown pre-tokenizer '", name,
       "' (tokenizer.ggml.pre); known: gpt-2 (the default), smollm, starcoder; re-convert the "
       "model with one of these or add the pattern to src/tokenizer/pretokenize.cpp");
}

namespace {

// The GPT-2 pattern over c[0..n); word boundaries are byte offsets taken from the chars.
void split_gpt2(const Char* c, size_t n, std::vector<WordSpan>& out) {
  auto emit = [&](size_t a, size_t b) {  // chars [a, b)
    out.emplace_back(c[a].offset, c[b - 1].offset + c[b - 1].len);
  };
  size_t i = 0;
  while (i < n) {
    const uint32_t cp = c[i].cp;
    // 's 't 're 've 'm 'll 'd
    if (cp == '\'' && i + 1 < n) {
      const uint32_t c1 = c[i + 1].cp;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        const uint32_t c2 = c[i + 2].cp;
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          emit(i, i + 3);
          i += 3;
          continue;
        }
      }
    }
    // ' ?X+' for X in {letters, numbers, other}: an optional U+0020 then a run of one class.
    size_t j = i;
    if (cp == ' ' && i + 1 < n && c[i + 1].cls != CharClass::Space) j = i + 1;
    const CharClass cls = c[j].cls;
    if (cls != CharClass::Space) {
      size_t k = j + 1;
      while (k < n && c[k].cls == cls) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // \s+(?!\S) then \s+: a whitespace run leaves its last char to the next word unless the
    // run ends the text.
    size_t k = i + 1;
    while (k < n && c[k].cls == CharClass::Space) ++k;
    if (k < n && k - i >= 2) --k;
    emit(i, k);
    i = k;
  }
}

}  // namespace

void pre_tokenize(PreTokenizer p, std::span<const Char> chars, std::vector<WordSpan>& out) {
  if (p == PreTokenizer::Gpt2) {
    split_gpt2(chars.data(), chars.size(), out);
    return;
  }
  size_t start = 0;
  for (size_t i = 0; i < chars.size(); ++i) {
    if (chars[i].cls != CharClass::Number) continue;
    if (i > start) split_gpt2(chars.data() + start, i - start, out);
    out.emplace_back(chars[i].offset, chars[i].offset + chars[i].len);
    start = i + 1;
  }
  if (chars.size() > start) split_gpt2(chars.data() + start, chars.size() - start, out);
}

}  // namespace smolrt
