// smolrt tokenize: text -> token ids and pieces, from a GGUF's vocabulary (vocab-only files work)
// or straight from a Hugging Face tokenizer.json.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "app/command.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace smolrt::app {
namespace {

struct TokenizeOpts {
  std::string model;
  std::string tokenizer_json;
  std::string text;
  bool text_given = false;  // an explicit "" is empty text, not "read stdin"
  bool json = false;
  bool ids_only = false;
  bool no_special = false;
  bool jsonl = false;
};

using nlohmann::json;

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Tokenizer load_tokenizer(const TokenizeOpts& o) {
  if (!o.tokenizer_json.empty()) return Tokenizer(vocab_from_hf_json(o.tokenizer_json));
  // Only the metadata is read: the tensors need not form a valid llama model.
  const auto file = gguf::File::open(resolve_model_path(o.model));
  return Tokenizer(vocab_from_gguf(*file));
}

// --jsonl: every stdin line is a JSON string; every output line {"ids": [...], "text": decoded}.
// One process for a whole corpus (the Hugging Face oracle test uses it).
int run_jsonl(const Tokenizer& tok, bool special) {
  std::string line;
  size_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (line.empty()) continue;
    json in;
    try {
      in = json::parse(line);
    } catch (const json::exception& e) {
      fail("--jsonl: stdin line ", n, " is not JSON (", e.what(),
           "); give one JSON string per line");
    }
    if (!in.is_string()) fail("--jsonl: stdin line ", n, " is not a JSON string");
    const auto ids = tok.encode(in.get_ref<const std::string&>(), special);
    std::cout << dump(json{{"ids", ids}, {"text", tok.decode(ids, true)}}) << '\n';
  }
  std::cout.flush();
  return 0;
}

int run_tokenize(const TokenizeOpts& o) {
  const Tokenizer tok = load_tokenizer(o);
  if (o.jsonl) return run_jsonl(tok, !o.no_special);
  std::string text = o.text;
  if (!o.text_given) text.assign(std::istreambuf_iterator<char>(std::cin), {});
  const auto ids = tok.encode(text, !o.no_special);
  if (o.ids_only) {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << '\n';
  } else if (o.json) {
    json pieces = json::array();
    for (int id : ids) pieces.push_back(tok.piece(id));
    std::cout << dump(json{{"ids", ids}, {"pieces", pieces}}) << '\n';
  } else {
    for (int id : ids) std::cout << id << '\t' << dump(json(tok.piece(id))) << '\n';
    std::cout << ids.size() << " tokens\n";
  }
  return 0;
}

REGISTER_COMMAND(Command{
    "tokenize", "Show the token ids and pieces of a text", 60, [](CLI::App& sub) {
      auto o = std::make_shared<TokenizeOpts>();
      sub.add_option("-m,--model", o->model, "GGUF file whose vocabulary to use (default model)");
      sub.add_option("--tokenizer-json", o->tokenizer_json,
                     "Use a Hugging Face tokenizer.json instead of a GGUF")
          ->excludes(sub.get_option("--model"));
      auto* j = sub.add_flag("--json", o->json, "Print {\"ids\": [...], \"pieces\": [...]}");
      sub.add_flag("--ids-only", o->ids_only, "Print only the ids, space-separated")->excludes(j);
      sub.add_flag("--no-special", o->no_special,
                   "Tokenize control tokens written in the text (<|im_start|>) as plain text");
      sub.add_flag("--jsonl", o->jsonl,
                   "Batch mode: stdin has one JSON string per line; prints one "
                   "{\"ids\", \"text\"} object per line");
      auto* text = sub.add_option("text", o->text, "Text to tokenize (default: all of stdin)");
      return [o, text] {
        o->text_given = text->count() > 0;
        return run_tokenize(*o);
      };
    }});

}  // namespace
}  // namespace smolrt::app
