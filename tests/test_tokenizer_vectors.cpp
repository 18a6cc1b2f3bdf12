// The tokenizer test vectors in ../shared/vocab: every string of each .inp must encode to exactly
// the ids on the matching line of the .out, and decode back to itself.
//
// Format: .inp holds strings separated by "\n__ggml_vocab_test__\n" and ends with the separator
// (so the piece after the last one is not a test); .out has one line per string, each id preceded
// by a space (an empty line for the empty string). The ids carry no BOS: they are encoded with
// add_bos off (and the SPM leading "▁" on), special-token parsing off.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Tokenizer load(const std::filesystem::path& p) {
  return Tokenizer(vocab_from_gguf(*gguf::File::open(p.string())));
}

void run_vectors(const std::string& name) {
  const std::string base = "vocab/ggml-vocab-" + name + ".gguf";
  REQUIRE_FIXTURE(gguf_path, base);
  REQUIRE_FIXTURE(inp_path, base + ".inp");
  REQUIRE_FIXTURE(out_path, base + ".out");
  const Tokenizer tok = load(gguf_path);

  const std::string inp = slurp(inp_path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> strings;
  size_t pos = 0;
  while (pos < inp.size()) {
    const size_t e = inp.find(sep, pos);
    ASSERT_NE(e, std::string::npos) << name << ".inp does not end with the separator";
    strings.push_back(inp.substr(pos, e - pos));
    pos = e + sep.size();
  }
  std::vector<std::vector<int>> expected;
  std::istringstream out(slurp(out_path));
  for (std::string line; std::getline(out, line);) {
    std::istringstream ls(line);
    std::vector<int> ids;
    for (int id; ls >> id;) ids.push_back(id);
    expected.push_back(ids);
  }
  ASSERT_EQ(strings.size(), expected.size()) << name << ": .inp and .out disagree on the count";
  ASSERT_GT(strings.size(), 40u);
  int failures = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::vector<int> got = tok.encode(strings[i], /*parse_special=*/false, /*add_bos=*/0);
    EXPECT_EQ(got, expected[i]) << name << " case " << i << ": '" << strings[i] << "'";
    EXPECT_EQ(tok.decode(got), strings[i]) << name << " case " << i;
    failures += got != expected[i];
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerVectors, Gpt2) {
  run_vectors("gpt-2");
}
TEST(TokenizerVectors, Starcoder) {
  run_vectors("starcoder");
}  // SmolLM's pre-tokenizer
TEST(TokenizerVectors, LlamaSpm) {
  run_vectors("llama-spm");
}

TEST(TokenizerVectors, Gpt2ArbitraryBytesRoundTrip) {
  // GPT-2's vocab has a token for every byte, so even invalid UTF-8 round-trips exactly.
  REQUIRE_FIXTURE(p, "vocab/ggml-vocab-gpt-2.gguf");
  const Tokenizer tok = load(p);
  std::mt19937 rng(11);
  for (int i = 0; i < 1000; ++i) {
    std::string s(rng() % 48, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 ? rng() % 128 : rng());
    ASSERT_EQ(tok.decode(tok.encode(s, false)), s) << "case " << i;
  }
}

TEST(TokenizerVectors, SpmAddsBosAndByteFallback) {
  REQUIRE_FIXTURE(p, "vocab/ggml-vocab-llama-spm.gguf");
  const Tokenizer tok = load(p);
  EXPECT_TRUE(tok.vocab().add_bos);
  // "Hello world" -> <s> ▁Hello ▁world
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int>{1, 15043, 3186}));
  EXPECT_EQ(tok.encode(""), std::vector<int>{1});
  // A newline has no piece: "▁" then the byte token <0x0A> (id 3 + 0x0A).
  EXPECT_EQ(tok.encode("\n", false, 0), (std::vector<int>{29871, 13}));
  EXPECT_EQ(tok.decode(tok.encode("\xF0\x9F\xA6\x99 llama\xFF")), "\xF0\x9F\xA6\x99 llama\xFF");
}

}  // namespace
}  // namespace smolrt
