#include "server/request.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "runtime/chat_template.h"
#include "runtime/sampler.h"

namespace smolrt::server {

using json = Body;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message,
                      const std::string& code = "invalid_value") {
  throw ApiError(400, message, param, code);
}

// A field when present and not null; "wrong type" when the predicate fails. `param`: the field's
// path in the body when it is nested ("response_format.type"); the key when empty.
const json* field(const json& body, const char* key, bool (json::*is)() const noexcept,
                  const char* want, const std::string& param = "") {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  const std::string name = param.empty() ? std::string(key) : param;
  if (!((*it).*is)()) bad(name, cat("'", name, "' must be ", want), "invalid_type");
  return &*it;
}

std::optional<double> get_number(const json& body, const char* key) {
  const json* v = field(body, key, &json::is_number, "a number");
  if (!v) return std::nullopt;
  const double d = v->get<double>();
  if (!std::isfinite(d)) bad(key, cat("'", key, "' must be finite"));
  return d;
}

// An integer (a number with an integral value, as JSON clients may send 5.0).
std::optional<long long> get_int(const json& body, const char* key) {
  const json* v = field(body, key, &json::is_number, "an integer");
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<long long>();
  const double d = v->get<double>();
  if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15)
    bad(key, cat("'", key, "' must be an integer"), "invalid_type");
  return static_cast<long long>(d);
}

std::optional<bool> get_bool(const json& body, const char* key) {
  const json* v = field(body, key, &json::is_boolean, "a boolean");
  if (!v) return std::nullopt;
  return v->get<bool>();
}

void check_range(const char* key, double v, double lo, double hi, const char* range) {
  if (v < lo || v > hi) bad(key, cat("'", key, "' is ", v, "; it must be in ", range));
}

// A list of token ids, each in the vocabulary.
std::vector<int> token_list(const json& arr, const char* key, int n_vocab) {
  std::vector<int> ids;
  ids.reserve(arr.size());
  for (const json& t : arr) {
    if (!t.is_number_integer())
      bad(key, cat("'", key, "' must be a string or a list of token ids"), "invalid_type");
    const long long id = t.get<long long>();
    if (id < 0 || id >= n_vocab)
      bad(key,
          cat("token id ", id, " in '", key, "' is outside the vocabulary [0, ", n_vocab, ")"));
    ids.push_back(static_cast<int>(id));
  }
  return ids;
}

void check_model(const json& body, const ParseContext& ctx) {
  const json* m = field(body, "model", &json::is_string, "a string");
  if (m && m->get<std::string>() != ctx.model_name && !m->get<std::string>().empty()) {
    throw ApiError(
        404,
        cat("The model '", m->get<std::string>(), "' does not exist; this server serves '",
            ctx.model_name, "' (GET /v1/models)"),
        "model", "model_not_found");
  }
}

grammar::GrammarCache& grammars(const ParseContext& ctx) {
  if (!ctx.grammars) fail("the server was built without a grammar cache (ParseContext::grammars)");
  return *ctx.grammars;
}

// A compiled grammar from `compile`, or a 400 naming `param` and what the compiler refused.
template <class F>
std::shared_ptr<const grammar::CompiledGrammar> compiled(const std::string& param, F&& compile) {
  try {
    return compile();
  } catch (const grammar::GrammarError& e) {
    bad(param, cat(param, ": ", e.what()), "invalid_schema");
  }
}

