#include "server/gen_response.h"

#include <random>

#include "core/error.h"

namespace smolrt::server {

using json = nlohmann::json;

namespace {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json stop_reason_json(const Delta& d) {
  return d.stop_reason.empty() ? json(nullptr) : json(d.stop_reason);
}

// A token's text as it reads inside a sequence: decode() of one SPM token drops the leading
// space a sequence-initial "▁" stands for, so put it back.
std::string piece(const Tokenizer& tok, int id) {
  std::string s = tok.decode(std::span<const int>(&id, 1));
  if (tok.vocab().model == "llama" && tok.piece(id).starts_with("\xe2\x96\x81") &&
      !s.starts_with(' '))
    s.insert(s.begin(), ' ');
  return s;
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json chat_logprob(const Tokenizer& tok, const TokenLogprob& lp) {
  const std::string s = piece(tok, lp.token);
  json top = json::array();
  for (const TopLogprob& t : lp.top) {
    const std::string ts = piece(tok, t.token);
    top.push_back({{"token", ts}, {"logprob", t.logprob}, {"bytes", bytes_of(ts)}});
  }
  return {{"token", s}, {"logprob", lp.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}};
}

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

constexpr const char* kDone = "data: [DONE]\n\n";

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

// A choice the server cancelled at shutdown before it produced anything.
bool shut_before_start(const Delta& d) {
  return d.finished && d.n_generated == 0 && d.stop_reason == "shutdown";
}

}  // namespace

std::string error_json(const ApiError& e) {
  return dump(error_body(e));
}

// --- logprobs in the two OpenAI shapes -----------------------------------------------------------

void CompletionLogprobs::add(const Tokenizer& tok, const TokenLogprob& lp, size_t& offset) {
  const std::string s = piece(tok, lp.token);
  tokens.push_back(s);
  text_offset.push_back(offset);
  offset += s.size();
  if (!lp.has_logprob) {
    token_logprobs.push_back(nullptr);
    top_logprobs.push_back(nullptr);
    return;
  }
  token_logprobs.push_back(lp.logprob);
  json top = json::object();
  for (const TopLogprob& t : lp.top) {
    const std::string k = piece(tok, t.token);
    if (!top.contains(k)) top[k] = t.logprob;
  }
  top_logprobs.push_back(top);
}

json tool_call_json(const ChatToolCall& c) {
  return {{"id", c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

json tool_call_delta_json(const ToolCallDelta& d) {
  json j = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
  if (!d.id.empty()) {
    j["id"] = d.id;
    j["type"] = "function";
    j["function"]["name"] = d.name;
  }
  return j;
}

json CompletionLogprobs::to_json() const {
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

// --- GenResponse ---------------------------------------------------------------------------------

GenResponse::GenResponse(std::vector<std::shared_ptr<Job>> jobs, Endpoint ep, std::string id,
                         long long created, std::string model, const Tokenizer& tok)
    : ep_(ep), id_(std::move(id)), created_(created), model_(std::move(model)), tok_(tok) {
  if (jobs.empty()) fail("GenResponse: no choices");
  // Tool-call ids ("call_" + 24 letters and digits) differ between responses.
  std::random_device rd;
  id_seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  for (size_t i = 0; i < jobs.size(); ++i) {
    Choice& c = choices_.emplace_back();
    c.job = std::move(jobs[i]);
    c.index = static_cast<int>(i);
    const GenRequest& r = c.job->request();
    if (r.stream && r.tool_calls && ep_ == Endpoint::kChat)
      c.parser.emplace(*r.tool_calls, call_seed(c.index));
  }
}

GenResponse::~GenResponse() {
  for (Choice& c : choices_) c.job->cancel();
}

GenStep GenResponse::poll(bool started) {
  GenStep s;
  for (Choice& c : choices_) {
    Delta d;
    if (c.finished || !c.job->take(d, std::chrono::milliseconds(0))) continue;
    if (c.index == 0 && !d.prompt_logprobs.empty()) prompt_lp_ = d.prompt_logprobs;
    if (d.finished && d.finish_reason == "error") {
      return end_with_error(!d.error_code.empty()
                                ? ApiError(400, d.error, d.error_param, d.error_code)
                                : ApiError(500, d.error, "", "internal_error", "server_error"),
                            started);
    }
    c.all.standing_from(d);
    c.finished = d.finished;
    if (stream()) {
      if (!shut_before_start(d)) {  // else held back: the whole request may get a 503 instead
        s.data += stream_delta(c, d);
        if (c.finished) s.data += stream_finish(c);
      }
    } else {
      c.all.text += d.text;
      c.gen_lp.insert(c.gen_lp.end(), d.logprobs.begin(), d.logprobs.end());
    }
  }
  bool all_done = true, none_started = true;
  for (const Choice& c : choices_) {
    all_done = all_done && c.finished;
    none_started = none_started && shut_before_start(c.all);
  }
  if (!all_done) return s;

  note_ = cat("prompt=", choices_[0].all.n_prompt, " cached=", choices_[0].all.n_cached,
              " gen=", usage()["completion_tokens"].get<int>(), " finish=");
  for (const Choice& c : choices_) {
    note_ += cat(c.index ? "," : "", c.all.finish_reason, c.all.stop_reason.empty() ? "" : "/",
                 c.all.stop_reason);
  }
  if (none_started) {
    return end_with_error(ApiError(503, "the server is shutting down; the request was not started",
                                   "", "shutting_down", "server_error"),
                          started);
  }
  s.done = true;
  if (!stream()) {
    s.data = dump(whole());
    return s;
  }
  for (Choice& c : choices_)  // the finish chunks held back above
    if (shut_before_start(c.all)) s.data += stream_finish(c);
  if (req().include_usage) {
    json u = head(ep_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
    u["choices"] = json::array();
    u["usage"] = usage();
    s.data += sse(u);
  }
  s.data += kDone;
  return s;
}

GenStep GenResponse::end_with_error(const ApiError& e, bool started) {
  GenStep s;
  s.done = true;
  if (started) {
    s.data = sse(error_body(e)) + kDone;
  } else {
    s.status = e.status;
    s.data = error_json(e);
  }
  if (note_.empty()) note_ = cat("error: ", e.what());
  return s;
}

json GenResponse::head(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json GenResponse::usage() const {
  int generated = 0;
  for (const Choice& c : choices_) generated += c.all.n_generated;
  const Delta& first = choices_[0].all;
  return {{"prompt_tokens", first.n_prompt},
          {"completion_tokens", generated},
          {"total_tokens", first.n_prompt + generated},
          {"prompt_tokens_details", {{"cached_tokens", first.n_cached}}}};
}

// "tool_calls" for a choice that made calls and ended by itself; else the scheduler's reason.
std::string GenResponse::finish_reason(const Choice& c, bool calls) const {
  if (calls && c.all.finish_reason == "stop" && c.all.stop_reason.empty()) return "tool_calls";
  return c.all.finish_reason;
}

json GenResponse::completion_logprobs(Choice& c, const std::vector<TokenLogprob>& prompt,
                                      const std::vector<TokenLogprob>& gen) {
  CompletionLogprobs lp;
  for (const TokenLogprob& t : prompt) lp.add(tok_, t, c.offset);
  for (const TokenLogprob& t : gen) lp.add(tok_, t, c.offset);
  return lp.to_json();
}

json GenResponse::chat_logprobs(const std::vector<TokenLogprob>& gen) const {
  json content = json::array();
  for (const TokenLogprob& t : gen) content.push_back(chat_logprob(tok_, t));
  return {{"content", content}, {"refusal", nullptr}};
}

json GenResponse::chunk(Choice& c, const std::string& text, const json& calls, json logprobs,
                        json finish) {
  const bool chat = ep_ == Endpoint::kChat;
  json out = head(chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", c.index}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}};
  if (chat) {
    json delta = json::object();
    if (c.first) delta["role"] = "assistant";
    if (!text.empty() || c.first) delta["content"] = text;
    if (!calls.empty()) {
      if (text.empty() && c.first) delta["content"] = nullptr;
      delta["tool_calls"] = calls;
    }
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  c.first = false;
  out["choices"] = json::array({choice});
  return out;
}

std::string GenResponse::stream_delta(Choice& c, const Delta& d) {
  const GenRequest& r = req();
  std::string text = d.text;
  json calls = json::array();
  if (c.parser) {
    ReplyDelta rd = c.parser->push(d.text);
    if (d.finished) {
      ReplyDelta tail = c.parser->finish();
      rd.content += tail.content;
      rd.tool_calls.insert(rd.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
    }
    text = std::move(rd.content);
    for (const ToolCallDelta& t : rd.tool_calls) {
      // Fragments of the call the previous entry started or continued join it.
      if (!calls.empty() && t.id.empty() && calls.back()["index"] == t.index) {
        std::string& args = calls.back()["function"]["arguments"].get_ref<std::string&>();
        args += t.arguments;
      } else {
        calls.push_back(tool_call_delta_json(t));
      }
    }
    c.n_calls = c.parser->n_calls();
  }
  // echo: the prompt (and, with logprobs, its logprobs: the first choice scored them) leads.
  const bool echo = c.first && r.echo;
  if (echo) text = r.prompt_text + text;
  static const std::vector<TokenLogprob> kNone;
  const std::vector<TokenLogprob>& plp = !echo          ? kNone
                                         : c.index == 0 ? d.prompt_logprobs
                                                        : prompt_lp_;
  const bool lp = r.logprobs >= 0 && (!d.logprobs.empty() || !plp.empty());
  // Nothing to show: no chunk (the first one, which names the role, waits for the end).
  if (text.empty() && calls.empty() && !lp && (!c.first || d.finished)) return "";
  json logprobs = nullptr;
  if (r.logprobs >= 0)
    logprobs = ep_ == Endpoint::kChat ? chat_logprobs(d.logprobs)
                                      : completion_logprobs(c, plp, d.logprobs);
  return sse(chunk(c, text, calls, std::move(logprobs), nullptr));
}

std::string GenResponse::stream_finish(Choice& c) {
  const bool calls = c.parser && c.n_calls > 0 && c.parser->calls_ok();
  json last = chunk(c, "", json::array(), nullptr, finish_reason(c, calls));
  last["choices"][0]["stop_reason"] = stop_reason_json(c.all);
  return sse(last);
}

json GenResponse::whole() {
  const GenRequest& r = req();
  const bool chat = ep_ == Endpoint::kChat;
  json j = head(chat ? "chat.completion" : "text_completion");
  json arr = json::array();
  for (Choice& c : choices_) {
    json choice = {{"index", c.index}, {"stop_reason", stop_reason_json(c.all)}};
    json lp = nullptr;
    if (r.logprobs >= 0) {
      static const std::vector<TokenLogprob> kNone;
      lp = chat ? chat_logprobs(c.gen_lp)
                : completion_logprobs(c, r.echo ? prompt_lp_ : kNone, c.gen_lp);
    }
    choice["logprobs"] = lp;
    bool calls = false;
    if (chat) {
      json msg = {{"role", "assistant"}, {"content", c.all.text}, {"refusal", nullptr}};
      if (r.tool_calls) {
        const ParsedReply p = parse_tool_reply(*r.tool_calls, c.all.text, call_seed(c.index));
        if (!p.tool_calls.empty()) {
          calls = true;
          msg["content"] = blank(p.content) ? json(nullptr) : json(p.content);
          json tc = json::array();
          for (const ChatToolCall& call : p.tool_calls) tc.push_back(tool_call_json(call));
          msg["tool_calls"] = tc;
        }
      }
      choice["message"] = msg;
    } else {
      choice["text"] = r.echo ? r.prompt_text + c.all.text : c.all.text;
    }
    choice["finish_reason"] = finish_reason(c, calls);
    arr.push_back(std::move(choice));
  }
  j["choices"] = std::move(arr);
  j["usage"] = usage();
  return j;
}

}  // namespace smolrt::server
