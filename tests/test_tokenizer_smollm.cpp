// SmolLM2's tokenizer (tokenizer.json loaded directly): hand-worked cases. Each expected piece
// follows from the pre-tokenizer rules (single digits split off, then the GPT-2 pattern, then
// byte-level BPE); each id is that piece's entry in tokenizer.json's "vocab" (or added_tokens),
// looked up by hand and confirmed with Hugging Face tokenizers 0.23.3.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

#define REQUIRE_SMOLLM(tok)                                                            \
  const Tokenizer* tok = test::smollm_tokenizer();                                     \
  if (!tok)                                                                            \
  GTEST_SKIP() << "skipped: fixtures not found ("                                      \
               << (fixtures_dir() / "tokenizers/smollm2-135m/tokenizer.json").string() \
               << "); set SMOLRT_FIXTURES"

struct Case {
  const char* name;
  std::string text;
  std::vector<int> ids;
  std::vector<std::string> pieces;
};

void expect_case(const Tokenizer& tok, const Case& c) {
  SCOPED_TRACE(c.name);
  const std::vector<int> ids = tok.encode(c.text);
  EXPECT_EQ(ids, c.ids);
  std::vector<std::string> pieces;
  for (int id : ids) pieces.push_back(tok.piece(id));
  EXPECT_EQ(pieces, c.pieces);
  EXPECT_EQ(tok.decode(ids, /*special=*/true), c.text);
}

TEST(TokenizerSmolLM, VocabShape) {
  REQUIRE_SMOLLM(tok);
  EXPECT_EQ(tok->n_vocab(), 49152);
  EXPECT_EQ(tok->vocab().model, "gpt2");
  EXPECT_EQ(tok->vocab().pre, "smollm");
  EXPECT_EQ(tok->vocab().merges.size(), 48900u);
  EXPECT_EQ(tok->vocab().bos, 1);
  EXPECT_EQ(tok->vocab().eos, 2);
  EXPECT_FALSE(tok->vocab().add_bos);
  EXPECT_EQ(tok->piece(0), "<|endoftext|>");
  EXPECT_EQ(tok->piece(1), "<|im_start|>");
  EXPECT_EQ(tok->piece(2), "<|im_end|>");
  for (int id = 0; id <= 16; ++id) {
    EXPECT_EQ(tok->vocab().token_types[id], static_cast<int32_t>(TokenType::Control)) << id;
  }
  EXPECT_EQ(tok->vocab().token_types[17], static_cast<int32_t>(TokenType::Normal));
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_TRUE(tok->is_eog(0));  // <|endoftext|>
  EXPECT_FALSE(tok->is_eog(1));
  EXPECT_FALSE(tok->is_eog(19556));
}

TEST(TokenizerSmolLM, Digits) {
  REQUIRE_SMOLLM(tok);
  // Every digit is its own word; the space before a digit is a word of its own.
  expect_case(*tok, {"year", "2024", {34, 32, 34, 36}, {"2", "0", "2", "4"}});
  expect_case(*tok, {"space digits", "x 42", {104, 216, 36, 34}, {"x", "Ġ", "4", "2"}});
}

TEST(TokenizerSmolLM, Contractions) {
  REQUIRE_SMOLLM(tok);
  expect_case(*tok, {"don't", "don't", {12420, 982}, {"don", "'t"}});
  expect_case(*tok, {"we'll", "We'll", {1882, 3060}, {"We", "'ll"}});
  // Contractions are case-sensitive: "'M" is punctuation then a letter word.
  expect_case(*tok, {"I'M", "I'M", {57, 23, 61}, {"I", "'", "M"}});
}

TEST(TokenizerSmolLM, Whitespace) {
  REQUIRE_SMOLLM(tok);
  // \s+(?!\S) leaves the last space of a run to start the next word.
  expect_case(*tok, {"3 spaces", "a   b", {81, 256, 278}, {"a", "ĠĠ", "Ġb"}});
  // Between words "\n\n" splits in two (the run gives its last char back, which then stands
  // alone); at the end of the text it stays one word.
  expect_case(*tok, {"blank line", "a\n\nb", {81, 198, 198, 82}, {"a", "Ċ", "Ċ", "b"}});
  expect_case(*tok, {"trailing newlines", "\n\n", {1116}, {"ĊĊ"}});
  expect_case(*tok, {"tab", "\tx", {197, 104}, {"ĉ", "x"}});
  expect_case(*tok, {"crlf", "a\r\nb", {81, 201, 198, 82}, {"a", "č", "Ċ", "b"}});
  expect_case(*tok, {"indent",
                     "def f(x):\n    return x",
                     {1604, 275, 24, 104, 727, 472, 1003, 1792},
                     {"def", "Ġf", "(", "x", "):", "ĊĠĠĠ", "Ġreturn", "Ġx"}});
}

