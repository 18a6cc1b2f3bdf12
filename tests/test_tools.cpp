// Tool rendering per chat family (goldens checked against Qwen2.5's and Meta's Llama 3.2 Jinja
// templates rendered by jinja2 with Hugging Face's tojson), tools / tool_choice validation, and
// the tool-call grammars.
#include <gtest/gtest.h>

#include "grammar/json_schema.h"
#include "grammar_test_util.h"
#include "grammar_walk.h"
#include "runtime/tool_parser.h"
#include "runtime/tools.h"
#include "test_util.h"

namespace smolrt {
namespace {

using nlohmann::ordered_json;

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"},
   "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "now"}}])";

std::vector<ToolSpec> tools() {
  return parse_tools(ordered_json::parse(kTools));
}

// A conversation: system, user, a tool call, its result, an answer, a second question.
std::vector<ChatMessage> conversation() {
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}};
  ChatMessage result{"tool", R"({"temp": 21})"};
  result.tool_call_id = "call_1";
  return {{"system", "You are helpful."},
          {"user", "Weather in Paris? \xc3\xbcn\xc3\xaf"},
          call,
          result,
          {"assistant", "It is 21C."},
          {"user", "And the time?"}};
}

TEST(ToolRender, Qwen25Hermes) {
  EXPECT_EQ(render_chat_with_tools(ChatFormat::kChatML, conversation(), tools(), true),
            R"x(<|im_start|>system
You are helpful.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
{"type": "function", "function": {"name": "now"}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris? ünï<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temp": 21}
</tool_response><|im_end|>
<|im_start|>assistant
It is 21C.<|im_end|>
<|im_start|>user
And the time?<|im_end|>
<|im_start|>assistant
)x");
}

TEST(ToolRender, Llama3Json) {
  EXPECT_EQ(render_chat_with_tools(ChatFormat::kLlama3, conversation(), tools(), true),
            R"x(<|start_header_id|>system<|end_header_id|>

Environment: ipython
Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

You are helpful.<|eot_id|><|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.

{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string"
                },
                "unit": {
                    "type": "string",
                    "enum": [
                        "c",
                        "f"
                    ]
                }
            },
            "required": [
                "city"
            ]
        }
    }
}

{
    "type": "function",
    "function": {
        "name": "now"
    }
}

Weather in Paris? ünï<|eot_id|><|start_header_id|>assistant<|end_header_id|>

{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>

"{\"temp\": 21}"<|eot_id|><|start_header_id|>assistant<|end_header_id|>

It is 21C.<|eot_id|><|start_header_id|>user<|end_header_id|>

And the time?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)x");
}

TEST(ToolRender, HermesParallelCallsConsecutiveResultsAndNoSystem) {
  const auto t =
      parse_tools(ordered_json::parse(R"([{"type": "function", "function": {"name": "add",
      "description": "Add \"two\" numbers", "parameters": {"type": "object", "properties":
      {"a": {"type": "number"}, "b": {"type": "number"}}}}}])"));
  ChatMessage calls{"assistant", "Sure, calling."};
  calls.tool_calls = {{"c1", "add", R"({"a":1,"b":2})"},
                      {"c2", "add", "{\"a\": 3.5, \"b\": 4, \"note\": \"\xc3\xa9\\n\"}"}};
  const std::vector<ChatMessage> msgs = {
      {"user", "  add 1+2 and 3.5+4  "}, calls, {"tool", "3"}, {"tool", "7.5"}};
  // Without a system message the tools open the system turn (Qwen2.5 would put its own default
  // system prompt first; the server passes the template's default as a system message).
  EXPECT_EQ(render_chat_with_tools(ChatFormat::kChatML, msgs, t, true), R"x(<|im_start|>system
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "add", "description": "Add \"two\" numbers", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
  add 1+2 and 3.5+4  <|im_end|>
<|im_start|>assistant
Sure, calling.
<tool_call>
{"name": "add", "arguments": {"a": 1, "b": 2}}
</tool_call>
<tool_call>
{"name": "add", "arguments": {"a": 3.5, "b": 4, "note": "é\n"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
3
</tool_response>
<tool_response>
7.5
</tool_response><|im_end|>
<|im_start|>assistant
)x");
}

TEST(ToolRender, Llama3ToolResultsAreJsonStringsAndOneCallPerMessage) {
  const auto t =
      parse_tools(ordered_json::parse(R"([{"type": "function", "function": {"name": "add",
      "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "array",
      "items": {}}}}}}])"));
  ChatMessage call{"assistant", "ignored"};
  call.tool_calls = {{"c2", "add", "{\"a\": 3.5, \"b\": [], \"note\": \"\xc3\xa9\\n\\\"q\\\"\"}"}};
  std::vector<ChatMessage> msgs = {{"user", "  add 1+2  "},
                                   call,
                                   {"tool", "3 \"x\"\n"},
                                   {"tool", "7.5"},
                                   {"assistant", " Done. "}};
  EXPECT_EQ(render_chat_with_tools(ChatFormat::kLlama3, msgs, t, true),
            R"x(<|start_header_id|>system<|end_header_id|>

Environment: ipython
Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

<|eot_id|><|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.

{
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {
                    "type": "number"
                },
                "b": {
                    "type": "array",
                    "items": {}
                }
            }
        }
    }
}

