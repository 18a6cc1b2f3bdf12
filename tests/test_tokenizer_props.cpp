// Tokenizer properties on random data: decode(encode(s)) == s, StreamDecoder == one-shot decode
// for any split and never emits a broken UTF-8 character; invalid UTF-8 never crashes; a small
// hand-built SPM vocab checks score-ordered merges, byte fallback and the leading space.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace smolrt {
namespace {

bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const int n = unicode::utf8_decode_one(p + i, s.size() - i, &cp);
    if (n == 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

// Random valid UTF-8 mixing ASCII, whitespace, scripts, marks, emoji and arbitrary code points.
// SmolLM2's vocab has no token for bytes 0x04 0x06 0x13 0x14 0x16 0x1D or the lead bytes F1/F2
// (U+40000..U+BFFFF), so `smollm_safe` avoids those (Hugging Face drops them too).
std::string random_utf8(std::mt19937& rng, bool smollm_safe) {
  std::uniform_int_distribution<int> len_d(0, 40), kind_d(0, 7);
  const int len = len_d(rng);
  std::string s;
  for (int i = 0; i < len; ++i) {
    uint32_t cp = 0;
    switch (kind_d(rng)) {
      case 0:
        cp = std::uniform_int_distribution<uint32_t>(0x20, 0x7E)(rng);
        break;
      case 1:
        cp = " \t\n\r  "[std::uniform_int_distribution<int>(0, 5)(rng)];
        break;
      case 2:
        cp = std::uniform_int_distribution<uint32_t>(0xA0, 0x52F)(rng);
        break;
      case 3:
        cp = std::uniform_int_distribution<uint32_t>(0x300, 0x36F)(rng);
        break;
      case 4:
        cp = std::uniform_int_distribution<uint32_t>(0x4E00, 0x9FFF)(rng);
        break;
      case 5:
        cp = std::uniform_int_distribution<uint32_t>(0x1F300, 0x1F64F)(rng);
        break;
      case 6:
        cp = std::uniform_int_distribution<uint32_t>(0x900, 0xE7F)(rng);
        break;
      default:
        do {
          cp = std::uniform_int_distribution<uint32_t>(0, 0x10FFFF)(rng);
        } while ((cp >= 0xD800 && cp <= 0xDFFF) ||
                 (smollm_safe && ((cp >= 0x40000 && cp <= 0xBFFFF) || cp == 0x04 || cp == 0x06 ||
                                  cp == 0x13 || cp == 0x14 || cp == 0x16 || cp == 0x1D)));
    }
    unicode::append_utf8(cp, s);
  }
  return s;
}

// Streams `ids` in random chunks; checks every emitted chunk and the total.
void check_stream(const Tokenizer& tok, const std::vector<int>& ids, std::mt19937& rng) {
  const std::string whole = tok.decode(ids);
  StreamDecoder sd(tok);
  std::string streamed;
  for (int id : ids) {
    const std::string part = sd.push(id);
    ASSERT_TRUE(valid_utf8(part)) << "mid-stream output is not whole UTF-8 characters";
    streamed += part;
    if (rng() % 4 == 0) {
      ASSERT_TRUE(valid_utf8(streamed));
    }
  }
  streamed += sd.flush();
  EXPECT_EQ(streamed, whole);
}

// --- byte-level BPE (SmolLM2) ---------------------------------------------------------------

TEST(TokenizerProps, SmolLMRoundTripRandomUtf8) {
  const Tokenizer* tok = test::smollm_tokenizer();
  if (!tok) GTEST_SKIP() << "skipped: fixtures not found (tokenizers/smollm2-135m)";
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    const std::string s = random_utf8(rng, true);
    const auto ids = tok->encode(s, false);
    ASSERT_EQ(tok->decode(ids), s) << "case " << i;
    check_stream(*tok, ids, rng);
  }
}

TEST(TokenizerProps, SmolLMInvalidUtf8IsBytes) {
  const Tokenizer* tok = test::smollm_tokenizer();
  if (!tok) GTEST_SKIP() << "skipped: fixtures not found (tokenizers/smollm2-135m)";
  // A truncated 3-byte sequence, a lone continuation byte, a surrogate encoding: all bytes the
  // vocab has tokens for, so they round-trip exactly.
  const std::string bad = "ok\xE2\x82 x\x80y\xED\xA0\x80z";
  const auto ids = tok->encode(bad);
  EXPECT_EQ(tok->decode(ids), bad);
  // 0xC0 never occurs in UTF-8 and has no token (and SmolLM2 has no unk): it is dropped.
  EXPECT_EQ(tok->decode(tok->encode("a\xC0"
                                    "b")),
            "ab");
  // Random bytes never crash and never produce an out-of-range id.
  std::mt19937 rng(7);
  for (int i = 0; i < 500; ++i) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    for (int id : tok->encode(s)) ASSERT_TRUE(id >= 0 && id < tok->n_vocab());
  }
}

