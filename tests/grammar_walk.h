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

// The text of one walk: `random_steps` steps mostly at random (a quarter of them toward the end,
// so the walk reaches more of the structure), then the shortest completion.
inline std::string random_walk(grammar::GrammarMatcher& m, const Tokenizer& tok, std::mt19937& rng,
                               int random_steps) {
  const grammar::TokenVocab& v = m.grammar().vocab();
  std::string text;
  std::vector<int> allowed;
  for (int step = 0; !m.is_done(); ++step) {
    if (step > random_steps + 4000) throw Error("random walk: no end after 4000 completion steps");
    const uint64_t* bits = m.mask();
    int id = -1;
    if (step < random_steps && rng() % 4 != 0) {
      // Half the time only short tokens: most tokens fit inside strings, short ones reach the
      // structure (quotes, commas, brackets) more often.
      const bool short_only = rng() % 2 == 0;
      allowed.clear();
      for (int t = 0; t < v.n_vocab(); ++t) {
        if (mask_has(bits, t) && !v.is_eog(t) && (!short_only || v.token_bytes(t).size() <= 2))
          allowed.push_back(t);
      }
      if (!allowed.empty()) id = allowed[rng() % allowed.size()];
    }
    if (id < 0) {
      const std::string rest = m.shortest_completion();
      const std::vector<int> ids = tok.encode(rest, /*parse_special=*/false, /*add_bos=*/0);
      id = ids.empty() ? v.eog_ids().at(0) : ids[0];
    }
    if (!mask_has(bits, id)) throw Error(cat("random walk: token ", id, " is not in the mask"));
    if (!m.accept_token(id))
      throw Error(cat("random walk: token ", id, " in the mask was rejected"));
    if (v.is_eog(id)) break;
    text += v.token_bytes(id);
  }
  return text;
}

}  // namespace smolrt::test