add 1+2<|eot_id|><|start_header_id|>assistant<|end_header_id|>

{"name": "add", "parameters": {"a": 3.5, "b": [], "note": "é\n\"q\""}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>

"3 \"x\"\n"<|eot_id|><|start_header_id|>ipython<|end_header_id|>

"7.5"<|eot_id|><|start_header_id|>assistant<|end_header_id|>

Done.<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)x");
  msgs[1].tool_calls.push_back(msgs[1].tool_calls[0]);
  try {
    render_chat_with_tools(ChatFormat::kLlama3, msgs, t, true);
    FAIL() << "two calls in one Llama 3 message rendered";
  } catch (const ToolError& e) {
    EXPECT_EQ(e.param(), "messages");
  }
}

TEST(ToolRender, WithoutToolsChatMLAndGemmaAreRenderChat) {
  const std::vector<ChatMessage> msgs = {
      {"system", "S"}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Q"}};
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kGemma})
    EXPECT_EQ(render_chat_with_tools(f, msgs, {}, true), render_chat(f, msgs, true));
  // Tool turns still render as the family does, tools or not.
  EXPECT_EQ(
      render_chat_with_tools(ChatFormat::kChatML, conversation(), {}, false),
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWeather in Paris? "
      "\xc3\xbcn\xc3\xaf<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": "
      "\"get_weather\", "
      "\"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
      "{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 21C.<|im_end|>\n"
      "<|im_start|>user\nAnd the time?<|im_end|>\n");
}

TEST(ToolRender, GemmaUsesHermesTextInItsTurns) {
  const std::string out = render_chat_with_tools(ChatFormat::kGemma, conversation(), tools(), true);
  EXPECT_EQ(out.rfind("<start_of_turn>user\nYou are helpful.\n\n# Tools\n\nYou may call", 0), 0u)
      << out;
  EXPECT_NE(
      out.find("<start_of_turn>model\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
               "{\"city\": "
               "\"Paris\"}}\n</tool_call><end_of_turn>\n<start_of_turn>user\n<tool_response>\n"
               "{\"temp\": 21}\n</tool_response><end_of_turn>\n"),
      std::string::npos)
      << out;
  EXPECT_TRUE(out.ends_with("<start_of_turn>model\n"));
}

TEST(ToolRender, ArgumentsThatAreNotJsonRenderAsAString) {
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"c", "now", "not json"}};
  const std::vector<ChatMessage> msgs = {{"user", "t?"}, call};
  EXPECT_NE(render_chat_with_tools(ChatFormat::kChatML, msgs, {}, false)
                .find("{\"name\": \"now\", \"arguments\": \"not json\"}"),
            std::string::npos);
}

