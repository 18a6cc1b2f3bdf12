#include "tokenizer/pretokenize.h"

#include "core/error.h"

namespace smolrt {

using unicode::Char;
using unicode::CharClass;

PreTokenizer pre_tokenizer_from_name(std::string_view name) {
  if (name.empty() || name == "gpt-2" || name == "default") return PreTokenizer::Gpt2;
  if (name == "smollm" || name == "starcoder") return PreTokenizer::DigitsThenGpt2;
  if (name == "llama-bpe" || name == "llama3") return PreTokenizer::Llama3;
  if (name == "qwen2") return PreTokenizer::Qwen2;
  fail("unknown pre-tokenizer '", name,
       "' (tokenizer.ggml.pre); known: gpt-2 (the default), smollm, starcoder, llama-bpe, qwen2; "
       "re-convert the "
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

bool is_newline(uint32_t cp) {
  return cp == '\r' || cp == '\n';
}

// The Llama 3 pattern (pretokenize.h) over c[0..n): the first alternative that matches at each
// position, as the regex engine takes them. max_digits: 3 (Llama 3) or 1 (Qwen2).
void split_llama3(const Char* c, size_t n, int max_digits, std::vector<WordSpan>& out) {
  auto emit = [&](size_t a, size_t b) {  // chars [a, b)
    out.emplace_back(c[a].offset, c[b - 1].offset + c[b - 1].len);
  };
  auto lower = [](uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp; };
  size_t i = 0;
  while (i < n) {
    const uint32_t cp = c[i].cp;
    const CharClass cls = c[i].cls;
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (cp == '\'' && i + 1 < n) {
      const uint32_t c1 = lower(c[i + 1].cp);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        const uint32_t c2 = lower(c[i + 2].cp);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          emit(i, i + 3);
          i += 3;
          continue;
        }
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    size_t j = i;
    if (cls != CharClass::Letter && cls != CharClass::Number && !is_newline(cp) && i + 1 < n &&
        c[i + 1].cls == CharClass::Letter)
      j = i + 1;
    if (c[j].cls == CharClass::Letter) {
      size_t k = j + 1;
      while (k < n && c[k].cls == CharClass::Letter) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // \p{N}{1,max}
    if (cls == CharClass::Number) {
      size_t k = i + 1;
      while (k < n && k - i < (size_t)max_digits && c[k].cls == CharClass::Number) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    j = cp == ' ' && i + 1 < n && c[i + 1].cls == CharClass::Other ? i + 1 : i;
    if (c[j].cls == CharClass::Other) {
      size_t k = j + 1;
      while (k < n && c[k].cls == CharClass::Other) ++k;
      while (k < n && is_newline(c[k].cp)) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // What is left starts with whitespace: its run [i, k).
    size_t k = i + 1;
    while (k < n && c[k].cls == CharClass::Space) ++k;
    // \s*[\r\n]+: up to the run's last newline (the backtracking \s* stops there)
    size_t end_nl = i;
    for (size_t m = i; m < k; ++m)
      if (is_newline(c[m].cp)) end_nl = m + 1;
    if (end_nl > i) {
      emit(i, end_nl);
      i = end_nl;
      continue;
    }
    // \s+(?!\S) then \s+
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
  if (p == PreTokenizer::Llama3 || p == PreTokenizer::Qwen2) {
    split_llama3(chars.data(), chars.size(), p == PreTokenizer::Llama3 ? 3 : 1, out);
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
