// libFuzzer target: the structured-output and tool-call inputs a request can carry. The first
// byte picks the path, the rest is the input:
//   0: GBNF text [\0 sample text]   1: a JSON schema [\0 sample text]
//   2: a model reply for the tool-call parser   3: an OpenAI `tools` array + reply text
// Only GrammarError / ToolError may be thrown (any other exception or crash is a bug). When a
// grammar compiles (over a byte-level vocabulary, so every check is cheap), checked on the start
// and after each accepted piece of the sample: the mask equals the matcher's accept_token for
// every token and allows some token (no dead end), and the shortest completion completes the
// match; a schema's completion is JSON.
// The parser: any split of the text streams to the same calls as the whole, and a reply without
// calls is returned unchanged.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "model/synth.h"
#include "runtime/tool_parser.h"
#include "runtime/tools.h"

namespace {

using namespace smolrt;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

const std::shared_ptr<const grammar::TokenVocab>& byte_vocab() {
  static const Tokenizer tok(builtin_byte_vocab());
  static const auto v = std::make_shared<const grammar::TokenVocab>(tok);
  return v;
}

void check_mask(grammar::GrammarMatcher& m) {
  const grammar::TokenVocab& v = m.grammar().vocab();
  const uint64_t* bits = m.mask();
  const std::vector<uint64_t> mask(bits, bits + v.mask_words());
  bool any = false;
  for (int id = 0; id < v.n_vocab(); ++id) {
    const bool ok = m.accept_token(id);
    if (ok) m.rollback(1);
    check(ok == (((mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1) != 0));
    any = any || ok;
  }
  check(any);  // no dead end: some byte, or the end of generation, is allowed
}

void check_completion(const grammar::GrammarMatcher& m) {
  grammar::GrammarMatcher done = m;
  check(done.accept_text(m.shortest_completion()) && done.can_end());
}

void exercise(const grammar::Grammar& g, std::string_view sample, bool json) {
  const auto cg = grammar::compile(g, byte_vocab());
  grammar::GrammarMatcher m(cg);
  check_mask(m);
  check_completion(m);
  if (json) {
    grammar::GrammarMatcher fresh(cg);
    const std::string text = fresh.shortest_completion();
    check(nlohmann::json::accept(text));
  }
  // The sample in pieces of 3 bytes while the grammar accepts them.
  for (size_t at = 0; at < sample.size() && at < 96; at += 3) {
    if (!m.accept_text(sample.substr(at, 3))) break;
    check_mask(m);
    check_completion(m);
  }
}

void parse_reply(ToolFormat f, std::string_view text, size_t split) {
  const ParsedReply whole = parse_tool_reply(f, text, 1);
  if (whole.tool_calls.empty()) check(whole.content == text);
  ToolCallParser p(f, 1);
  std::string content;
  int calls = 0;
  auto take = [&](const ReplyDelta& d) {
    content += d.content;
    for (const ToolCallDelta& t : d.tool_calls) calls = std::max(calls, t.index + 1);
  };
  for (size_t at = 0; at < text.size(); at += split) take(p.push(text.substr(at, split)));
  take(p.finish());
  if (!whole.tool_calls.empty()) {
    check(p.calls_ok());
    check(content == whole.content);
    check(calls == static_cast<int>(whole.tool_calls.size()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 4;
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = in.find('\0');
  const std::string_view head = in.substr(0, nul);
  const std::string_view tail =
      nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  try {
    if (mode == 0) {
      exercise(grammar::parse_gbnf(head), tail, false);
    } else if (mode == 1) {
      exercise(grammar::json_schema_grammar(grammar::parse_schema_text(head)), tail, true);
    } else if (mode == 2) {
      for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3})
        parse_reply(f, in, 1 + static_cast<size_t>(data[0] / 4) % 7);
    } else {
      const auto tools_json =
          nlohmann::ordered_json::parse(head, nullptr, /*allow_exceptions=*/false);
      if (tools_json.is_discarded()) return 0;
      const std::vector<ToolSpec> tools = parse_tools(tools_json);
      std::vector<ChatMessage> msgs = {{"user", std::string(tail)}};
      const ParsedReply reply = parse_tool_reply(ToolFormat::kHermes, tail, 1);
      msgs.push_back({"assistant", reply.content, reply.tool_calls});
      msgs.push_back({"tool", "42"});
      for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kGemma, ChatFormat::kLlama3}) {
        try {
          (void)render_chat_with_tools(f, msgs, tools, true);
        } catch (const ToolError&) {  // Llama 3: several calls in one message
        }
        for (ToolChoiceMode c : {ToolChoiceMode::kRequired, ToolChoiceMode::kFunction}) {
          if (tools.empty()) continue;
          const auto g = tool_call_grammar(tool_format(f), tools, {c, tools[0].name}, true);
          check(g.has_value());
          exercise(*g, tail, false);
        }
      }
    }
  } catch (const grammar::GrammarError&) {
  } catch (const ToolError&) {
  }
  return 0;
}