TEST(ToolRender, PythonJson) {
  const ordered_json v =
      ordered_json::parse(R"({"b": [1, 2.5, {}], "a": {"x": null, "y": "\u00e9\n"}, "e": []})");
  EXPECT_EQ(python_json(v),
            "{\"b\": [1, 2.5, {}], \"a\": {\"x\": null, \"y\": \"\xc3\xa9\\n\"}, \"e\": []}");
  EXPECT_EQ(
      python_json(v, 2),
      "{\n  \"b\": [\n    1,\n    2.5,\n    {}\n  ],\n  \"a\": {\n    \"x\": null,\n    \"y\": "
      "\"\xc3\xa9\\n\"\n  },\n  \"e\": []\n}");
}

std::string tool_error(const std::string& tools_json, const char* choice = nullptr) {
  try {
    const auto t = parse_tools(ordered_json::parse(tools_json));
    if (choice) {
      const ordered_json c = ordered_json::parse(choice);
      parse_tool_choice(&c, t);
    }
  } catch (const ToolError& e) {
    return e.param() + ": " + e.what();
  }
  return "(no error)";
}

TEST(ToolSpecs, ValidationNamesTheField) {
  EXPECT_EQ(tool_error("{}"), "tools: 'tools' must be an array of tools");
  EXPECT_EQ(tool_error(R"([{"type": "retrieval"}])"),
            "tools[0].type: tools[0] must be {\"type\": \"function\", \"function\": {...}}");
  EXPECT_EQ(tool_error(R"([{"type": "function"}])"),
            "tools[0].function: tools[0].function must be an object");
  EXPECT_EQ(
      tool_error(R"([{"type": "function", "function": {"name": "a b"}}])"),
      "tools[0].function.name: tools[0].function.name must be 1 to 64 letters, digits, '_' or '-'");
  EXPECT_EQ(
      tool_error(
          R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}])"),
      "tools[1].function.name: two tools are named 'f'");
  EXPECT_EQ(
      tool_error(
          R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])"),
      "tools[0].function.parameters: tools[0].function.parameters must be a JSON schema of type "
      "object");
  EXPECT_EQ(tool_error(kTools, R"("sometimes")"),
            "tool_choice: unknown tool_choice 'sometimes' (none, auto, required, or a function)");
  EXPECT_EQ(tool_error(kTools, R"({"type": "function", "function": {"name": "nope"}})"),
            "tool_choice: tool_choice names 'nope', which is not in tools");
  EXPECT_EQ(tool_error("[]", R"("required")"),
            "tool_choice: tool_choice other than \"none\" needs 'tools'");
  EXPECT_EQ(tool_error(kTools, R"(["auto"])"),
            "tool_choice: tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": "
            "\"function\", "
            "\"function\": {\"name\": ...}}");
}

TEST(ToolSpecs, ChoiceDefaultsAndParameters) {
  const auto t = tools();
  EXPECT_EQ(parse_tool_choice(nullptr, t).mode, ToolChoiceMode::kAuto);
  EXPECT_EQ(parse_tool_choice(nullptr, {}).mode, ToolChoiceMode::kNone);
  const ordered_json named =
      ordered_json::parse(R"({"type": "function", "function": {"name": "now"}})");
  const ToolChoice c = parse_tool_choice(&named, t);
  EXPECT_EQ(c.mode, ToolChoiceMode::kFunction);
  EXPECT_EQ(c.function, "now");
  EXPECT_TRUE(t[1].parameters.is_null());
  EXPECT_EQ(t[0].description, "Get the weather");
  // A parameters schema without a type is an object schema.
  const auto untyped = parse_tools(ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {}}}}}])"));
  EXPECT_EQ(untyped[0].parameters["type"], "object");
}

std::shared_ptr<const grammar::CompiledGrammar> tool_grammar(ToolFormat f,
                                                             const std::vector<ToolSpec>& t,
                                                             const ToolChoice& c, bool parallel) {
  auto g = tool_call_grammar(f, t, c, parallel);
  if (!g) return nullptr;
  return grammar::compile(*g, test::byte_vocab());
}

