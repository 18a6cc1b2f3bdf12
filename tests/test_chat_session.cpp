// ChatSession on the CPU backend with the real stories260K model: the second turn prefills only
// its own tokens and decodes the same tokens as prefilling the whole conversation at once;
// stop strings, context policies, seeded sampling.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/chat.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

struct Loaded {
  Model model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Backend> backend(int n_ctx = 256) const {
    BackendOptions bo;
    bo.kind = "cpu-ref";
    bo.n_ctx = n_ctx;
    bo.n_threads = 1;
    return make_backend(model, bo);
  }
};

Loaded load(const std::filesystem::path& p) {
  Loaded l{load_model(p.string()), nullptr};
  l.tok = std::make_unique<Tokenizer>(vocab_from_gguf(*l.model.file));
  return l;
}

ChatOptions greedy(int max_tokens) {
  ChatOptions o;
  o.sampling.temp = 0.0f;
  o.sampling.repeat_penalty = 1.0f;
  o.max_tokens = max_tokens;
  o.system = "You tell short stories.";
  return o;
}

// Greedy continuation of `prompt` from an empty cache, prefilled in one call.
std::vector<int> greedy_from_scratch(Backend& be, const Tokenizer& tok, std::span<const int> prompt,
                                     size_t n) {
  be.reset();
  std::span<const float> l = be.forward_prompt(prompt);
  std::vector<int> out;
  int t = cpu::argmax(l.data(), static_cast<int>(l.size()));
  while (out.size() < n && !tok.is_eog(t)) {
    out.push_back(t);
    t = be.forward_token_greedy(t, be.position());
  }
  return out;
}

TEST(ChatSession, SecondTurnPrefillsOnlyItsOwnTokensAndMatchesAFullPrefill) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const Loaded m = load(path);
  auto be = m.backend();
  ChatSession s(*be, *m.tok, greedy(12));

  const TurnResult r1 = s.turn("Once upon a time there was a dog.");
  ASSERT_FALSE(r1.tokens.empty());
  const size_t after1 = s.tokens().size();  // conversation incl. reply 1 and its end marker
  const int cached1 = be->position();       // what the KV cache holds after turn 1
  EXPECT_EQ(r1.n_prefilled + static_cast<int>(r1.tokens.size()) - 1, cached1);

  const TurnResult r2 = s.turn("The cat was sad.");
  ASSERT_FALSE(r2.tokens.empty());
  const std::vector<int> end_ids = m.tok->encode("<|im_end|>", true, 0);
  const size_t prompt2_len = s.tokens().size() - r2.tokens.size() - end_ids.size();
  // Only the tail past the cached prefix was prefilled: the last reply token, the end marker
  // and the new user turn with the assistant header.
  EXPECT_EQ(r2.n_prefilled, static_cast<int>(prompt2_len) - cached1);
  EXPECT_LT(r2.n_prefilled, static_cast<int>(prompt2_len) / 2);
  EXPECT_GT(static_cast<int>(prompt2_len), static_cast<int>(after1));

  // The whole conversation up to the second assistant header, prefilled at once on a fresh cache.
  const std::vector<int> prompt2(s.tokens().begin(),
                                 s.tokens().begin() + static_cast<std::ptrdiff_t>(prompt2_len));
  auto fresh = m.backend();
  EXPECT_EQ(greedy_from_scratch(*fresh, *m.tok, prompt2, r2.tokens.size()), r2.tokens);
}

TEST(ChatSession, StopStringCutsTheReplyAcrossTokens) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const Loaded m = load(path);
  auto be = m.backend();
  ChatSession plain(*be, *m.tok, greedy(24));
  const TurnResult full = plain.turn("Once upon a time");
  ASSERT_GE(full.text.size(), 12u) << full.text;
  // A stop string made of the tail of one piece and the head of the next, well inside the text.
  const size_t at = full.text.size() / 2;
  const std::string stop_str = full.text.substr(at - 2, 4);
  const size_t first = full.text.find(stop_str);

  auto be2 = m.backend();
  ChatOptions o = greedy(24);
  o.stops = {stop_str};
  ChatSession cut(*be2, *m.tok, o);
  std::string streamed;
  const TurnResult r = cut.turn("Once upon a time", [&](std::string_view t) { streamed += t; });
  EXPECT_EQ(r.stop, StopCause::kStopString);
  EXPECT_EQ(r.text, full.text.substr(0, first));
  EXPECT_EQ(streamed, r.text);
}