// response_format {"type": "text" | "json_object" | "json_schema", "json_schema": {"name",
// "schema", "strict"}} or llama.cpp's `grammar` (GBNF text): the grammar every sampled token must
// follow; nullptr when the output is free.
std::shared_ptr<const grammar::CompiledGrammar> structured_output(const json& body,
                                                                  const ParseContext& ctx) {
  std::shared_ptr<const grammar::CompiledGrammar> g;
  if (const json* rf = field(body, "response_format", &json::is_object, "an object")) {
    const json* type = field(*rf, "type", &json::is_string, "a string", "response_format.type");
    const std::string t = type ? type->get<std::string>() : "";
    if (t == "json_object") {
      g = compiled("response_format", [&] { return grammars(ctx).json_object(); });
    } else if (t == "json_schema") {
      const std::string at = "response_format.json_schema";
      const json* js = field(*rf, "json_schema", &json::is_object, "an object", at);
      if (!js) bad(at, cat("'", at, "' is required with type json_schema"), "missing");
      field(*js, "name", &json::is_string, "a string", at + ".name");
      field(*js, "strict", &json::is_boolean, "a boolean", at + ".strict");
      auto schema = js->find("schema");
      if (schema == js->end() || schema->is_null())
        bad(at + ".schema", cat("'", at, ".schema' is required (the JSON schema)"), "missing");
      g = compiled(at + ".schema", [&] { return grammars(ctx).json_schema(*schema); });
    } else if (t != "text") {
      bad("response_format.type",
          cat("'response_format.type' is '", t, "'; it must be text, json_object or json_schema"));
    }
  }
  if (const json* gb = field(body, "grammar", &json::is_string, "a string (GBNF)")) {
    const std::string& text = gb->get_ref<const std::string&>();
    if (!text.empty()) {
      if (g) bad("grammar", "give either 'grammar' or a JSON 'response_format', not both");
      g = compiled("grammar", [&] { return grammars(ctx).gbnf(text); });
    }
  }
  return g;
}

// logit_bias {"token id": bias}: -100 bans the token, 100 keeps only the tokens given 100 (what
// OpenAI says those values do), 0 does nothing. The engines apply them as the token mask that
// structured output uses; a bias between would need the sampler to add it, so it is refused
// rather than ignored.
void parse_logit_bias(const json& body, const ParseContext& ctx, GenRequest& r) {
  const json* lb = field(body, "logit_bias", &json::is_object, "an object of token id -> bias");
  if (!lb) return;
  if (lb->size() > static_cast<size_t>(kMaxLogitBias))
    bad("logit_bias", cat("'logit_bias' has ", lb->size(), " entries; at most ", kMaxLogitBias));
  const int n_vocab = ctx.tok->n_vocab();
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& k = it.key();
    long long id = -1;
    if (!k.empty() && k.size() <= 9 &&
        std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; }))
      id = std::stoll(k);
    if (id < 0 || id >= n_vocab)
      bad("logit_bias", cat("'logit_bias' key '", k, "' is not a token id in [0, ", n_vocab, ")"));
    if (!it->is_number())
      bad("logit_bias", cat("'logit_bias' value for token ", id, " must be a number"),
          "invalid_type");
    const double v = it->get<double>();
    if (v == -100) {
      r.banned_tokens.push_back(static_cast<int>(id));
    } else if (v == 100) {
      r.only_tokens.push_back(static_cast<int>(id));
    } else if (v != 0) {
      bad("logit_bias",
          cat("'logit_bias' gives token ", id, " the bias ", v,
              "; only -100 (never sample it), 100 (sample only among the tokens given 100) and "
              "0 are supported"),
          "unsupported_value");
    }
  }
  // Keys such as "7" and "007" name one token: the lists are sets.
  for (std::vector<int>* v : {&r.banned_tokens, &r.only_tokens}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  const bool none_left = r.only_tokens.empty()
                             ? static_cast<int>(r.banned_tokens.size()) == n_vocab
                             : std::includes(r.banned_tokens.begin(), r.banned_tokens.end(),
                                             r.only_tokens.begin(), r.only_tokens.end());
  if (none_left) bad("logit_bias", "'logit_bias' leaves no token that may be sampled");
}

