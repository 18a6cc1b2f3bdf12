// The server's request parsing and validation (server/request.h): OpenAI defaults, every field's
// type and range checks naming the field, prompts as text or ids, chat rendering.
#include <gtest/gtest.h>

#include "server/request.h"
#include "server_request_fixture.h"

namespace smolrt::server {
namespace {

using nlohmann::json;

// A 64-position context: prompts just over it are refused.
struct Fixture : RequestFixture {
  Fixture() : RequestFixture(64) {}
};

// The ApiError a body raises (status, param); fails the test when it parses.
std::pair<int, std::string> error_of(const Body& body, bool chat = false) {
  Fixture f;
  try {
    if (chat)
      parse_chat(body, f.ctx());
    else
      parse_completion(body, f.ctx());
  } catch (const ApiError& e) {
    return {e.status, e.param};
  }
  ADD_FAILURE() << "no error for " << body.dump();
  return {0, ""};
}

TEST(ServerRequest, OpenAiDefaults) {
  Fixture f;
  const GenRequest r = parse_completion({{"prompt", "hello"}}, f.ctx());
  EXPECT_EQ(r.prompt, f.tok.encode("hello", true, -1));
  EXPECT_EQ(r.prompt_text, "hello");
  EXPECT_EQ(r.max_tokens, -1);
  EXPECT_FLOAT_EQ(r.sampling.temp, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.0f);
  EXPECT_FALSE(r.sampling.has_penalties());
  EXPECT_EQ(r.sampling.seed, -1);
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_FALSE(r.stream || r.echo || r.ignore_eos || r.include_usage);
}

TEST(ServerRequest, FieldsAreRead) {
  Fixture f;
  const GenRequest r = parse_completion({{"prompt", {5, 6, 7}},
                                         {"model", "m"},
                                         {"max_tokens", 9},
                                         {"temperature", 0},
                                         {"top_p", 0.5},
                                         {"top_k", 3},
                                         {"min_p", 0.1},
                                         {"seed", 7},
                                         {"stop", "x"},
                                         {"presence_penalty", 0.5},
                                         {"frequency_penalty", -0.5},
                                         {"repetition_penalty", 1.1},
                                         {"logprobs", 2},
                                         {"echo", true},
                                         {"ignore_eos", true},
                                         {"stream", true},
                                         {"n", 1},
                                         {"stream_options", {{"include_usage", true}}},
                                         {"unknown_field", {1, 2}}},
                                        f.ctx());
  EXPECT_EQ(r.prompt, (std::vector<int>{5, 6, 7}));
  EXPECT_EQ(r.prompt_text, f.tok.decode(r.prompt));
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_TRUE(r.sampling.greedy());
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(r.sampling.seed, 7);
  EXPECT_EQ(r.stops, (std::vector<std::string>{"x"}));
  EXPECT_TRUE(r.sampling.has_penalties());
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_TRUE(r.echo && r.ignore_eos && r.stream && r.include_usage);
  // max_completion_tokens is max_tokens' newer name; a one-element batch is its element.
  const GenRequest r2 =
      parse_completion({{"prompt", {"hi"}}, {"max_completion_tokens", 4}}, f.ctx());
  EXPECT_EQ(r2.max_tokens, 4);
  EXPECT_EQ(r2.prompt, f.tok.encode("hi", true, -1));
}

TEST(ServerRequest, ErrorsNameTheField) {
  EXPECT_EQ(error_of({{"max_tokens", 3}}), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(error_of({{"prompt", ""}}).second, "prompt");
  EXPECT_EQ(error_of({{"prompt", json::array()}}).second, "prompt");
  EXPECT_EQ(error_of({{"prompt", {1, 100000}}}).second, "prompt");
  EXPECT_EQ(error_of({{"prompt", {"a", "b"}}}).second, "prompt");
  EXPECT_EQ(error_of({{"prompt", std::vector<int>(65, 5)}}).second, "prompt");  // > seq_ctx
  EXPECT_EQ(error_of({{"prompt", "a"}, {"temperature", "x"}}).second, "temperature");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"temperature", -1}}).second, "temperature");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"top_p", 1.5}}).second, "top_p");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"top_k", 2.5}}).second, "top_k");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"min_p", -0.1}}).second, "min_p");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"max_tokens", -2}}).second, "max_tokens");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"n", 0}}).second, "n");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"n", 17}}).second, "n");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"n", 2}, {"best_of", 3}}).second, "best_of");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"best_of", 2}}).second, "best_of");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"logprobs", 21}}).second, "logprobs");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"stop", std::vector<std::string>(17, "s")}}).second,
            "stop");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"stop", {1}}}).second, "stop");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"echo", 1}}).second, "echo");
  EXPECT_EQ(error_of({{"prompt", "a"}, {"model", "other"}}),
            std::make_pair(404, std::string("model")));
}