TEST(TokenizerProps, StreamHoldsSplitCharacter) {
  const Tokenizer* tok = test::smollm_tokenizer();
  if (!tok) GTEST_SKIP() << "skipped: fixtures not found (tokenizers/smollm2-135m)";
  // "日" is 3 bytes split over the pieces "æĹ" (2 bytes) and "¥" (1 byte).
  const auto ids = tok->encode("日");
  ASSERT_EQ(ids.size(), 2u);
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.push(ids[0]), "");  // half a character is held back
  EXPECT_EQ(sd.push(ids[1]), "日");
  EXPECT_EQ(sd.flush(), "");
}

// --- BPE ignore_merges (Llama 3)
// ------------------------------------------------------------------

// The 256 byte tokens, "ab" (256, no merge leads to it) and "cd" (257, merge "c d").
VocabData tiny_bpe(const std::string& pre, int ignore_merges) {
  VocabData v;
  v.model = "gpt2";
  v.pre = pre;
  v.ignore_merges = ignore_merges;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(unicode::byte_to_utf8(static_cast<uint8_t>(b)));
  v.tokens.push_back("ab");
  v.tokens.push_back("cd");
  v.merges = {"c d"};
  return v;
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWordsForLlama3) {
  const int a = 'a', b = 'b', sp = ' ';  // token id b is raw byte b here
  const int ab = 256, cd = 257;
  const std::vector<int> whole = {ab, sp, cd}, merged = {a, b, sp, cd};
  // llama-bpe: on by default (as llama.cpp); the word "ab" is a token, " cd" is not (merges).
  EXPECT_EQ(Tokenizer(tiny_bpe("llama-bpe", -1)).encode("ab cd", false, 0), whole);
  // Off for the other pre-tokenizers, and wherever a tokenizer.json says so.
  EXPECT_EQ(Tokenizer(tiny_bpe("qwen2", -1)).encode("ab cd", false, 0), merged);
  EXPECT_EQ(Tokenizer(tiny_bpe("gpt-2", -1)).encode("ab cd", false, 0), merged);
  EXPECT_EQ(Tokenizer(tiny_bpe("llama-bpe", 0)).encode("ab cd", false, 0), merged);
  EXPECT_EQ(Tokenizer(tiny_bpe("qwen2", 1)).encode("ab cd", false, 0), whole);
}

// --- SPM on a small hand-built vocab ------------------------------------------------------------

// <unk> <s> </s>, the 256 byte tokens, then pieces with scores.
VocabData tiny_spm() {
  VocabData v;
  v.model = "llama";
  auto add = [&](std::string p, TokenType t, float score) {
    v.tokens.push_back(std::move(p));
    v.token_types.push_back(static_cast<int32_t>(t));
    v.scores.push_back(score);
  };
  add("<unk>", TokenType::Unknown, 0);
  add("<s>", TokenType::Control, 0);
  add("</s>", TokenType::Control, 0);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, TokenType::Byte, 0);
  }
  // ids 259.. : "▁" = U+2581
  add("\xE2\x96\x81", TokenType::Normal, -1);       // 259
  add("h", TokenType::Normal, -2);                  // 260
  add("e", TokenType::Normal, -2);                  // 261
  add("l", TokenType::Normal, -2);                  // 262
  add("o", TokenType::Normal, -2);                  // 263
  add("he", TokenType::Normal, -5);                 // 264
  add("ll", TokenType::Normal, -3);                 // 265
  add("llo", TokenType::Normal, -4);                // 266
  add("\xE2\x96\x81h", TokenType::Normal, -6);      // 267
  add("\xE2\x96\x81he", TokenType::Normal, -7);     // 268
  add("\xE2\x96\x81hello", TokenType::Normal, -8);  // 269
  add("hel", TokenType::Normal, -9);                // 270
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_bos = true;
  v.add_space_prefix = true;  // llama.cpp's default for SPM files without the key
  return v;
}