TEST(TokenizerSmolLM, EmojiAndCombining) {
  REQUIRE_SMOLLM(tok);
  // Woman + ZWJ + laptop: one "other" word, merged only within the UTF-8 bytes the vocab knows.
  expect_case(*tok, {"zwj",
                     "👩\u200d💻",
                     {10813, 235, 119, 321, 231, 10813, 236, 136},
                     {"ðŁ", "ĳ", "©", "âĢ", "į", "ðŁ", "Ĵ", "»"}});
  expect_case(*tok,
              {"flag", "🇫🇷", {10813, 225, 121, 10813, 225, 132}, {"ðŁ", "ĩ", "«", "ðŁ", "ĩ", "·"}});
  expect_case(*tok, {"precomposed", "é", {2756}, {"Ã©"}});
  // A combining acute accent is not a letter: "e" and U+0301 are separate words.
  expect_case(*tok, {"combining", "e\u0301", {85, 151, 219}, {"e", "Ì", "ģ"}});
}

TEST(TokenizerSmolLM, Scripts) {
  REQUIRE_SMOLLM(tok);
  expect_case(
      *tok,
      {"cjk", "日本語", {23274, 115, 40993, 179, 120, 248}, {"æĹ", "¥", "æľ¬", "è", "ª", "ŀ"}});
  expect_case(
      *tok,
      {"arabic", "مرحبا", {21706, 20602, 44626, 31462, 10805}, {"Ùħ", "Ø±", "ØŃ", "Ø¨", "Ø§"}});
  // Devanagari vowel signs / virama are marks, not letters, so they break the letter run.
  expect_case(*tok, {"devanagari",
                     "नमस्ते",
                     {30658, 35090, 38770, 16525, 26293, 30581},
                     {"à¤¨", "à¤®", "à¤¸", "à¥į", "à¤¤", "à¥ĩ"}});
}

TEST(TokenizerSmolLM, Url) {
  REQUIRE_SMOLLM(tok);
  expect_case(*tok, {"url",
                     "https://example.com/a?b=1",
                     {4687, 1742, 7434, 30, 824, 31, 81, 47, 82, 45, 33},
                     {"https", "://", "example", ".", "com", "/", "a", "?", "b", "=", "1"}});
  expect_case(*tok, {"prose", "Hello world", {19556, 905}, {"Hello", "Ġworld"}});
  expect_case(*tok, {"leading space", " Hello", {38699}, {"ĠHello"}});
}

TEST(TokenizerSmolLM, SpecialTokensInText) {
  REQUIRE_SMOLLM(tok);
  expect_case(*tok, {"chat",
                     "<|im_start|>user\nHi<|im_end|>",
                     {1, 4093, 198, 26843, 2},
                     {"<|im_start|>", "user", "Ċ", "Hi", "<|im_end|>"}});
  expect_case(*tok, {"eot inside", "a<|endoftext|>b", {81, 0, 82}, {"a", "<|endoftext|>", "b"}});
  // Without special parsing the same text is ordinary characters.
  const auto plain = tok->encode("<|im_start|>", /*parse_special=*/false);
  EXPECT_GT(plain.size(), 1u);
  for (int id : plain) EXPECT_GE(id, 17) << "no control token without parse_special";
  EXPECT_EQ(tok->decode(plain), "<|im_start|>");
  // Control tokens render only when asked.
  const std::vector<int> chat = {1, 4093, 2};
  EXPECT_EQ(tok->decode(chat), "user");
  EXPECT_EQ(tok->decode(chat, true), "<|im_start|>user<|im_end|>");
}

TEST(TokenizerSmolLM, EmptyAndBos) {
  REQUIRE_SMOLLM(tok);
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_EQ(tok->encode("", true, 1), std::vector<int>{1});  // forced BOS = <|im_start|>
  EXPECT_EQ(tok->encode("Hello", true, 1), (std::vector<int>{1, 19556}));
}

}  // namespace
}  // namespace smolrt