// The fields both endpoints share. Prompt-dependent checks run in finish().
void parse_common(const json& body, const ParseContext& ctx, GenRequest& r) {
  check_model(body, ctx);
  if (auto n = get_int(body, "n")) {
    if (*n < 1 || *n > kMaxChoices)
      bad("n", cat("'n' is ", *n, "; it must be in [1, ", kMaxChoices, "]"));
    r.n = static_cast<int>(*n);
  }
  if (auto b = get_int(body, "best_of"); b && *b != r.n) {
    bad("best_of",
        cat("'best_of' is ", *b, "; only best_of = n (", r.n,
            ") is supported: ask for n choices and rank them yourself"),
        "unsupported_value");
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (auto v = get_int(body, key)) {
      if (*v < 0) bad(key, cat("'", key, "' is ", *v, "; it must be >= 0"));
      r.max_tokens = static_cast<int>(std::min(*v, 1LL << 30));
    }
  }

  SamplingParams& s = r.sampling;
  s = SamplingParams{};
  s.temp = 1.0f;
  s.top_k = 0;
  s.top_p = 1.0f;
  s.min_p = 0.0f;
  s.repeat_penalty = 1.0f;
  s.seed = -1;
  if (auto v = get_number(body, "temperature")) {
    check_range("temperature", *v, 0, 2, "[0, 2]");
    s.temp = static_cast<float>(*v);
  }
  if (auto v = get_number(body, "top_p")) {
    if (*v <= 0 || *v > 1) bad("top_p", cat("'top_p' is ", *v, "; it must be in (0, 1]"));
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = get_int(body, "top_k")) {
    if (*v < -1) bad("top_k", "'top_k' must be >= 0 (0 or -1 = off)");
    s.top_k = *v < 0 ? 0 : static_cast<int>(std::min(*v, 1LL << 30));
  }
  if (auto v = get_number(body, "min_p")) {
    check_range("min_p", *v, 0, 1, "[0, 1]");
    s.min_p = static_cast<float>(*v);
  }
  if (auto v = get_number(body, "presence_penalty")) {
    check_range("presence_penalty", *v, -2, 2, "[-2, 2]");
    s.presence_penalty = static_cast<float>(*v);
  }
  if (auto v = get_number(body, "frequency_penalty")) {
    check_range("frequency_penalty", *v, -2, 2, "[-2, 2]");
    s.frequency_penalty = static_cast<float>(*v);
  }
  if (auto v = get_number(body, "repetition_penalty")) {
    if (*v <= 0 || *v > 10) bad("repetition_penalty", "'repetition_penalty' must be in (0, 10]");
    s.repeat_penalty = static_cast<float>(*v);
  }
  if (auto v = get_int(body, "seed")) s.seed = *v < 0 ? -1 : *v;
  parse_logit_bias(body, ctx, r);
  try {
    validate(s);  // the engine's own checks (names CLI flags; the ranges above are tighter)
  } catch (const Error& e) {
    bad("", e.what());
  }

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stops.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > static_cast<size_t>(kMaxStops))
        bad("stop", cat("'stop' has ", it->size(), " strings; at most ", kMaxStops));
      for (const json& s2 : *it) {
        if (!s2.is_string())
          bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
        r.stops.push_back(s2.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
    }
  }
  if (auto v = get_bool(body, "ignore_eos")) r.ignore_eos = *v;
  if (auto v = get_bool(body, "stream")) r.stream = *v;
  if (const json* so = field(body, "stream_options", &json::is_object, "an object")) {
    if (auto v = get_bool(*so, "include_usage")) r.include_usage = *v;
  }
  r.grammar = structured_output(body, ctx);
}

// Checks that need the prompt: not empty, fits the context.
void finish(GenRequest& r, const ParseContext& ctx, const char* prompt_param) {
  if (r.prompt.empty()) bad(prompt_param, cat("'", prompt_param, "' is empty"));
  const long long n = static_cast<long long>(r.prompt.size());
  if (n > ctx.seq_ctx) {
    bad(prompt_param,
        cat("the prompt has ", n, " tokens; the context holds ", ctx.seq_ctx,
            " (prompt + generated tokens)"),
        "context_length_exceeded");
  }
}

// A message's text: a string or a list of text parts.
std::string message_text(const json& m, const std::string& at) {
  auto c = m.find("content");
  if (c == m.end() || c->is_null()) return "";
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array())
    bad("messages", cat(at, ".content must be a string or a list of text parts"), "invalid_type");
  std::string text;
  for (const json& part : *c) {  // [{"type": "text", "text": ...}, ...]
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad("messages", cat(at, ": only text content parts are supported"), "invalid_type");
    text += part["text"].get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments"}}]; arguments as OpenAI sends them (a JSON string) or as an object.
std::vector<ChatToolCall> message_tool_calls(const json& calls, const std::string& at) {
  if (!calls.is_array()) bad("messages", cat(at, " must be a list"), "invalid_type");
  std::vector<ChatToolCall> out;
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& c = calls[j];
    const std::string cj = cat(at, "[", j, "]");
    const auto fn = c.is_object() ? c.find("function") : c.end();
    if (!c.is_object() || c.value("type", json("function")) != "function" || fn == c.end() ||
        !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
      bad("messages",
          cat(cj,
              " must be {\"id\": ..., \"type\": \"function\", \"function\": {\"name\": "
              "..., \"arguments\": ...}}"),
          "invalid_type");
    }
    ChatToolCall call;
    call.name = (*fn)["name"].get<std::string>();
    if (auto id = c.find("id"); id != c.end() && id->is_string()) call.id = id->get<std::string>();
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null())
      call.arguments = "{}";
    else if (args->is_string())
      call.arguments = args->get<std::string>();
    else if (args->is_object())
      call.arguments = args->dump(-1, ' ', false, json::error_handler_t::replace);
    else
      bad("messages", cat(cj, ".function.arguments must be a JSON string"), "invalid_type");
    out.push_back(std::move(call));
  }
  return out;
}

