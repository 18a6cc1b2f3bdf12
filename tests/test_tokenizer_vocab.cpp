// VocabData from GGUF metadata (the shared vocab fixtures, stories260K) and through
// vocab_to_gguf -> GGUF bytes -> vocab_from_gguf; metadata errors name the key.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

VocabData from_file(const std::filesystem::path& p) {
  return vocab_from_gguf(*gguf::File::open(p.string()));
}

VocabData from_writer(const gguf::Writer& w) {
  const auto bytes = w.to_bytes();
  return vocab_from_gguf(*gguf::File::parse(bytes, "test.gguf"));
}

TEST(TokenizerVocab, Gpt2Fixture) {
  REQUIRE_FIXTURE(p, "vocab/ggml-vocab-gpt-2.gguf");
  const VocabData v = from_file(p);
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(v.pre, "gpt-2");
  EXPECT_EQ(v.tokens.size(), 50257u);
  EXPECT_EQ(v.token_types.size(), 50257u);
  EXPECT_EQ(v.merges.size(), 50000u);
  EXPECT_EQ(v.merges[0], "Ġ t");
  EXPECT_TRUE(v.scores.empty());
  EXPECT_EQ(v.bos, 50256);
  EXPECT_EQ(v.eos, 50256);
  EXPECT_EQ(v.unk, -1);
  EXPECT_FALSE(v.add_bos);
  EXPECT_EQ(v.token_types[50256], static_cast<int32_t>(TokenType::Control));
}

TEST(TokenizerVocab, SpmFixtures) {
  REQUIRE_FIXTURE(p, "vocab/ggml-vocab-llama-spm.gguf");
  const VocabData v = from_file(p);
  EXPECT_EQ(v.model, "llama");
  EXPECT_EQ(v.tokens.size(), 32000u);
  EXPECT_EQ(v.scores.size(), 32000u);
  EXPECT_EQ(v.unk, 0);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_TRUE(v.add_bos);
  EXPECT_EQ(v.token_types[3], static_cast<int32_t>(TokenType::Byte));
  EXPECT_EQ(v.tokens[3], "<0x00>");

  // stories260K: no add_bos key (SPM default: true), padding id 0xFFFFFFFF meaning "none".
  REQUIRE_FIXTURE(s, "models/stories260K.gguf");
  const VocabData st = from_file(s);
  EXPECT_EQ(st.tokens.size(), 512u);
  EXPECT_TRUE(st.add_bos);
  EXPECT_EQ(st.pad, -1);
  const Tokenizer tok(st);
  const auto ids = tok.encode("Once upon a time");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(tok.decode(ids), "Once upon a time");
}

TEST(TokenizerVocab, HfJsonThroughGgufRoundTrips) {
  REQUIRE_FIXTURE(p, "tokenizers/smollm2-135m/tokenizer.json");
  const VocabData a = vocab_from_hf_json(p.string());
  gguf::Writer w;
  vocab_to_gguf(a, w);
  const VocabData b = from_writer(w);
  EXPECT_EQ(b.model, a.model);
  EXPECT_EQ(b.pre, "smollm");
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(b.token_types, a.token_types);
  EXPECT_EQ(b.merges, a.merges);
  EXPECT_EQ(b.bos, 1);
  EXPECT_EQ(b.eos, 2);
  EXPECT_EQ(b.pad, a.pad);
  EXPECT_EQ(b.add_bos, false);
  const Tokenizer ta(a), tb(b);
  const std::string text = "<|im_start|>user\nWhat is 12+30? Let's see 🦙<|im_end|>\n";
  EXPECT_EQ(ta.encode(text), tb.encode(text));
}

TEST(TokenizerVocab, MetadataErrorsNameTheKey) {
  auto base = [] {
    gguf::Writer w;
    VocabData v;
    v.model = "gpt2";
    for (int b = 0; b < 256; ++b) v.tokens.push_back("tok" + std::to_string(b));
    vocab_to_gguf(v, w);
    return w;
  };
  auto expect_error = [](const gguf::Writer& w, const std::string& needle) {
    try {
      const VocabData v = from_writer(w);
      Tokenizer t(v);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    gguf::Writer w = base();
    w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(99999));
    expect_error(w, "tokenizer.ggml.bos_token_id");
  }
  {
    gguf::Writer w = base();
    w.remove("tokenizer.ggml.tokens");
    expect_error(w, "tokenizer.ggml.tokens");
  }
  {
    gguf::Writer w = base();
    w.set("tokenizer.ggml.token_type", gguf::Value::i32_array({1, 1, 1}));
    expect_error(w, "tokenizer.ggml.token_type");
  }
  {
    gguf::Writer w = base();
    w.set("tokenizer.ggml.pre", gguf::Value::str("mystery"));
    expect_error(w, "mystery");
  }
  {
    gguf::Writer w = base();
    w.set("tokenizer.ggml.model", gguf::Value::str("bert"));
    expect_error(w, "bert");
  }
}

}  // namespace
}  // namespace smolrt
