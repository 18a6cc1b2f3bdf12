// smolrt info: what a GGUF file holds (GGUF facts, the model's architecture and hyperparameters,
// tensor statistics, tokenizer metadata), as text or --json. A file that is not a supported model
// still gets its GGUF facts; the model part then says why it is absent or unsupported.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "app/command.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"

namespace smolrt::app {

namespace {

using nlohmann::ordered_json;

// Loose readers for display: a value of an unexpected type is shown as absent, not an error.
std::optional<std::string> opt_string(const gguf::File& f, std::string_view key) {
  const gguf::Value* v = f.find(key);
  if (!v) return std::nullopt;
  if (const std::string* s = std::get_if<std::string>(&v->v)) return *s;
  return std::nullopt;
}
std::optional<int64_t> opt_int(const gguf::File& f, std::string_view key) {
  const gguf::Value* v = f.find(key);
  if (!v) return std::nullopt;
  if (const int64_t* i = std::get_if<int64_t>(&v->v)) return *i;
  if (const uint64_t* u = std::get_if<uint64_t>(&v->v)) return static_cast<int64_t>(*u);
  return std::nullopt;
}
std::optional<bool> opt_bool(const gguf::File& f, std::string_view key) {
  const gguf::Value* v = f.find(key);
  if (!v) return std::nullopt;
  if (const bool* b = std::get_if<bool>(&v->v)) return *b;
  return std::nullopt;
}
std::optional<size_t> array_len(const gguf::File& f, std::string_view key) {
  const gguf::Value* v = f.find(key);
  if (!v) return std::nullopt;
  if (const gguf::Array* a = std::get_if<gguf::Array>(&v->v)) return a->items.size();
  return std::nullopt;
}

template <class T>
ordered_json or_null(const std::optional<T>& x) {
  return x ? ordered_json(*x) : ordered_json(nullptr);
}

ordered_json describe(const std::string& path) {
  const std::shared_ptr<gguf::File> f = gguf::File::open(path);
  ordered_json j;
  j["file"] = path;
  j["gguf_version"] = f->version();
  j["file_size"] = f->file_size();
  j["alignment"] = f->alignment();
  j["data_offset"] = f->data_offset();
  j["metadata_count"] = f->metadata().size();
  j["architecture"] = or_null(opt_string(*f, "general.architecture"));
  j["name"] = or_null(opt_string(*f, "general.name"));

  // Model: hyperparameters when this is a llama model smolrt can run.
  ordered_json m;
  try {
    const ModelConfig c = load_config(*f);
    load_weights(*f, c);
    m["supported"] = true;
    m["dim"] = c.dim;
    m["n_layers"] = c.n_layers;
    m["n_heads"] = c.n_heads;
    m["n_kv_heads"] = c.n_kv_heads;
    m["head_dim"] = c.head_dim;
    m["hidden_dim"] = c.hidden_dim;
    m["vocab_size"] = c.vocab_size;
    m["n_ctx_train"] = c.n_ctx_train;
    m["rope_dim"] = c.rope_dim;
    m["rope_base"] = c.rope_base;
    m["norm_eps"] = c.norm_eps;
    m["tied_output"] = c.tied_output;
    // The architecture's switches (model/model.h's block).
    m["family"] = arch_name(c.family);
    m["q_dim"] = c.q_dim();
    m["rope_type"] = c.rope_neox ? "neox" : "normal";
    if (c.sliding_window > 0) m["rope_base_local"] = c.rope_base_swa;
    m["rope_freq_factors"] = c.rope_freq_factors;
    m["sliding_window"] = c.sliding_window;
    std::vector<int> local;
    for (int l = 0; l < c.n_layers; ++l) {
      if (c.is_swa(l)) local.push_back(l);
    }
    m["local_layers"] = local;
    m["attn_bias"] = c.attn_bias;
    m["qk_norm"] = c.qk_norm;
    m["post_norms"] = c.post_norms;
    m["ffn_act"] = c.act == FfnAct::GeluTanh ? "gelu_tanh" : "silu";
    m["embed_scale"] = c.embed_scale;
    m["attn_scale"] = c.attn_scale;
  } catch (const Error& e) {
    m["supported"] = false;
    m["reason"] = e.what();
  }
  j["model"] = m;

  // Tensors.
  std::map<std::string, uint64_t> by_type;
  uint64_t params = 0, bytes = 0;
  for (const gguf::TensorInfo& t : f->tensors()) {
    by_type[type_name(t.type)]++;
    params += t.n_elements();
    bytes += t.nbytes;
  }
  ordered_json tj;
  tj["count"] = f->tensors().size();
  tj["by_type"] = by_type;
  tj["params"] = params;
  tj["bytes"] = bytes;
  tj["mib"] = static_cast<double>(bytes) / (1024.0 * 1024.0);
  j["tensors"] = tj;

  // Tokenizer, read straight from tokenizer.ggml.* metadata.
  ordered_json k;
  k["model"] = or_null(opt_string(*f, "tokenizer.ggml.model"));
  k["pre"] = or_null(opt_string(*f, "tokenizer.ggml.pre"));
  k["vocab_size"] = or_null(array_len(*f, "tokenizer.ggml.tokens"));
  k["merges"] = or_null(array_len(*f, "tokenizer.ggml.merges"));
  for (const char* id : {"bos", "eos", "unknown", "padding", "eot", "sep"}) {
    ordered_json v = or_null(opt_int(*f, cat("tokenizer.ggml.", id, "_token_id")));
    // Converters write "no such token" as -1 stored in a u32 (0xFFFFFFFF): shown as "none".
    if (v.is_number() && (v.get<int64_t>() == 0xFFFFFFFFll || v.get<int64_t>() < 0)) v = "none";
    k[cat(id, "_token_id")] = v;
  }
  k["add_bos_token"] = or_null(opt_bool(*f, "tokenizer.ggml.add_bos_token"));
  k["add_eos_token"] = or_null(opt_bool(*f, "tokenizer.ggml.add_eos_token"));
  k["chat_template"] = f->has("tokenizer.chat_template");
  j["tokenizer"] = k;
  return j;
}

std::string show(const ordered_json& v) {
  if (v.is_null()) return "absent";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v.get<double>());
    return buf;
  }
  return v.dump();
}