// One entry of `messages`: system / developer, user, assistant (with tool_calls), tool (with
// tool_call_id).
ChatMessage chat_message(const json& m, size_t i) {
  const std::string at = cat("messages[", i, "]");
  if (!m.is_object()) bad("messages", cat(at, " must be an object"), "invalid_type");
  const json* role = field(m, "role", &json::is_string, "a string", "messages");
  if (!role) bad("messages", cat(at, " needs a 'role'"), "missing");
  const std::string& rs = role->get_ref<const std::string&>();
  if (rs != "system" && rs != "user" && rs != "assistant" && rs != "developer" && rs != "tool")
    bad("messages", cat(at, ": unknown role '", rs, "' (system, user, assistant, tool)"));
  ChatMessage msg{rs == "developer" ? "system" : rs, message_text(m, at)};
  if (rs == "assistant") {
    if (auto c = m.find("tool_calls"); c != m.end() && !c->is_null())
      msg.tool_calls = message_tool_calls(*c, at + ".tool_calls");
  } else if (rs == "tool") {
    const json* id = field(m, "tool_call_id", &json::is_string, "a string", "messages");
    if (!id) bad("messages", cat(at, ": a 'tool' message needs 'tool_call_id'"), "missing");
    msg.tool_call_id = id->get<std::string>();
  }
  return msg;
}

}  // namespace

nlohmann::json error_body(const ApiError& e) {
  nlohmann::json err = {{"message", e.what()}, {"type", e.type}, {"code", e.code}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  return {{"error", err}};
}

json parse_json_body(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad("", "the request body is not valid JSON", "invalid_json");
  if (!j.is_object()) bad("", "the request body must be a JSON object", "invalid_json");
  return j;
}

GenRequest parse_completion(const json& body, const ParseContext& ctx) {
  GenRequest r;
  r.endpoint = Endpoint::kCompletions;
  parse_common(body, ctx, r);
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad("prompt", "'prompt' is required", "missing");
  const json* p = &*it;
  // A one-element batch (["text"] or [[ids]]) is the same as its element; more are refused.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    if (p->get_ref<const std::string&>().empty()) bad("prompt", "'prompt' is empty");
    r.prompt_text = p->get<std::string>();
    r.prompt = ctx.tok->encode(r.prompt_text, /*parse_special=*/true, /*add_bos=*/-1);
  } else if (p->is_array()) {
    if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array()))
      bad("prompt", "only one prompt per request is supported");
    r.prompt = token_list(*p, "prompt", ctx.tok->n_vocab());
    r.prompt_text = ctx.tok->decode(r.prompt);
  } else {
    bad("prompt", "'prompt' must be a string or a list of token ids", "invalid_type");
  }
  if (auto v = get_bool(body, "echo")) r.echo = *v;
  if (auto v = get_int(body, "logprobs")) {
    if (*v < 0 || *v > kMaxTopLogprobs)
      bad("logprobs", cat("'logprobs' must be in [0, ", kMaxTopLogprobs, "]"));
    r.logprobs = static_cast<int>(*v);
  }
  finish(r, ctx, "prompt");
  return r;
}

