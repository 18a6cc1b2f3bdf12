// Random walks through JSON-schema grammars over a real vocabulary, for the jsonschema oracle
// (test_schema_walks.py): for each schema in the file, N walks; prints one JSON line per walk:
// {"name": ..., "walk": i, "text": ...}.
//
//   grammar_walk --tokenizer tokenizer.json --schemas schemas.json [--walks N] [--seed S]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "grammar/json_schema.h"
#include "grammar_walk.h"

int main(int argc, char** argv) {
  std::string tokenizer, schemas_path;
  int walks = 10;
  unsigned seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--tokenizer")
      tokenizer = argv[i + 1];
    else if (k == "--schemas")
      schemas_path = argv[i + 1];
    else if (k == "--walks")
      walks = std::atoi(argv[i + 1]);
    else if (k == "--seed")
      seed = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "grammar_walk: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (tokenizer.empty() || schemas_path.empty()) {
    std::fprintf(stderr,
                 "usage: grammar_walk --tokenizer tokenizer.json --schemas schemas.json [--walks "
                 "N] [--seed S]\n");
    return 2;
  }
  try {
    using namespace smolrt;
    const Tokenizer tok(vocab_from_hf_json(tokenizer));
    const auto vocab = std::make_shared<const grammar::TokenVocab>(tok);
    std::ifstream in(schemas_path);
    const auto list = nlohmann::ordered_json::parse(in);
    std::mt19937 rng(seed);
    for (const auto& s : list) {
      const auto g = grammar::compile(grammar::json_schema_grammar(s["schema"]), vocab);
      for (int w = 0; w < walks; ++w) {
        grammar::GrammarMatcher m(g);
        const std::string text = test::random_walk(m, tok, rng, 4 + 6 * (w % 8));
        const nlohmann::json line = {{"name", s["name"]}, {"walk", w}, {"text", text}};
        std::printf("%s\n", line.dump().c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grammar_walk: %s\n", e.what());
    return 1;
  }
  return 0;
}