void print_text(const ordered_json& j) {
  std::printf("file:          %s\n", j["file"].get<std::string>().c_str());
  std::printf("gguf:          version %s, %s metadata keys, alignment %s, data at byte %s\n",
              show(j["gguf_version"]).c_str(), show(j["metadata_count"]).c_str(),
              show(j["alignment"]).c_str(), show(j["data_offset"]).c_str());
  std::printf("file size:     %s bytes (%.2f MiB)\n", show(j["file_size"]).c_str(),
              j["file_size"].get<double>() / (1024.0 * 1024.0));
  std::printf("architecture:  %s\n", show(j["architecture"]).c_str());
  std::printf("name:          %s\n", show(j["name"]).c_str());
  const ordered_json& m = j["model"];
  if (m["supported"].get<bool>()) {
    std::printf("model:         %s, dim %s, %s layers, %s heads / %s kv heads, head_dim %s\n",
                show(m["family"]).c_str(), show(m["dim"]).c_str(), show(m["n_layers"]).c_str(),
                show(m["n_heads"]).c_str(), show(m["n_kv_heads"]).c_str(),
                show(m["head_dim"]).c_str());
    std::printf("               hidden_dim %s, vocab %s, ctx %s, rope dim %s base %s, eps %s, %s\n",
                show(m["hidden_dim"]).c_str(), show(m["vocab_size"]).c_str(),
                show(m["n_ctx_train"]).c_str(), show(m["rope_dim"]).c_str(),
                show(m["rope_base"]).c_str(), show(m["norm_eps"]).c_str(),
                m["tied_output"].get<bool>() ? "tied output" : "separate output.weight");
    std::string rope = cat("rope:          ", show(m["rope_type"]), ", q_dim ", show(m["q_dim"]));
    if (!m["rope_freq_factors"].empty()) {
      rope += cat(", llama3 frequency factors (", m["rope_freq_factors"].size(), ", ",
                  show(m["rope_freq_factors"].front()), " .. ", show(m["rope_freq_factors"].back()),
                  ")");
    }
    std::printf("%s\n", rope.c_str());
    if (m["sliding_window"].get<int>() > 0) {
      std::string layers;
      for (const auto& l : m["local_layers"]) layers += cat(layers.empty() ? "" : ",", show(l));
      std::printf(
          "attention:     sliding window %s on local layers [%s] (rope base %s), global "
          "layers rope base %s\n",
          show(m["sliding_window"]).c_str(), layers.c_str(), show(m["rope_base_local"]).c_str(),
          show(m["rope_base"]).c_str());
    }
    std::printf(
        "block:         q/k/v bias %s, qk-norm %s, post norms %s, ffn %s, embed scale %s, "
        "attn scale %s\n",
        m["attn_bias"].get<bool>() ? "yes" : "no", m["qk_norm"].get<bool>() ? "yes" : "no",
        m["post_norms"].get<bool>() ? "yes" : "no", show(m["ffn_act"]).c_str(),
        show(m["embed_scale"]).c_str(), show(m["attn_scale"]).c_str());
  } else {
    std::printf("model:         absent or unsupported: %s\n", show(m["reason"]).c_str());
  }
  const ordered_json& t = j["tensors"];
  std::string types;
  for (const auto& [name, n] : t["by_type"].items()) {
    types += cat(types.empty() ? "" : ", ", n.get<uint64_t>(), " ", name);
  }
  std::printf("tensors:       %s (%s)\n", show(t["count"]).c_str(),
              types.empty() ? "none" : types.c_str());
  std::printf("parameters:    %s (%.2f M)\n", show(t["params"]).c_str(),
              t["params"].get<double>() / 1e6);
  std::printf("tensor bytes:  %s (%.2f MiB)\n", show(t["bytes"]).c_str(), t["mib"].get<double>());
  const ordered_json& k = j["tokenizer"];
  std::printf("tokenizer:     model %s, pre %s, %s tokens, %s merges\n", show(k["model"]).c_str(),
              show(k["pre"]).c_str(), show(k["vocab_size"]).c_str(), show(k["merges"]).c_str());
  std::printf("special ids:   bos %s, eos %s, unknown %s, padding %s, eot %s; add_bos %s\n",
              show(k["bos_token_id"]).c_str(), show(k["eos_token_id"]).c_str(),
              show(k["unknown_token_id"]).c_str(), show(k["padding_token_id"]).c_str(),
              show(k["eot_token_id"]).c_str(), show(k["add_bos_token"]).c_str());
  std::printf("chat template: %s\n", k["chat_template"].get<bool>() ? "present" : "absent");
}

REGISTER_COMMAND(Command{
    "info", "Show what a GGUF file holds: GGUF facts, hyperparameters, tensors, tokenizer", 60,
    [](CLI::App& sub) -> std::function<int()> {
      auto model = std::make_shared<std::string>();
      auto json = std::make_shared<bool>(false);
      sub.add_option("-m,--model", *model, "GGUF file (default: the cached SmolLM2 model)");
      sub.add_flag("--json", *json, "print one JSON object instead of text");
      return [model, json]() {
        const ordered_json j = describe(resolve_model_path(*model));
        if (*json) {
          std::printf("%s\n", j.dump(2).c_str());
        } else {
          print_text(j);
        }
        return 0;
      };
    }});

}  // namespace

}  // namespace smolrt::app
