// Replies -> content + tool calls: valid, partial, streaming (every split of the text gives the
// same result as one piece) and junk (never throws; anything malformed stays plain content).
#include <gtest/gtest.h>

#include <random>

#include "runtime/tool_parser.h"

namespace smolrt {
namespace {

// The reply streamed in pieces of the given sizes (cycled), merged back.
ParsedReply streamed(ToolFormat f, std::string_view text, std::vector<size_t> sizes,
                     std::vector<ReplyDelta>* out = nullptr) {
  ToolCallParser p(f, 7);
  std::vector<ReplyDelta> deltas;
  for (size_t at = 0, k = 0; at < text.size(); ++k) {
    const size_t n = std::min(sizes[k % sizes.size()], text.size() - at);
    deltas.push_back(p.push(text.substr(at, n)));
    at += n;
  }
  deltas.push_back(p.finish());
  ParsedReply r;
  for (const ReplyDelta& d : deltas) {
    r.content += d.content;
    for (const ToolCallDelta& t : d.tool_calls) {
      if (static_cast<size_t>(t.index) >= r.tool_calls.size())
        r.tool_calls.resize(static_cast<size_t>(t.index) + 1);
      ChatToolCall& c = r.tool_calls[static_cast<size_t>(t.index)];
      if (!t.name.empty()) {
        EXPECT_TRUE(c.name.empty()) << "the name came twice";
        EXPECT_TRUE(c.arguments.empty()) << "arguments before the name";
        c.name = t.name;
        c.id = t.id;
      }
      EXPECT_FALSE(c.name.empty()) << "a delta for a call before its name";
      c.arguments += t.arguments;
    }
  }
  if (out) *out = deltas;
  return r;
}

void expect_calls(const ParsedReply& r, const std::string& content,
                  const std::vector<std::pair<std::string, std::string>>& calls) {
  EXPECT_EQ(r.content, content);
  ASSERT_EQ(r.tool_calls.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(r.tool_calls[i].name, calls[i].first);
    EXPECT_EQ(r.tool_calls[i].arguments, calls[i].second);
    EXPECT_EQ(r.tool_calls[i].id.size(), 29u);
    EXPECT_EQ(r.tool_calls[i].id.rfind("call_", 0), 0u);
  }
}

TEST(ToolParser, HermesCallsWithAndWithoutContent) {
  expect_calls(parse_tool_reply(ToolFormat::kHermes,
                                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                "{\"city\": \"Paris\"}}\n</tool_call>",
                                1),
               "", {{"get_weather", "{\"city\": \"Paris\"}"}});
  expect_calls(
      parse_tool_reply(
          ToolFormat::kHermes,
          "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
          "<tool_call>\n{\"arguments\": {\"x\": [1, {\"y\": \"}\"}]}, \"name\": "
          "\"b\"}\n</tool_call>\n",
          1),
      "Let me check.", {{"a", "{}"}, {"b", "{\"x\": [1, {\"y\": \"}\"}]}"}});
  // The closing tag may be missing at the end; a call without arguments takes none.
  expect_calls(parse_tool_reply(ToolFormat::kHermes, "<tool_call>{\"name\": \"now\"}", 1), "",
               {{"now", "{}"}});
}

TEST(ToolParser, Llama3Calls) {
  expect_calls(
      parse_tool_reply(ToolFormat::kLlama3, "  {\"name\": \"f\", \"parameters\": {\"a\": 1}}", 1),
      "", {{"f", "{\"a\": 1}"}});
  expect_calls(
      parse_tool_reply(
          ToolFormat::kLlama3,
          "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"arguments\": {\"b\": true}}",
          1),
      "", {{"f", "{}"}, {"g", "{\"b\": true}"}});
  const ParsedReply text = parse_tool_reply(ToolFormat::kLlama3, "The answer is {\"name\": 1}.", 1);
  EXPECT_EQ(text.content, "The answer is {\"name\": 1}.");
  EXPECT_TRUE(text.tool_calls.empty());
}

TEST(ToolParser, PlainRepliesAreUntouched) {
  for (const char* t : {"", "Hello!", "  spaced  \n", "a < b and <tool is not a tag", "<tool_call",
                        "x <tool_cal", "line\n\n"}) {
    const ParsedReply r = parse_tool_reply(ToolFormat::kHermes, t, 1);
    EXPECT_EQ(r.content, t);
    EXPECT_TRUE(r.tool_calls.empty());
  }
}

TEST(ToolParser, MalformedCallsLeaveTheWholeReplyAsContent) {
  const char* junk[] = {
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}",             // unterminated
      "<tool_call>\n{\"arguments\": {\"a\": 1}}\n</tool_call>",               // no name
      "<tool_call>\n{\"name\": 5, \"arguments\": {}}\n</tool_call>",          // name not a string
      "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>",  // arguments not an
                                                                              // object
      "<tool_call>\n[1, 2]\n</tool_call>",
      "<tool_call>\n{\"name\": \"f\" \"arguments\": {}}\n</tool_call>",  // missing comma
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>",
      "ok <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> <tool_call>{\"name\":",
  };
  for (const char* t : junk) {
    const ParsedReply r = parse_tool_reply(ToolFormat::kHermes, t, 1);
    EXPECT_EQ(r.content, t);
    EXPECT_TRUE(r.tool_calls.empty()) << t;
  }
}

TEST(ToolParser, StreamingGivesTheSameCallsForEverySplit) {
  const std::string text =
      "Checking both.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"S\xc3\xa3o Paulo\", "
      "\"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"tz\": \"UTC\"}, \"name\": "
      "\"now\"}\n</tool_call>";
  const ParsedReply whole = parse_tool_reply(ToolFormat::kHermes, text, 7);
  expect_calls(whole, "Checking both.",
               {{"get_weather", "{\"city\": \"S\xc3\xa3o Paulo\", \"days\": [1, 2]}"},
                {"now", "{\"tz\": \"UTC\"}"}});
  for (std::vector<size_t> sizes :
       {std::vector<size_t>{1}, {2}, {3, 1}, {5}, {11}, {17, 2}, {1000}}) {
    const ParsedReply r = streamed(ToolFormat::kHermes, text, sizes);
    EXPECT_EQ(r.content, whole.content);
    ASSERT_EQ(r.tool_calls.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(r.tool_calls[i].name, whole.tool_calls[i].name);
      EXPECT_EQ(r.tool_calls[i].arguments, whole.tool_calls[i].arguments);
      EXPECT_EQ(r.tool_calls[i].id, whole.tool_calls[i].id);  // the same seed: the same ids
    }
  }
}

TEST(ToolParser, StreamingSendsTheNameFirstThenArgumentFragments) {
  const std::string text =
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"text\": \"abcdefghij\"}}\n</tool_call>";
  std::vector<ReplyDelta> deltas;
  streamed(ToolFormat::kHermes, text, {4}, &deltas);
  int with_name = 0, fragments = 0;
  for (const ReplyDelta& d : deltas) {
    EXPECT_TRUE(d.content.empty()) << d.content;
    for (const ToolCallDelta& t : d.tool_calls) {
      with_name += !t.name.empty();
      fragments += !t.arguments.empty();
    }
  }
  EXPECT_EQ(with_name, 1);
  EXPECT_GE(fragments, 5);  // the arguments arrive as they are written, not at the end
}

TEST(ToolParser, ContentStreamsButHoldsBackAPossibleTag) {
  ToolCallParser p(ToolFormat::kHermes, 1);
  EXPECT_EQ(p.push("Hello wor").content, "Hello wor");
  EXPECT_EQ(p.push("ld  <tool").content, "ld");  // blanks and "<tool" wait
  EXPECT_EQ(p.push("box> x").content, "  <toolbox> x");
  EXPECT_EQ(p.push("\n").content, "");
  EXPECT_EQ(p.finish().content, "\n");
}

TEST(ToolParser, RandomJunkNeverThrowsAndRoundTripsPlainText) {
  std::mt19937 rng(3);
  const std::string pieces[] = {"<tool_call>",
                                "</tool_call>",
                                "{",
                                "}",
                                "\"name\"",
                                ":",
                                "\"f\"",
                                ",",
                                "\"arguments\"",
                                "[",
                                "]",
                                "\\",
                                "\"",
                                " ",
                                "\n",
                                "x",
                                ";",
                                "<",
                                "\xc3\xa9",
                                "\xff"};
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    const int n = static_cast<int>(rng() % 30);
    for (int k = 0; k < n; ++k) text += pieces[rng() % std::size(pieces)];
    for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3}) {
      const ParsedReply r = parse_tool_reply(f, text, 1);
      if (r.tool_calls.empty()) {
        EXPECT_EQ(r.content, text);
      }
      const ParsedReply s = streamed(f, text, {static_cast<size_t>(1 + rng() % 4)});
      if (!r.tool_calls.empty()) {
        ASSERT_EQ(s.tool_calls.size(), r.tool_calls.size()) << text;
        EXPECT_EQ(s.content, r.content) << text;
      }
    }
  }
}

}  // namespace
}  // namespace smolrt