TEST(TokenizerSpm, ScoreOrderedMerges) {
  const Tokenizer tok(tiny_spm());
  // "▁hello" = ▁ h e l l o: ll(-3) beats he(-5) and ▁h(-6); then llo(-4); then he(-5); then
  // ▁he(-7); then ▁hello(-8).
  EXPECT_EQ(tok.encode("hello"), (std::vector<int>{1, 269}));
  EXPECT_EQ(tok.encode("hello", true, 0), (std::vector<int>{269}));
  // "▁hel": he(-5), then ▁he(-7) beats hel(-9); "▁hel" is no piece, so ▁he + l.
  EXPECT_EQ(tok.encode("hello hel", true, 0), (std::vector<int>{269, 268, 262}));
}

TEST(TokenizerSpm, ByteFallbackAndLeadingSpace) {
  const Tokenizer tok(tiny_spm());
  // "é" (C3 A9) is not a piece: two byte tokens 3 + 0xC3, 3 + 0xA9.
  EXPECT_EQ(tok.encode("\xC3\xA9", true, 0), (std::vector<int>{259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.decode(tok.encode("\xC3\xA9")), "\xC3\xA9");
  // The leading "▁" encode adds is removed by decode; other spaces stay.
  EXPECT_EQ(tok.decode(tok.encode(" hello  he")), " hello  he");
  // Empty text: BOS only (the vocab adds it), nothing when BOS is off.
  EXPECT_EQ(tok.encode(""), std::vector<int>{1});
  EXPECT_TRUE(tok.encode("", true, 0).empty());
  // Special tokens in text split it; each following text starts with "▁" again.
  EXPECT_EQ(tok.encode("he</s>he", true, 0), (std::vector<int>{268, 2, 268}));
  EXPECT_EQ(tok.decode(tok.encode("he</s>he", true, 0), true), "he</s>he");
  EXPECT_NE(tok.encode("</s>", false, 0), std::vector<int>{2});
}

// Gemma's files say tokenizer.ggml.add_space_prefix = false: no "▁" before the text or after a
// token written in it, and decode keeps a leading "▁" as a space.
TEST(TokenizerSpm, NoSpacePrefixAsTheFileSays) {
  VocabData v = tiny_spm();
  v.add_space_prefix = false;
  const Tokenizer tok(v);
  // "hello": ll(-3), llo(-4), he(-5) -> he + llo; " hello" is the "▁hello" piece.
  EXPECT_EQ(tok.encode("hello", true, 0), (std::vector<int>{264, 266}));
  EXPECT_EQ(tok.encode(" hello", true, 0), (std::vector<int>{269}));
  EXPECT_EQ(tok.encode("he</s>he", true, 0), (std::vector<int>{264, 2, 264}));
  EXPECT_EQ(tok.decode(std::vector<int>{269}), " hello");
  EXPECT_EQ(tok.decode(tok.encode("he</s> hello", true, 0), true), "he</s> hello");
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    const std::string s = random_utf8(rng, false) + " hello";
    ASSERT_EQ(tok.decode(tok.encode(s, false)), s) << "case " << i;
  }
}

// With the prefix on, encode puts "▁" after a user-defined token too (llama.cpp), so decode
// drops it there as after a control token: the round trip stays exact.
TEST(TokenizerSpm, UserDefinedTokenRoundTripsWithPrefix) {
  VocabData v = tiny_spm();
  v.tokens.push_back("<t>");
  v.token_types.push_back(static_cast<int32_t>(TokenType::UserDefined));
  v.scores.push_back(0);
  const int ut = static_cast<int>(v.tokens.size()) - 1;
  const Tokenizer tok(v);
  EXPECT_EQ(tok.encode("he<t>he", false, 0), (std::vector<int>{268, ut, 268}));
  EXPECT_EQ(tok.decode(tok.encode("he<t>he", false, 0)), "he<t>he");
  EXPECT_EQ(tok.decode(tok.encode("he<t> he", false, 0)), "he<t> he");
}

TEST(TokenizerSpm, StreamMatchesDecodeRandom) {
  const Tokenizer tok(tiny_spm());
  std::mt19937 rng(3);
  for (int i = 0; i < 500; ++i) {
    const std::string s = random_utf8(rng, false) + " hello";
    const auto ids = tok.encode(s, false);
    ASSERT_EQ(tok.decode(ids), s) << "case " << i;
    check_stream(tok, ids, rng);
  }
  // The first streamed piece loses the encoder's leading space, later ones keep theirs.
  StreamDecoder sd(tok);
  EXPECT_EQ(sd.push(269), "hello");
  EXPECT_EQ(sd.push(269), " hello");
}

// --- errors -------------------------------------------------------------------------------------

TEST(TokenizerErrors, UnknownPreTokenizerListsKnownOnes) {
  VocabData v = tiny_spm();
  v.model = "gpt2";
  v.pre = "deepseek-llm";
  try {
    Tokenizer t(v);
    FAIL() << "no error for an unknown pre-tokenizer";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("deepseek-llm"), std::string::npos) << m;
    EXPECT_NE(m.find("gpt-2"), std::string::npos) << m;
    EXPECT_NE(m.find("llama-bpe"), std::string::npos) << m;
    EXPECT_NE(m.find("qwen2"), std::string::npos) << m;
    EXPECT_NE(m.find("smollm"), std::string::npos) << m;
    EXPECT_NE(m.find("starcoder"), std::string::npos) << m;
  }
}