GenRequest parse_chat(const json& body, const ParseContext& ctx) {
  GenRequest r;
  r.endpoint = Endpoint::kChat;
  parse_common(body, ctx, r);
  if (!ctx.chat) {
    bad("messages",
        "this model has no chat template of a known format (ChatML, Gemma, Llama 3); use "
        "/v1/completions or start the server with --chat-template chatml, gemma or llama3");
  }
  std::vector<ToolSpec> tools;
  ToolChoice choice;
  bool parallel = true;
  try {
    if (auto t = body.find("tools"); t != body.end() && !t->is_null()) tools = parse_tools(*t);
    auto c = body.find("tool_choice");
    choice = parse_tool_choice(c == body.end() ? nullptr : &*c, tools);
  } catch (const ToolError& e) {
    bad(e.param(), e.what());
  }
  if (auto v = get_bool(body, "parallel_tool_calls")) parallel = *v;
  const bool with_tools = choice.mode != ToolChoiceMode::kNone;
  if (with_tools && r.grammar) {
    bad(body.contains("grammar") ? "grammar" : "response_format",
        "'response_format' and 'grammar' apply only without tools (or with tool_choice "
        "\"none\"): the reply is either tool calls or the constrained text");
  }

  const json* msgs = field(body, "messages", &json::is_array, "a list of messages");
  if (!msgs) bad("messages", "'messages' is required", "missing");
  if (msgs->empty()) bad("messages", "'messages' is empty");
  std::vector<ChatMessage> chat;
  bool tool_turns = false;  // assistant tool calls or tool results to render
  for (size_t i = 0; i < msgs->size(); ++i) {
    chat.push_back(chat_message((*msgs)[i], i));
    tool_turns = tool_turns || chat.back().role == "tool" || !chat.back().tool_calls.empty();
  }
  if (chat.front().role != "system" && !ctx.default_system.empty())
    chat.insert(chat.begin(), ChatMessage{"system", ctx.default_system});
  std::vector<std::pair<size_t, size_t>> content;
  std::string rendered;
  if (with_tools || tool_turns) {
    try {
      rendered = render_chat_with_tools(
          ctx.format, chat,
          with_tools ? std::span<const ToolSpec>(tools) : std::span<const ToolSpec>(),
          /*add_generation_prompt=*/true, &content);
    } catch (const ToolError& e) {
      bad(e.param(), e.what());
    }
  } else {
    rendered = render_chat(ctx.format, chat, /*add_generation_prompt=*/true, &content);
  }
  if (ctx.special_in_content) content.clear();
  r.prompt = ctx.tok->encode(rendered, /*parse_special=*/true, /*add_bos=*/-1, content);
  if (with_tools) {
    const ToolFormat f = tool_format(ctx.format);
    r.tool_calls = f;
    if (choice.mode == ToolChoiceMode::kRequired || choice.mode == ToolChoiceMode::kFunction) {
      try {
        r.grammar = grammars(ctx).get(tool_grammar_key(f, tools, choice, parallel), [&] {
          return *tool_call_grammar(f, tools, choice, parallel);
        });
      } catch (const ToolError& e) {
        bad(e.param(), e.what(), "invalid_schema");
      } catch (const grammar::GrammarError& e) {
        bad("tools", cat("tools: ", e.what()), "invalid_schema");
      }
    }
  }
  if (auto v = get_bool(body, "logprobs"); v && *v) r.logprobs = 0;
  if (auto v = get_int(body, "top_logprobs")) {
    if (*v < 0 || *v > kMaxTopLogprobs)
      bad("top_logprobs", cat("'top_logprobs' must be in [0, ", kMaxTopLogprobs, "]"));
    if (r.logprobs < 0) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.logprobs = static_cast<int>(*v);
  }
  finish(r, ctx, "messages");
  return r;
}

std::vector<int> parse_tokenize(const json& body, const ParseContext& ctx) {
  const json* c = field(body, "content", &json::is_string, "a string");
  if (!c) bad("content", "'content' is required", "missing");
  const bool add_special = get_bool(body, "add_special").value_or(false);
  return ctx.tok->encode(c->get<std::string>(), /*parse_special=*/true, add_special ? -1 : 0);
}

std::vector<int> parse_detokenize(const json& body, const ParseContext& ctx) {
  const json* t = field(body, "tokens", &json::is_array, "a list of token ids");
  if (!t) bad("tokens", "'tokens' is required", "missing");
  return token_list(*t, "tokens", ctx.tok->n_vocab());
}

}  // namespace smolrt::server
