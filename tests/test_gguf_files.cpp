// The real GGUF files in ../shared load with the facts docs/facts.md gives; `smolrt info` on them
// (run as a binary) reports the same; the default model loads when it is cached.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "test_util.h"

namespace smolrt {
namespace {

// Runs the smolrt binary with `args` (and `env` assignments before it) through the shell; with
// merge_stderr, out holds stderr after stdout.
test::Proc run(const std::string& args, bool merge_stderr, const std::string& env = "") {
  test::Proc p = test::run_shell(cat(env, " '", SMOLRT_BINARY, "' ", args));
  if (merge_stderr) p.out += p.err;
  return p;
}

TEST(GgufFiles, Stories260K) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const Model m = load_model(path.string());
  const gguf::File& f = *m.file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rope_dim, 8);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.n_ctx_train, 2048);
  EXPECT_FALSE(c.tied_output);
  EXPECT_NE(m.weights.output.data, m.weights.token_embd.data);
  EXPECT_EQ(m.weights.layers.size(), 5u);
  EXPECT_EQ(f.tensors().size(), 2u + 1u + 5u * 9u);
  for (const gguf::TensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.type, GgmlType::F32) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u) << t.name;  // mmap + alignment
  }
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");  // SPM
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").size(), 512u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.eos_token_id"), 2u);
  // Norm weights of a trained model are not all one value: the views point at real data.
  const float* norm = static_cast<const float*>(m.weights.layers[0].attn_norm.data);
  bool varied = false;
  for (int i = 1; i < c.dim; ++i) varied |= norm[i] != norm[0];
  EXPECT_TRUE(varied);
}

TEST(GgufFiles, VocabOnlyFiles) {
  struct Case {
    const char* rel;
    const char* model;
    const char* pre;
    size_t n_tokens;
  };
  for (const Case& k : {Case{"vocab/ggml-vocab-gpt-2.gguf", "gpt2", "gpt-2", 50257},
                        Case{"vocab/ggml-vocab-starcoder.gguf", "gpt2", "starcoder", 49152},
                        Case{"vocab/ggml-vocab-llama-spm.gguf", "llama", "default", 32000}}) {
    REQUIRE_FIXTURE(path, k.rel);
    const auto f = gguf::File::open(path.string());
    EXPECT_EQ(f->tensors().size(), 0u) << k.rel;
    EXPECT_EQ(f->get_string("tokenizer.ggml.model"), k.model) << k.rel;
    EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), k.pre) << k.rel;
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), k.n_tokens) << k.rel;
    // Not a model: load_config says so clearly.
    EXPECT_THROW(load_config(*f), Error) << k.rel;
  }
}

TEST(GgufInfo, JsonOnStories) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const test::Proc r = run(cat("info -m '", path.string(), "' --json"), false);
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["gguf_version"], 3);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["file_size"], std::filesystem::file_size(path));
  const auto& m = j["model"];
  EXPECT_EQ(m["supported"], true);
  EXPECT_EQ(m["dim"], 64);
  EXPECT_EQ(m["n_layers"], 5);
  EXPECT_EQ(m["n_heads"], 8);
  EXPECT_EQ(m["n_kv_heads"], 4);
  EXPECT_EQ(m["head_dim"], 8);
  EXPECT_EQ(m["hidden_dim"], 172);
  EXPECT_EQ(m["vocab_size"], 512);
  EXPECT_EQ(m["n_ctx_train"], 2048);
  EXPECT_EQ(m["tied_output"], false);
  const auto& t = j["tensors"];
  EXPECT_EQ(t["count"], 48);
  EXPECT_EQ(t["by_type"]["f32"], 48);
  EXPECT_EQ(t["by_type"].size(), 1u);
  EXPECT_EQ(t["bytes"].get<uint64_t>(), t["params"].get<uint64_t>() * 4);
  const auto& k = j["tokenizer"];
  EXPECT_EQ(k["model"], "llama");
  EXPECT_EQ(k["vocab_size"], 512);
  EXPECT_EQ(k["bos_token_id"], 1);
  EXPECT_EQ(k["eos_token_id"], 2);
  EXPECT_EQ(k["padding_token_id"], "none");  // stored as 0xFFFFFFFF: "no such token"
  EXPECT_TRUE(k["eot_token_id"].is_null());  // key absent
  EXPECT_EQ(k["chat_template"], false);
}

TEST(GgufInfo, TextOnVocabOnlyFileSaysModelAbsent) {
  REQUIRE_FIXTURE(path, "vocab/ggml-vocab-starcoder.gguf");
  const test::Proc r = run(cat("info -m '", path.string(), "'"), true);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("absent or unsupported"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("architecture 'starcoder2' is not supported"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pre starcoder"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tensors:       0"), std::string::npos) << r.out;
}

TEST(GgufInfo, MissingAndCorruptFilesFailClearly) {
  const test::Proc r = run("info -m /nonexistent/model.gguf", true);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("smolrt info: error:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/model.gguf"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  // A file that is not GGUF.
  const test::Proc c = run(cat("info -m '", SMOLRT_BINARY, "'"), true);
  EXPECT_EQ(c.rc, 1) << c.out;
  EXPECT_NE(c.out.find("not 'GGUF'"), std::string::npos) << c.out;
}

TEST(GgufInfo, WithoutModelFlagUsesTheDefaultModel) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const test::Proc r = run("info --json", false, cat("SMOLRT_MODEL='", path.string(), "'"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["model"]["n_layers"], 5);
  const test::Proc m = run("info", true, "SMOLRT_MODEL=/nonexistent/default.gguf");
  EXPECT_EQ(m.rc, 1) << m.out;
  EXPECT_NE(m.out.find("/nonexistent/default.gguf"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find("scripts/fetch_model.sh"), std::string::npos) << m.out;
}

TEST(GgufFiles, DefaultModel) {
  REQUIRE_DEFAULT_MODEL(path);
  const Model m = load_model(path.string());
  EXPECT_EQ(m.config.arch, "llama");
  EXPECT_EQ(m.config.dim, 576);
  EXPECT_EQ(m.config.n_layers, 30);
  EXPECT_EQ(m.config.n_heads, 9);
  EXPECT_EQ(m.config.n_kv_heads, 3);
  EXPECT_EQ(m.config.hidden_dim, 1536);
  EXPECT_EQ(m.config.vocab_size, 49152);
  EXPECT_TRUE(m.config.tied_output);
  EXPECT_EQ(m.file->get_string("tokenizer.ggml.pre"), "smollm");
  const test::Proc r = run(cat("info --json -m '", path.string(), "'"), false);
  ASSERT_EQ(r.rc, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out)["model"]["dim"], 576);
}

}  // namespace
}  // namespace smolrt