TEST(TokenizerErrors, UnknownModelAndBadArrays) {
  VocabData v = tiny_spm();
  v.model = "wordpiece";
  EXPECT_THROW(Tokenizer{v}, Error);
  v = tiny_spm();
  v.token_types.pop_back();
  EXPECT_THROW(Tokenizer{v}, Error);
  v = tiny_spm();
  v.bos = 100000;
  EXPECT_THROW(Tokenizer{v}, Error);
  const Tokenizer tok(tiny_spm());
  EXPECT_THROW(tok.piece(-1), Error);
  EXPECT_THROW(tok.piece(tok.n_vocab()), Error);
  const std::vector<int> bad = {5, 99999};
  EXPECT_THROW(tok.decode(bad), Error);
}

TEST(TokenizerErrors, HfJsonProblemsAreErrors) {
  EXPECT_THROW(vocab_from_hf_json("/nonexistent/tokenizer.json"), Error);
  const auto dir = std::filesystem::temp_directory_path() / "smolrt_tok_test";
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& body) {
    const auto p = dir / "tokenizer.json";
    FILE* f = std::fopen(p.c_str(), "wb");
    std::fwrite(body.data(), 1, body.size(), f);
    std::fclose(f);
    return p.string();
  };
  EXPECT_THROW(vocab_from_hf_json(write("{not json")), Error);
  EXPECT_THROW(vocab_from_hf_json(write(R"({"model": {"type": "Unigram"}})")), Error);
  EXPECT_THROW(vocab_from_hf_json(write(R"({"model": {"type": "BPE", "vocab": {"a": 1}},
      "pre_tokenizer": {"type": "ByteLevel"}})")),
               Error);  // id 0 missing
  EXPECT_THROW(vocab_from_hf_json(write(R"({"model": {"type": "BPE", "vocab": []},
      "pre_tokenizer": {"type": "ByteLevel"}})")),
               Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace smolrt
