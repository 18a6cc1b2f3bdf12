// VocabData from GGUF metadata and back to GGUF metadata (tokenizer.ggml.* keys).
#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {

// --- GGUF -----------------------------------------------------------------------------------

namespace {

// An optional token id key: absent or the "none" sentinels (-1 / 0xFFFFFFFF) -> -1; any other
// value must index the vocab.
int optional_id(const gguf::File& f, const char* key, size_t n_vocab) {
  const gguf::Value* val = f.find(key);
  if (!val) return -1;
  int64_t id;
  if (std::holds_alternative<uint64_t>(val->v)) {
    const uint64_t u = std::get<uint64_t>(val->v);
    if (u == 0xFFFFFFFFull || u == ~0ull) return -1;
    id = u > static_cast<uint64_t>(INT32_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  } else if (std::holds_alternative<int64_t>(val->v)) {
    id = std::get<int64_t>(val->v);
    if (id == -1) return -1;
  } else {
    fail(f.path(), ": ", key, " has type ", gguf::value_type_name(val->type),
         ", expected an integer token id");
  }
  if (id < 0 || id >= static_cast<int64_t>(n_vocab)) {
    fail(f.path(), ": ", key, " = ", id, " is outside the vocabulary (", n_vocab,
         " tokens); fix the metadata or re-convert the model");
  }
  return static_cast<int>(id);
}

}  // namespace

VocabData vocab_from_gguf(const gguf::File& f) {
  VocabData v;
  v.model = f.get_string("tokenizer.ggml.model");
  v.pre = f.get_string("tokenizer.ggml.pre", "");
  if (v.pre == "default") v.pre.clear();
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  if (n == 0) fail(f.path(), ": tokenizer.ggml.tokens is empty; the file has no vocabulary");
  if (f.has("tokenizer.ggml.token_type")) {
    const auto types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != n) {
      fail(f.path(), ": tokenizer.ggml.token_type has ", types.size(), " entries for ", n,
           " tokens; the arrays must be the same length");
    }
    v.token_types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (types[i] < 1 || types[i] > 6) {
        fail(f.path(), ": tokenizer.ggml.token_type[", i, "] = ", types[i],
             " is not a token type (1 normal .. 6 byte)");
      }
      v.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  } else {
    v.token_types.assign(n, static_cast<int32_t>(TokenType::Normal));
  }
  if (f.has("tokenizer.ggml.scores")) {
    v.scores = f.get_float_array("tokenizer.ggml.scores");
    if (v.scores.size() != n) {
      fail(f.path(), ": tokenizer.ggml.scores has ", v.scores.size(), " entries for ", n,
           " tokens; the arrays must be the same length");
    }
  }
  if (v.model == "gpt2") {
    v.merges = f.get_string_array("tokenizer.ggml.merges");
  } else if (v.model == "llama") {
    if (v.scores.empty()) fail(f.path(), ": tokenizer.ggml.scores is required for an SPM vocab");
  }
  v.bos = optional_id(f, "tokenizer.ggml.bos_token_id", n);
  v.eos = optional_id(f, "tokenizer.ggml.eos_token_id", n);
  v.unk = optional_id(f, "tokenizer.ggml.unknown_token_id", n);
  v.pad = optional_id(f, "tokenizer.ggml.padding_token_id", n);
  v.eot = optional_id(f, "tokenizer.ggml.eot_token_id", n);
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", v.model == "llama");
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = v.model == "llama" && f.get_bool("tokenizer.ggml.add_space_prefix", true);
  v.chat_template = f.get_string("tokenizer.chat_template", "");
  return v;
}

void vocab_to_gguf(const VocabData& v, gguf::Writer& w) {
  using gguf::Value;
  w.set("tokenizer.ggml.model", Value::str(v.model));
  if (!v.pre.empty()) w.set("tokenizer.ggml.pre", Value::str(v.pre));
  w.set("tokenizer.ggml.tokens", Value::string_array(v.tokens));
  if (!v.token_types.empty()) w.set("tokenizer.ggml.token_type", Value::i32_array(v.token_types));
  // Always written for the model that reads them (vocab_from_gguf requires them), even if empty.
  if (!v.scores.empty() || v.model == "llama") {
    w.set("tokenizer.ggml.scores", Value::f32_array(v.scores));
  }
  if (!v.merges.empty() || v.model == "gpt2") {
    w.set("tokenizer.ggml.merges", Value::string_array(v.merges));
  }
  const std::pair<const char*, int> ids[] = {{"tokenizer.ggml.bos_token_id", v.bos},
                                             {"tokenizer.ggml.eos_token_id", v.eos},
                                             {"tokenizer.ggml.unknown_token_id", v.unk},
                                             {"tokenizer.ggml.padding_token_id", v.pad},
                                             {"tokenizer.ggml.eot_token_id", v.eot}};
  for (const auto& [key, id] : ids) {
    if (id >= 0) w.set(key, Value::u32(static_cast<uint32_t>(id)));
  }
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(v.add_bos));
  w.set("tokenizer.ggml.add_eos_token", Value::boolean(v.add_eos));
  if (v.model == "llama")
    w.set("tokenizer.ggml.add_space_prefix", Value::boolean(v.add_space_prefix));
  if (!v.chat_template.empty()) w.set("tokenizer.chat_template", Value::str(v.chat_template));
}

}  // namespace smolrt