TEST(ChatSession, FullContextDropsTheOldestExchangesOrStops) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const Loaded m = load(path);
  auto be = m.backend(96);
  ChatSession s(*be, *m.tok, greedy(16));
  int dropped = 0;
  for (int i = 0; i < 6; ++i) {
    const TurnResult r = s.turn("Tell me about the big red ball.");
    dropped += r.n_dropped;
    EXPECT_LE(be->position(), be->n_ctx());
    ASSERT_EQ(s.messages().front().role, "system");  // the system prompt always stays
  }
  EXPECT_GT(dropped, 0) << "96 tokens cannot hold 6 exchanges";

  auto be2 = m.backend(96);
  ChatOptions o = greedy(16);
  o.policy = ContextPolicy::kStop;
  ChatSession st(*be2, *m.tok, o);
  bool refused = false;
  for (int i = 0; i < 6 && !refused; ++i) {
    try {
      st.turn("Tell me about the big red ball.");
    } catch (const Error& e) {
      refused = true;
      EXPECT_NE(std::string(e.what()).find("/reset"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(refused);
  st.reset();
  EXPECT_EQ(be2->position(), 0);
  EXPECT_NO_THROW(st.turn("Hi"));
}

TEST(ChatSession, SameSeedSameReply) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const Loaded m = load(path);
  auto run = [&](int64_t seed) {
    auto be = m.backend();
    ChatOptions o = greedy(20);
    o.sampling = SamplingParams{};  // llama.cpp defaults: temp 0.8, top-k 40, ...
    o.sampling.temp = 1.0f;
    o.sampling.seed = seed;
    ChatSession s(*be, *m.tok, o);
    std::vector<int> all = s.turn("Once upon a time").tokens;
    const std::vector<int> r2 = s.turn("Then").tokens;
    all.insert(all.end(), r2.begin(), r2.end());
    return all;
  };
  const std::vector<int> a = run(11);
  EXPECT_EQ(a, run(11));
  EXPECT_NE(a, run(12));
}

}  // namespace
}  // namespace smolrt

namespace smolrt {
namespace {

// With SmolLM2's real tokenizer, the pieces a session tokenizes turn by turn (first turn, reply,
// end marker, "\n" + next turn) are exactly the tokens of the whole rendered conversation: the
// special tokens split the text, so the KV-cached conversation equals a fresh full render.
TEST(ChatSession, TurnByTurnTokensEqualTheFullRenderWithSmolLM2Tokenizer) {
  REQUIRE_FIXTURE(path, "tokenizers/smollm2-135m/tokenizer.json");
  const Tokenizer tok(vocab_from_hf_json(path.string()));
  const std::vector<ChatMessage> conv = {{"system", "You are a helpful assistant."},
                                         {"user", "What is 2+2?"},
                                         {"assistant", "2 + 2 = 4."},
                                         {"user", "And 3 + 3?\nShort answer."}};
  std::vector<int> pieces = tok.encode(render_chatml(std::span(conv).first(2), true), true, -1);
  for (int t : tok.encode(conv[2].content, true, 0)) pieces.push_back(t);
  const std::vector<int> end = tok.encode("<|im_end|>", true, 0);
  ASSERT_EQ(end, std::vector<int>{2});  // one control token, also the EOS
  EXPECT_TRUE(tok.is_eog(end[0]));
  pieces.insert(pieces.end(), end.begin(), end.end());
  for (int t : tok.encode("\n" + render_chatml(std::span(conv).subspan(3), true), true, 0)) {
    pieces.push_back(t);
  }
  EXPECT_EQ(pieces, tok.encode(render_chatml(conv, true), true, -1));
}

}  // namespace
}  // namespace smolrt