TEST(ToolGrammar, RequiredAndNamedConstrainTheWrapperAndArguments) {
  const auto t = tools();
  const std::string weather =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"c\"}}\n</tool_call>";
  const std::string now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  const auto required = tool_grammar(ToolFormat::kHermes, t, {ToolChoiceMode::kRequired, ""}, true);
  EXPECT_TRUE(test::matches(required, weather));
  EXPECT_TRUE(test::matches(required, now + "\n" + weather));
  EXPECT_FALSE(test::matches(required, ""));
  EXPECT_FALSE(test::matches(required, "Sure! " + now));
  EXPECT_FALSE(test::matches(
      required,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>"));
  EXPECT_FALSE(test::matches(
      required, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  const auto single = tool_grammar(ToolFormat::kHermes, t, {ToolChoiceMode::kRequired, ""}, false);
  EXPECT_FALSE(test::matches(single, now + "\n" + weather));
  const auto named = tool_grammar(ToolFormat::kHermes, t, {ToolChoiceMode::kFunction, "now"}, true);
  EXPECT_TRUE(test::matches(named, now));
  EXPECT_FALSE(test::matches(named, weather));
  const auto llama = tool_grammar(ToolFormat::kLlama3, t, {ToolChoiceMode::kRequired, ""}, true);
  EXPECT_TRUE(
      test::matches(llama, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}"));
  EXPECT_FALSE(test::matches(
      llama, "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"now\", \"parameters\": {}}"));
  EXPECT_EQ(tool_grammar(ToolFormat::kHermes, t, {ToolChoiceMode::kAuto, ""}, true), nullptr);
  EXPECT_EQ(tool_grammar(ToolFormat::kHermes, t, {ToolChoiceMode::kNone, ""}, true), nullptr);
}

TEST(ToolGrammar, UnsupportedParametersNameTheTool) {
  const auto t =
      parse_tools(ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}},
      {"type": "function", "function": {"name": "g", "parameters": {"type": "object",
      "properties": {"s": {"type": "string", "pattern": "^a"}}}}}])"));
  try {
    tool_call_grammar(ToolFormat::kHermes, t, {ToolChoiceMode::kRequired, ""}, true);
    FAIL() << "no error";
  } catch (const ToolError& e) {
    EXPECT_EQ(e.param(), "tools[1].function.parameters");
    EXPECT_EQ(std::string(e.what()),
              "tools[1].function.parameters: json schema at '#/properties/s/pattern': 'pattern' is "
              "not supported");
  }
  // Only the named tool's schema matters for a named choice.
  EXPECT_TRUE(tool_call_grammar(ToolFormat::kHermes, t, {ToolChoiceMode::kFunction, "f"}, true));
  EXPECT_NE(tool_grammar_key(ToolFormat::kHermes, t, {ToolChoiceMode::kFunction, "f"}, true),
            tool_grammar_key(ToolFormat::kHermes, t, {ToolChoiceMode::kFunction, "g"}, true));
}

TEST(ToolGrammar, ConstrainedRepliesOverTheRealVocabParseBackIntoCalls) {
  const Tokenizer* tok = test::smollm_tokenizer();
  if (!tok) GTEST_SKIP() << "skipped: fixtures not found; set SMOLRT_FIXTURES";
  const auto vocab = std::make_shared<const grammar::TokenVocab>(*tok);
  const auto t = tools();
  std::mt19937 rng(5);
  for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3}) {
    const auto g =
        grammar::compile(*tool_call_grammar(f, t, {ToolChoiceMode::kRequired, ""}, true), vocab);
    for (int walk = 0; walk < 8; ++walk) {
      grammar::GrammarMatcher m(g);
      const std::string text = test::random_walk(m, *tok, rng, 6 * walk);
      const ParsedReply r = parse_tool_reply(f, text, 1);
      ASSERT_FALSE(r.tool_calls.empty()) << text;
      EXPECT_EQ(r.content, "") << text;
      for (const ChatToolCall& c : r.tool_calls) {
        EXPECT_TRUE(c.name == "get_weather" || c.name == "now") << text;
        const auto args = nlohmann::json::parse(c.arguments);
        EXPECT_TRUE(args.is_object());
        EXPECT_TRUE(c.name != "get_weather" || args.contains("city")) << text;
      }
    }
  }
}

}  // namespace
}  // namespace smolrt
