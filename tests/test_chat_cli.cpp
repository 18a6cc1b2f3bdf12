// `smolrt chat` driven through a pipe (stdin not a terminal): two turns and /exit, no prompt
// decorations, replies identical to an in-process ChatSession; bad options are clear errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/chat.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

using test::Proc;

Proc run_chat(const std::string& args, const std::string& input) {
  return test::run_shell(cat("'", SMOLRT_BINARY, "' chat ", args), input);
}

TEST(ChatCli, TwoTurnsThroughAPipeThenExit) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const std::string args = "-m '" + path.string() +
                           "' --chat-template chatml --backend cpu-ref --ctx 256 --temp 0 -n 10 "
                           "--system 'You tell stories.'";
  const Proc p = run_chat(args, "Once upon a time\nThe dog ran\n/exit\nnever read\n");
  ASSERT_EQ(p.rc, 0) << p.err;

  // The same conversation in-process.
  const Model model = load_model(path.string());
  const Tokenizer tok(vocab_from_gguf(*model.file));
  BackendOptions bo;
  bo.kind = "cpu-ref";
  bo.n_ctx = 256;
  auto be = make_backend(model, bo);
  ChatOptions o;
  o.sampling.temp = 0.0f;
  o.max_tokens = 10;
  o.system = "You tell stories.";
  ChatSession s(*be, tok, o);
  const std::string r1 = s.turn("Once upon a time").text;
  const std::string r2 = s.turn("The dog ran").text;
  ASSERT_FALSE(r1.empty());
  // Exactly the two replies, one per line: no "> " prompts, nothing for the line after /exit.
  EXPECT_EQ(p.out, r1 + "\n" + r2 + "\n");
}

TEST(ChatCli, EndOfInputEndsTheChatAndResetWorks) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const std::string args =
      "-m '" + path.string() + "' --chat-template chatml --backend cpu-ref --ctx 256 --temp 0 -n 8";
  const Proc p = run_chat(args, "Once upon a time\n/reset\nOnce upon a time\n");
  ASSERT_EQ(p.rc, 0) << p.err;
  // After /reset the same first message gives the same reply again.
  const size_t nl = p.out.find('\n');
  ASSERT_NE(nl, std::string::npos);
  EXPECT_EQ(p.out, p.out.substr(0, nl + 1) + p.out.substr(0, nl + 1)) << p.out;
}

TEST(ChatCli, BadOptionsAreClearErrors) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const std::string m = "-m '" + path.string() + "' --backend cpu-ref ";
  Proc p = run_chat(m + "--chat-template vicuna", "hi\n");
  EXPECT_NE(p.rc, 0);
  EXPECT_NE(p.err.find("--chat-template"), std::string::npos) << p.err;
  // stories260K has no chat template: auto detection says how to force ChatML.
  p = run_chat(m, "hi\n");
  EXPECT_NE(p.rc, 0);
  EXPECT_NE(p.err.find("--chat-template chatml"), std::string::npos) << p.err;
  p = run_chat(m + "--chat-template chatml --temp -1", "hi\n");
  EXPECT_NE(p.rc, 0);
  EXPECT_NE(p.err.find("--temp"), std::string::npos) << p.err;
  p = run_chat(m + "--chat-template chatml --top-p 1.5", "hi\n");
  EXPECT_NE(p.rc, 0);
  EXPECT_NE(p.err.find("--top-p"), std::string::npos) << p.err;
}

}  // namespace
}  // namespace smolrt
