// VocabData from a Hugging Face tokenizer.json (+ config.json / tokenizer_config.json beside it).
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {

// --- Hugging Face tokenizer.json --------------------------------------------------------------

namespace {

using nlohmann::json;

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("cannot open '", p.string(), "'; check the path");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("'", p.string(), "' is not valid JSON: ", e.what());
  }
}

// The Split patterns of Llama 3's and Qwen2's tokenizer.json (they differ in \p{N}{1,3} / \p{N}).
constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// "smollm" for Sequence[Digits(individual_digits), ByteLevel], "gpt-2" for ByteLevel alone,
// "llama-bpe" / "qwen2" for their Split patterns.
std::string pre_from_json(const json& pre, const std::string& path) {
  auto is_byte_level = [](const json& j) {
    return j.is_object() && j.value("type", "") == "ByteLevel" && j.value("use_regex", true);
  };
  if (is_byte_level(pre)) return "gpt-2";
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers")) {
    const json& seq = pre["pretokenizers"];
    if (seq.size() == 2 && seq[0].value("type", "") == "Digits" &&
        seq[0].value("individual_digits", false) && is_byte_level(seq[1])) {
      return "smollm";
    }
  }
  // Llama 3 / Qwen2: Sequence[Split(Regex pattern, Isolated), ByteLevel(use_regex false)].
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers")) {
    const json& seq = pre["pretokenizers"];
    if (seq.size() == 2 && seq[0].value("type", "") == "Split" && seq[1].is_object() &&
        seq[1].value("type", "") == "ByteLevel" && !seq[1].value("use_regex", true) &&
        seq[0].contains("pattern") && seq[0]["pattern"].is_object() &&
        seq[0]["pattern"].contains("Regex") && seq[0]["pattern"]["Regex"].is_string()) {
      const std::string re = seq[0]["pattern"]["Regex"].get<std::string>();
      if (re == kLlama3Regex) return "llama-bpe";
      if (re == kQwen2Regex) return "qwen2";
    }
  }
  fail(path, ": pre_tokenizer ", pre.dump(),
       " is not supported; known: ByteLevel (gpt-2), Sequence[Digits(individual_digits), "
       "ByteLevel] (smollm), and the Llama 3 and Qwen2 Split patterns with ByteLevel");
}

// The id of a token id field in config.json, or -1 when absent / not an id.
int config_id(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return -1;
  const json& j = cfg[key];
  if (j.is_number_integer()) return j.get<int>();
  if (j.is_array() && !j.empty() && j[0].is_number_integer()) return j[0].get<int>();
  return -1;
}

VocabData vocab_from_hf_json_impl(const std::string& path);

}  // namespace

VocabData vocab_from_hf_json(const std::string& path) {
  try {
    return vocab_from_hf_json_impl(path);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type
    fail(path, ": unexpected tokenizer.json structure: ", e.what());
  }
}

namespace {
VocabData vocab_from_hf_json_impl(const std::string& path) {
  const json j = read_json(path);
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    fail(path, ": no \"model\" object; is this a Hugging Face tokenizer.json?");
  }
  const json& model = j["model"];
  if (model.value("type", "") != "BPE") {
    fail(path, ": model.type '", model.value("type", ""),
         "' is not supported; only byte-level BPE tokenizer.json files can be read");
  }
  VocabData v;
  v.model = "gpt2";
  v.pre = pre_from_json(j.value("pre_tokenizer", json()), path);
  if (model.contains("ignore_merges") && model["ignore_merges"].is_boolean())
    v.ignore_merges = model["ignore_merges"].get<bool>() ? 1 : 0;

  // Tokens: model.vocab (piece -> id) plus added_tokens (id, content); ids must be dense.
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<bool> seen;
  auto put = [&](int id, const std::string& piece, TokenType t) {
    if (id < 0 || id > 10'000'000) fail(path, ": token id ", id, " for '", piece, "' is invalid");
    if (static_cast<size_t>(id) >= tokens.size()) {
      tokens.resize(static_cast<size_t>(id) + 1);
      types.resize(static_cast<size_t>(id) + 1, static_cast<int32_t>(TokenType::Normal));
      seen.resize(static_cast<size_t>(id) + 1, false);
    }
    tokens[id] = piece;
    types[id] = static_cast<int32_t>(t);
    seen[id] = true;
  };
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    fail(path, ": model.vocab is missing or not an object");
  }
  for (const auto& [piece, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) fail(path, ": model.vocab['", piece, "'] is not an integer id");
    put(id.get<int>(), piece, TokenType::Normal);
  }
  for (const json& a : j.value("added_tokens", json::array())) {
    const std::string content = a.value("content", "");
    if (!a.contains("id") || !a["id"].is_number_integer() || content.empty()) {
      fail(path, ": added_tokens entry ", a.dump(), " needs an integer id and a content");
    }
    put(a["id"].get<int>(), content,
        a.value("special", false) ? TokenType::Control : TokenType::UserDefined);
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) fail(path, ": no token has id ", i, "; token ids must be 0..n-1 without gaps");
  }
  v.tokens = std::move(tokens);
  v.token_types = std::move(types);

  // Merges: "a b" strings (older files) or ["a", "b"] pairs (newer files).
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      fail(path, ": model.merges entry ", m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }

  // Special ids: config.json beside the file when present, else well-known pieces.
  auto find_piece = [&](std::initializer_list<const char*> names) {
    for (const char* name : names) {
      for (size_t i = 0; i < v.tokens.size(); ++i) {
        if (v.tokens[i] == name) return static_cast<int>(i);
      }
    }
    return -1;
  };
  const auto dir = std::filesystem::path(path).parent_path();
  json cfg = json::object();
  if (std::filesystem::exists(dir / "config.json")) cfg = read_json(dir / "config.json");
  v.bos = config_id(cfg, "bos_token_id");
  v.eos = config_id(cfg, "eos_token_id");
  v.pad = config_id(cfg, "pad_token_id");
  if (v.bos < 0) v.bos = find_piece({"<|im_start|>", "<s>", "<|begin_of_text|>"});
  if (v.eos < 0) v.eos = find_piece({"<|im_end|>", "</s>", "<|endoftext|>"});
  const int n = static_cast<int>(v.tokens.size());
  for (int* id : {&v.bos, &v.eos, &v.pad}) {
    if (*id >= n) fail(path, ": config.json names token id ", *id, " outside the vocab (", n, ")");
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    v.unk = find_piece({model["unk_token"].get_ref<const std::string&>().c_str()});
  }
  v.add_bos = false;  // byte-level BPE tokenizer.json files add no BOS (no post-processor)
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    const json tc = read_json(dir / "tokenizer_config.json");
    if (tc.contains("chat_template") && tc["chat_template"].is_string()) {
      v.chat_template = tc["chat_template"].get<std::string>();
    }
  }
  return v;
}
}  // namespace

}  // namespace smolrt