// logit_bias: -100 bans a token, 100 keeps only the tokens given 100, 0 does nothing; a bias
// between, a key that is not a token id, a non-number, too many entries or banning every token is
// a 400 naming logit_bias.
TEST(ServerRequest, LogitBiasBansOrKeepsTokens) {
  Fixture f;
  const GenRequest r = parse_completion(
      {{"prompt", "a"}, {"logit_bias", {{"5", -100}, {"7", 100}, {"9", 100.0}, {"11", 0}}}},
      f.ctx());
  EXPECT_EQ(r.banned_tokens, (std::vector<int>{5}));
  EXPECT_EQ(r.only_tokens, (std::vector<int>{7, 9}));
  const GenRequest none = parse_completion({{"prompt", "a"}, {"logit_bias", nullptr}}, f.ctx());
  EXPECT_TRUE(none.banned_tokens.empty() && none.only_tokens.empty());
  const GenRequest chat = parse_chat(
      {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"logit_bias", {{"3", -100}}}},
      f.ctx());
  EXPECT_EQ(chat.banned_tokens, (std::vector<int>{3}));
  const int V = f.tok.n_vocab();
  for (const json& lb :
       {json("x"), json{{"abc", 100}}, json{{"-1", 100}}, json{{"", 100}},
        json{{std::to_string(V), -100}}, json{{"5", 5}}, json{{"5", -99.5}}, json{{"5", "100"}}}) {
    EXPECT_EQ(error_of({{"prompt", "a"}, {"logit_bias", lb}}),
              std::make_pair(400, std::string("logit_bias")))
        << lb.dump();
  }
  json many = json::object(), all = json::object();
  for (int t = 0; t <= kMaxLogitBias; ++t) many[std::to_string(t)] = 0;
  for (int t = 0; t < V; ++t) all[std::to_string(t)] = -100;
  EXPECT_EQ(error_of({{"prompt", "a"}, {"logit_bias", many}}).second, "logit_bias");
  ASSERT_LE(V, kMaxLogitBias);  // the byte vocabulary: banning all of it fits the entry limit
  EXPECT_EQ(error_of({{"prompt", "a"}, {"logit_bias", all}}).second, "logit_bias");
  // One token under two spellings counts once; a kept token that is also banned is not kept, so
  // keeping only banned tokens leaves none (the engines would sample token 0).
  const GenRequest twice =
      parse_completion({{"prompt", "a"}, {"logit_bias", {{"7", 100}, {"007", 100}}}}, f.ctx());
  EXPECT_EQ(twice.only_tokens, (std::vector<int>{7}));
  EXPECT_EQ(error_of({{"prompt", "a"}, {"logit_bias", {{"7", 100}, {"007", -100}}}}),
            std::make_pair(400, std::string("logit_bias")));
  json all_but_one = all;
  all_but_one["0"] = 0;
  all_but_one["00"] = -100;  // token 0 after all
  EXPECT_EQ(error_of({{"prompt", "a"}, {"logit_bias", all_but_one}}).second, "logit_bias");
  all_but_one.erase("00");
  EXPECT_EQ(parse_completion({{"prompt", "a"}, {"logit_bias", all_but_one}}, f.ctx())
                .banned_tokens.size(),
            static_cast<size_t>(V - 1));
}

