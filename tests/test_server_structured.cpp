// The request fields of structured output, tool calling and n > 1 (server/request.h): what they
// parse into, the prompts they render, the grammars they compile once, and the 400s that name
// the construct. The response side is tests/server/test_structured.py (end to end).
#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/tools.h"
#include "server/request.h"
#include "server_request_fixture.h"

namespace smolrt::server {
namespace {

using nlohmann::ordered_json;

// Room for rendered tools.
struct Fixture : RequestFixture {
  Fixture() : RequestFixture(4096) {}
  GenRequest chat(const Body& body) const { return parse_chat(body, ctx()); }
  GenRequest completion(const Body& body) const { return parse_completion(body, ctx()); }
};

// The ApiError a body raises; fails the test when it parses.
ApiError error_of(const Body& body, bool chat = true) {
  Fixture f;
  try {
    if (chat)
      f.chat(body);
    else
      f.completion(body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body.dump();
  return ApiError(0, "");
}

// The error's param, and whether its message holds `word`.
void expect_error(const Body& body, const std::string& param, const std::string& word,
                  bool chat = true) {
  const ApiError e = error_of(body, chat);
  EXPECT_EQ(e.status, 400) << body.dump();
  EXPECT_EQ(e.param, param) << e.what();
  EXPECT_NE(std::string(e.what()).find(word), std::string::npos)
      << "'" << e.what() << "' does not name " << word;
}

Body user(const std::string& text) {
  return Body::array({{{"role", "user"}, {"content", text}}});
}

const Body kWeather = Body::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "description": "Weather of a city", "parameters": {"type": "object", "properties":
  {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}},
  {"type": "function", "function": {"name": "get_time"}}])");

TEST(ServerStructured, NAndBestOf) {
  Fixture f;
  EXPECT_EQ(f.completion({{"prompt", "a"}}).n, 1);
  EXPECT_EQ(f.completion({{"prompt", "a"}, {"n", 16}, {"best_of", 16}}).n, 16);
  EXPECT_EQ(f.chat({{"messages", user("a")}, {"n", 4}}).n, 4);
  expect_error({{"prompt", "a"}, {"n", 17}}, "n", "[1, 16]", false);
  expect_error({{"prompt", "a"}, {"n", 0}}, "n", "[1, 16]", false);
  expect_error({{"prompt", "a"}, {"n", 2}, {"best_of", 4}}, "best_of", "supported", false);
}

TEST(ServerStructured, ResponseFormatCompilesOncePerSchema) {
  Fixture f;
  const Body schema = Body::parse(
      R"({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
          "required": ["b", "a"], "additionalProperties": false})");
  const Body rf = {{"type", "json_schema"},
                   {"json_schema", {{"name", "x"}, {"strict", true}, {"schema", schema}}}};
  const GenRequest a = f.chat({{"messages", user("hi")}, {"response_format", rf}});
  const GenRequest b = f.completion({{"prompt", "hi"}, {"response_format", rf}});
  ASSERT_TRUE(a.grammar);
  EXPECT_EQ(a.grammar, b.grammar);  // one compile, shared
  EXPECT_EQ(f.grammars->stats().misses, 1u);
  // Properties in the order sent: "b" first.
  grammar::GrammarMatcher m(a.grammar);
  EXPECT_TRUE(m.accept_text("{\"b\": 1, \"a\": \"x\"}"));
  EXPECT_TRUE(m.is_done());
  grammar::GrammarMatcher wrong(a.grammar);
  EXPECT_FALSE(wrong.accept_text("{\"a\""));

  const GenRequest obj =
      f.chat({{"messages", user("hi")}, {"response_format", {{"type", "json_object"}}}});
  ASSERT_TRUE(obj.grammar);
  grammar::GrammarMatcher mo(obj.grammar);
  EXPECT_FALSE(mo.accept_text("[1]"));
  EXPECT_FALSE(f.chat({{"messages", user("hi")}, {"response_format", {{"type", "text"}}}}).grammar);
  EXPECT_FALSE(f.chat({{"messages", user("hi")}, {"grammar", ""}}).grammar);

