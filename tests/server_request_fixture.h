// What the request parser needs from a served model, for the parser's unit tests: the byte-level
// tokenizer, a grammar cache over it (shared by every parse, as the server shares one) and a
// ChatML chat template.
#pragma once

#include <memory>
#include <string>

#include "model/synth.h"
#include "server/request.h"

namespace smolrt::server {

struct RequestFixture {
  explicit RequestFixture(int context) : seq_ctx(context) {}

  Tokenizer tok{builtin_byte_vocab()};
  std::shared_ptr<grammar::GrammarCache> grammars =
      std::make_shared<grammar::GrammarCache>(std::make_shared<const grammar::TokenVocab>(tok));
  std::string name = "m";  // (a member: GCC 12 misreads assigning the literal as -Wrestrict)
  int seq_ctx;

  ParseContext ctx() const {
    ParseContext c;
    c.tok = &tok;
    c.model_name = name;
    c.seq_ctx = seq_ctx;
    c.chat = true;
    c.grammars = grammars;
    return c;
  }
};

}  // namespace smolrt::server
