// libFuzzer target: the request path of /v1/completions and /v1/chat/completions, from the body's
// bytes to the GenRequest the scheduler gets (parse_json_body -> parse_completion / parse_chat:
// the rendered and tokenized prompt, response_format / grammar compiled through the shared
// GrammarCache, tools rendered and their call grammar), then a model reply through the tool-call
// parser of the request's format. The first byte picks the endpoint, the chat format and whether
// special tokens in content are parsed; the body is the rest up to a '\0', the reply after it.
// Only ApiError may leave the parser (the server answers it; anything else is a bug). A request
// that parses must be one the scheduler can take: a non-empty prompt of valid ids within the
// context, n and max_tokens in range, and a grammar whose shortest completion it accepts.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "grammar/grammar_cache.h"
#include "model/synth.h"
#include "runtime/tool_parser.h"
#include "server/request.h"

namespace {

using namespace smolrt;
using namespace smolrt::server;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

const Tokenizer& tokenizer() {
  static const Tokenizer tok(builtin_byte_vocab());
  return tok;
}

// One cache for the whole run, as the server keeps one: repeated schemas are hits, and an entry
// compiled for one input must serve the next one that has its key. A few entries only: each
// grammar keeps its mask cache, and a run meets many more grammars than a server does.
const std::shared_ptr<grammar::GrammarCache>& grammars() {
  static const auto cache = std::make_shared<grammar::GrammarCache>(
      std::make_shared<const grammar::TokenVocab>(tokenizer()), 4);
  return cache;
}

void check_request(const GenRequest& r, const ParseContext& ctx) {
  check(!r.prompt.empty() && static_cast<int>(r.prompt.size()) <= ctx.seq_ctx);
  for (int id : r.prompt) check(id >= 0 && id < ctx.tok->n_vocab());
  check(r.n >= 1 && r.n <= kMaxChoices);
  check(r.max_tokens >= -1);
  check(r.logprobs >= -1 && r.logprobs <= kMaxTopLogprobs);
  check(static_cast<int>(r.stops.size()) <= kMaxStops);
  if (r.grammar) {
    grammar::GrammarMatcher m(r.grammar);
    const std::string done = m.shortest_completion();
    grammar::GrammarMatcher fresh(r.grammar);
    check(fresh.accept_text(done) && fresh.can_end());
  }
}

void parse_reply(ToolFormat f, std::string_view reply) {
  const ParsedReply whole = parse_tool_reply(f, reply, 7);
  if (whole.tool_calls.empty()) check(whole.content == reply);
  for (const ChatToolCall& c : whole.tool_calls) check(!c.name.empty() && !c.id.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = in.find('\0');
  const std::string body_text(in.substr(0, nul));
  const std::string_view reply =
      nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);

  ParseContext ctx;
  ctx.tok = &tokenizer();
  ctx.model_name = "m";
  ctx.seq_ctx = 4096;
  ctx.chat = true;
  ctx.grammars = grammars();
  static constexpr ChatFormat kFormats[] = {ChatFormat::kChatML, ChatFormat::kGemma,
                                            ChatFormat::kLlama3};
  ctx.format = kFormats[(mode >> 1) % 3];
  ctx.special_in_content = (mode & 8) == 0;
  if (mode & 16) ctx.default_system = "You are helpful.";
  const bool chat = (mode & 1) != 0;
  try {
    const Body body = parse_json_body(body_text);
    const GenRequest r = chat ? parse_chat(body, ctx) : parse_completion(body, ctx);
    check(r.endpoint == (chat ? Endpoint::kChat : Endpoint::kCompletions));
    check(chat || !r.tool_calls.has_value());
    check_request(r, ctx);
    if (r.tool_calls) parse_reply(*r.tool_calls, reply);
  } catch (const ApiError& e) {
    check(e.status >= 400 && e.status < 600);
  }
  return 0;
}