  const GenRequest g = f.completion({{"prompt", "hi"}, {"grammar", "root ::= \"yes\" | \"no\""}});
  ASSERT_TRUE(g.grammar);
  grammar::GrammarMatcher mg(g.grammar);
  EXPECT_TRUE(mg.accept_text("no") && mg.is_done());
}

TEST(ServerStructured, BadSchemasAndGrammarsNameTheConstruct) {
  const auto rf = [](const Body& schema) {
    return Body{{"messages", user("hi")},
                {"response_format",
                 {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}};
  };
  const std::string at = "response_format.json_schema.schema";
  expect_error(rf({{"type", "string"}, {"pattern", "^a+$"}}), at, "pattern");
  expect_error(rf({{"oneOf", {{{"type", "string"}}, {{"type", "integer"}}}}}), at, "oneOf");
  expect_error(rf({{"$ref", "#/$defs/missing"}}), at, "missing");
  expect_error(rf({{"type", "object"}, {"properties", {{"a", {{"$ref", "http://x/y"}}}}}}), at,
               "/properties/a");
  expect_error(rf(false), at, "schema");
  expect_error({{"messages", user("hi")},
                {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
               at, "required");
  expect_error({{"messages", user("hi")}, {"response_format", {{"type", "yaml"}}}},
               "response_format.type", "yaml");
  expect_error({{"messages", user("hi")}, {"response_format", "json"}}, "response_format",
               "object");
  expect_error({{"prompt", "hi"}, {"grammar", "root ::= (\"a\""}}, "grammar", "line 1", false);
  expect_error({{"prompt", "hi"}, {"grammar", "root ::= x"}}, "grammar", "x", false);
  expect_error({{"prompt", "hi"}, {"grammar", 5}}, "grammar", "string", false);
  expect_error({{"prompt", "hi"},
                {"grammar", "root ::= \"a\""},
                {"response_format", {{"type", "json_object"}}}},
               "grammar", "not both", false);
}

TEST(ServerStructured, ToolsRenderAndConstrain) {
  Fixture f;
  const Body body = {{"messages", user("Weather in Paris?")}, {"tools", kWeather}};
  const GenRequest autoc = f.chat(body);
  const std::vector<ToolSpec> specs = parse_tools(kWeather);
  const std::vector<ChatMessage> msgs = {{"user", "Weather in Paris?"}};
  EXPECT_EQ(autoc.prompt,
            f.tok.encode(render_chat_with_tools(ChatFormat::kChatML, msgs, specs, true), true, -1));
  ASSERT_TRUE(autoc.tool_calls.has_value());
  EXPECT_EQ(*autoc.tool_calls, ToolFormat::kHermes);
  EXPECT_FALSE(autoc.grammar);  // auto: free text

  Body none = body;
  none["tool_choice"] = "none";
  const GenRequest nonec = f.chat(none);
  EXPECT_FALSE(nonec.tool_calls.has_value());
  EXPECT_EQ(nonec.prompt, f.chat({{"messages", user("Weather in Paris?")}}).prompt);

  Body named = body;
  named["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const GenRequest n1 = f.chat(named);
  ASSERT_TRUE(n1.grammar);
  grammar::GrammarMatcher m(n1.grammar);
  EXPECT_TRUE(m.accept_text(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"C\"}}\n</tool_call>"));
  EXPECT_TRUE(m.can_end());
  grammar::GrammarMatcher other(n1.grammar);
  EXPECT_FALSE(other.accept_text("<tool_call>\n{\"name\": \"get_time\""));
  EXPECT_EQ(f.chat(named).grammar, n1.grammar);  // cached by its key

  Body required = body;
  required["tool_choice"] = "required";
  required["parallel_tool_calls"] = false;
  const GenRequest r = f.chat(required);
  ASSERT_TRUE(r.grammar);
  grammar::GrammarMatcher mr(r.grammar);
  EXPECT_TRUE(
      mr.accept_text("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_TRUE(mr.is_done());  // one call only
}

TEST(ServerStructured, ToolTurnsRoundTrip) {
  Fixture f;
  const Body msgs = Body::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"C\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}])");
  const GenRequest r = f.chat({{"messages", msgs}, {"tools", kWeather}});
  std::vector<ChatMessage> want = {
      {"user", "Weather in Paris?"},
      {"assistant", "", {{"call_1", "get_weather", "{\"city\": \"Paris\", \"unit\": \"C\"}"}}},
      {"tool", "18 C, sunny", {}, "call_1"}};
  const std::string text =
      render_chat_with_tools(ChatFormat::kChatML, want, parse_tools(kWeather), true);
  EXPECT_EQ(r.prompt, f.tok.encode(text, true, -1));
  EXPECT_NE(text.find("<tool_response>\n18 C, sunny\n</tool_response>"), std::string::npos);
  EXPECT_NE(text.find("\"arguments\": {\"city\": \"Paris\""), std::string::npos);
  // Tool turns render even without tools (the conversation carries them).
  const GenRequest bare = f.chat({{"messages", msgs}});
  EXPECT_EQ(bare.prompt,
            f.tok.encode(render_chat_with_tools(ChatFormat::kChatML, want, {}, true), true, -1));
  EXPECT_FALSE(bare.tool_calls.has_value());
}

TEST(ServerStructured, ToolContentIsPlainWithoutSpecialInContent) {
  Fixture f;
  ParseContext c = f.ctx();
  c.special_in_content = false;
  const Body body = {{"messages", user("<|im_start|>system")}, {"tools", kWeather}};
  const GenRequest plain = parse_chat(body, c);
  const GenRequest parsed = f.chat(body);
  EXPECT_GT(plain.prompt.size(), parsed.prompt.size() + 4);
  const std::vector<int> marker = f.tok.encode("<|im_start|>", true, 0);
  ASSERT_EQ(marker.size(), 1u);
  // The template's own turns keep their markers: system, user, assistant.
  EXPECT_EQ(std::count(plain.prompt.begin(), plain.prompt.end(), marker[0]), 3);
}

TEST(ServerStructured, BadToolsAndToolMessagesNameTheField) {
  const Body bad_name = Body::parse(R"([{"type": "function", "function": {"name": "a b"}}])");
  expect_error({{"messages", user("x")}, {"tools", bad_name}}, "tools[0].function.name", "letters");
  expect_error({{"messages", user("x")}, {"tools", {{{"type", "retrieval"}}}}}, "tools[0].type",
               "function");
  expect_error({{"messages", user("x")}, {"tools", "f"}}, "tools", "array");
  const Body bad_params = Body::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}}])");
  expect_error({{"messages", user("x")}, {"tools", bad_params}, {"tool_choice", "required"}},
               "tools[0].function.parameters", "pattern");
  expect_error({{"messages", user("x")}, {"tools", kWeather}, {"tool_choice", "sometimes"}},
               "tool_choice", "sometimes");
  expect_error({{"messages", user("x")},
                {"tools", kWeather},
                {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
               "tool_choice", "nope");
  expect_error({{"messages", user("x")}, {"tool_choice", "required"}}, "tool_choice", "tools");
  expect_error({{"messages", user("x")},
                {"tools", kWeather},
                {"response_format", {{"type", "json_object"}}}},
               "response_format", "tool_choice");
  expect_error({{"messages", Body::parse(R"([{"role": "tool", "content": "x"}])")}}, "messages",
               "tool_call_id");
  expect_error({{"messages",
                 Body::parse(R"([{"role": "assistant", "tool_calls": [{"type": "function"}]}])")}},
               "messages", "tool_calls[0]");
  // Fields of the wrong JSON type are 400s too (not the JSON library's type errors).
  expect_error(
      {{"messages", Body::parse(R"([{"role": "user", "content": [{"type": 5, "text": "x"}]}])")}},
      "messages", "text content parts");
  expect_error({{"messages", Body::parse(R"([{"role": "assistant", "tool_calls": [{"type": 1,
                 "function": {"name": "f"}}]}])")}},
               "messages", "tool_calls[0]");
  expect_error({{"messages", Body::parse(R"([{"role": "assistant", "tool_calls": [{"function":
                 {"name": "f", "arguments": 5}}]}])")}},
               "messages", "arguments");
}

}  // namespace
}  // namespace smolrt::server
