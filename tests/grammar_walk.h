// Random walks through a grammar over a real vocabulary (shared by the grammar tests and
// tests/grammar/grammar_walk.cpp, which feeds the jsonschema oracle): at each step a token drawn
// from the allowed mask, or, to finish, the first token of the shortest completion; every chosen
// token must be in the mask and accepted. Ends on an end-of-generation token.
#pragma once

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace smolrt::test {

inline bool mask_has(const uint64_t* bits, int id) {
  return (bits[id >> 6] >> (id & 63)) & 1;
}

// The next token of a walk: mostly random while `random` (half the time among short tokens only:
// most tokens fit inside strings, short ones reach quotes, commas and brackets more often), else
// the first token of the shortest completion (an end-of-generation token when complete).
inline int walk_token(grammar::GrammarMatcher& m, const Tokenizer& tok, std::mt19937& rng,
                      bool random) {
  const grammar::TokenVocab& v = m.grammar().vocab();
  const uint64_t* bits = m.mask();
  if (random && rng() % 4 != 0) {
    const bool short_only = rng() % 2 == 0;
    std::vector<int> allowed;
    for (int t = 0; t < v.n_vocab(); ++t) {
      if (mask_has(bits, t) && !v.is_eog(t) && (!short_only || v.token_bytes(t).size() <= 2))
        allowed.push_back(t);
    }
    if (!allowed.empty()) return allowed[rng() % allowed.size()];
  }
  const std::vector<int> ids = tok.encode(m.shortest_completion(), /*parse_special=*/false, 0);
  return ids.empty() ? v.eog_ids().at(0) : ids[0];
}

// One walk: `random_steps` steps mostly at random, then the shortest completion; every token
// must be in the mask and accepted. Returns the text; `ids` (when given) gets the tokens.
inline std::string random_walk(grammar::GrammarMatcher& m, const Tokenizer& tok, std::mt19937& rng,
                               int random_steps, std::vector<int>* ids = nullptr) {
  const grammar::TokenVocab& v = m.grammar().vocab();
  std::string text;
  for (int step = 0; !m.is_done(); ++step) {
    if (step > random_steps + 4000) throw Error("random walk: no end after 4000 completion steps");
    const int id = walk_token(m, tok, rng, step < random_steps);
    if (!mask_has(m.mask(), id)) throw Error(cat("random walk: token ", id, " is not in the mask"));
    if (!m.accept_token(id))
      throw Error(cat("random walk: token ", id, " in the mask was rejected"));
    if (ids) ids->push_back(id);
    if (v.is_eog(id)) break;
    text += v.token_bytes(id);
  }
  return text;
}

}  // namespace smolrt::test