TEST(ServerRequest, MalformedBodies) {
  EXPECT_THROW(parse_json_body("{nope"), ApiError);
  EXPECT_THROW(parse_json_body("[1]"), ApiError);
  EXPECT_THROW(parse_json_body(""), ApiError);
  EXPECT_TRUE(parse_json_body("{\"a\": 1}").is_object());
  const json e = error_body(ApiError(400, "bad", "top_p"));
  EXPECT_EQ(e["error"]["param"], "top_p");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(error_body(ApiError(400, "bad"))["error"]["param"].is_null());
}

TEST(ServerRequest, ChatRendersChatMlWithTheDefaultSystemPrompt) {
  Fixture f;
  ParseContext c = f.ctx();
  c.default_system = "Be nice.";
  const GenRequest r = parse_chat(
      {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}}}}}},
       {"logprobs", true},
       {"top_logprobs", 2}},
      c);
  const std::string want =
      "<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(r.prompt, f.tok.encode(want, true, -1));
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.endpoint, Endpoint::kChat);

  EXPECT_EQ(error_of({{"messages", json::array()}}, true).second, "messages");
  EXPECT_EQ(error_of({{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, true).second,
            "messages");
  EXPECT_EQ(
      error_of({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}}, true)
          .second,
      "top_logprobs");
  c.chat = false;
  EXPECT_THROW(parse_chat({{"messages", {{{"role", "user"}, {"content", "x"}}}}}, c), ApiError);
}

// Special-token text in message content: control tokens by default (as llama.cpp and vLLM),
// plain text with special_in_content off; the template's own markers stay control tokens.
TEST(ServerRequest, SpecialTokensInChatContent) {
  Fixture f;
  ParseContext c = f.ctx();
  const json body = {{"messages", {{{"role", "user"}, {"content", "<|im_start|>system"}}}}};
  const std::string head = "<|im_start|>user\n", tail = "<|im_end|>\n<|im_start|>assistant\n";
  const GenRequest parsed = parse_chat(body, c);
  EXPECT_EQ(parsed.prompt, f.tok.encode(head + "<|im_start|>system" + tail, true, -1));
  c.special_in_content = false;
  const GenRequest plain = parse_chat(body, c);
  std::vector<int> want = f.tok.encode(head, true, -1);
  for (int id : f.tok.encode("<|im_start|>system", false, 0)) want.push_back(id);
  for (int id : f.tok.encode(tail, true, 0)) want.push_back(id);
  EXPECT_EQ(plain.prompt, want);
  EXPECT_GT(plain.prompt.size(), parsed.prompt.size() + 4);
  // Content without special-token text is tokenized the same either way.
  const json hi = {{"messages", {{{"role", "user"}, {"content", "hi there"}}}}};
  EXPECT_EQ(parse_chat(hi, c).prompt, parse_chat(hi, f.ctx()).prompt);
}

TEST(ServerRequest, TokenizeAndDetokenize) {
  Fixture f;
  EXPECT_EQ(parse_tokenize({{"content", "ab"}}, f.ctx()), f.tok.encode("ab", true, 0));
  EXPECT_EQ(parse_detokenize({{"tokens", {3, 4}}}, f.ctx()), (std::vector<int>{3, 4}));
  EXPECT_THROW(parse_tokenize({{"content", 5}}, f.ctx()), ApiError);
  EXPECT_THROW(parse_detokenize({{"tokens", {-1}}}, f.ctx()), ApiError);
}

}  // namespace
}  // namespace smolrt::server
