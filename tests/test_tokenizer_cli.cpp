// `smolrt tokenize` end to end: output formats, --no-special, vocab-only GGUFs, errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "test_util.h"

namespace {

// Runs a shell command; returns stdout and stderr together and sets *rc to the exit code.
std::string run(const std::string& cmd, int* rc) {
  const smolrt::test::Proc p = smolrt::test::run_shell(cmd + " 2>&1");
  *rc = p.rc;
  return p.out;
}

TEST(TokenizeCli, JsonIdsOnlyAndNoSpecial) {
  REQUIRE_FIXTURE(tj, "tokenizers/smollm2-135m/tokenizer.json");
  const std::string base =
      std::string(SMOLRT_BINARY) + " tokenize --tokenizer-json '" + tj.string() + "' ";
  int rc = -1;
  EXPECT_EQ(run(base + "--json 'Hello world'", &rc),
            "{\"ids\":[19556,905],\"pieces\":[\"Hello\",\"Ġworld\"]}\n");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(run(base + "--ids-only '<|im_start|>Hi'", &rc), "1 26843\n");
  EXPECT_EQ(rc, 0);
  const std::string plain = run(base + "--ids-only --no-special '<|im_start|>Hi'", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(plain.rfind("1 ", 0), 0u) << plain;  // does not start with the control id
  EXPECT_EQ(run("printf 'Hello world' | " + base + "--ids-only", &rc), "19556 905\n");  // stdin
  EXPECT_EQ(run("echo never-read | " + base + "--ids-only ''", &rc), "\n");  // "" is empty text
  EXPECT_EQ(run("printf '\"a b\"\\n\"\"\\n' | " + base + "--jsonl", &rc),
            "{\"ids\":[81,278],\"text\":\"a b\"}\n{\"ids\":[],\"text\":\"\"}\n");
}

TEST(TokenizeCli, VocabOnlyGguf) {
  REQUIRE_FIXTURE(g, "vocab/ggml-vocab-gpt-2.gguf");
  int rc = -1;
  const std::string out =
      run(std::string(SMOLRT_BINARY) + " tokenize -m '" + g.string() + "' --ids-only 'Hello world'",
          &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "15496 995\n");
}

TEST(TokenizeCli, ErrorsExitNonZero) {
  int rc = 0;
  const std::string out =
      run(std::string(SMOLRT_BINARY) + " tokenize -m /nonexistent/model.gguf hi", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("/nonexistent/model.gguf"), std::string::npos) << out;
  rc = 0;
  const std::string bad =
      run(std::string(SMOLRT_BINARY) + " tokenize --tokenizer-json /nonexistent.json hi", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(bad.find("nonexistent.json"), std::string::npos) << bad;
}

}  // namespace
