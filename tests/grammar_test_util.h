// Helpers for the grammar tests: a byte-level vocabulary (every byte is a token, so grammars are
// tested on text), whole-text matching, and the message of the error a build throws.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "model/synth.h"

namespace smolrt::test {

inline std::shared_ptr<const grammar::TokenVocab> byte_vocab() {
  static const Tokenizer tok(builtin_byte_vocab());
  static const auto v = std::make_shared<const grammar::TokenVocab>(tok);
  return v;
}

// Whether the grammar matches exactly this text.
inline bool matches(const std::shared_ptr<const grammar::CompiledGrammar>& g,
                    std::string_view text) {
  grammar::GrammarMatcher m(g);
  return m.accept_text(text) && m.can_end();
}

// The GrammarError message of build(), or "(no error)".
inline std::string error_of(const std::function<void()>& build) {
  try {
    build();
  } catch (const grammar::GrammarError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace smolrt::test
