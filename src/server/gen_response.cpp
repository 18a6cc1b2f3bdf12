#include "server/gen_response.h"

#include "core/error.h"

namespace smolrt::server {

using json = nlohmann::json;

namespace {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json usage_json(const Delta& d) {
  return {{"prompt_tokens", d.n_prompt},
          {"completion_tokens", d.n_generated},
          {"total_tokens", d.n_prompt + d.n_generated}};
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

json CompletionLogprobs::to_json() const {
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

// --- GenResponse ---------------------------------------------------------------------------------

GenResponse::GenResponse(std::shared_ptr<Job> job, Endpoint ep, std::string id, long long created,
                         std::string model, const Tokenizer& tok)
    : job_(std::move(job)),
      ep_(ep),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      tok_(tok) {}

GenResponse::~GenResponse() {
  job_->cancel();
}

GenStep GenResponse::step(const Delta& d, bool started) {
  GenStep s;
  if (d.finished) {
    note_ = cat("prompt=", d.n_prompt, " gen=", d.n_generated, " finish=", d.finish_reason,
                d.stop_reason.empty() ? "" : "/", d.stop_reason);
  }
  if (d.finished && d.n_generated == 0 && d.stop_reason == "shutdown") {
    const ApiError e(503, "the server is shutting down; the request was not started", "",
                     "shutting_down", "server_error");
    s.done = true;
    if (started) {
      s.data = sse(error_body(e)) + "data: [DONE]\n\n";
    } else {
      s.status = 503;
      s.data = error_json(e);
    }
    return s;
  }
  if (d.finished && !started && d.finish_reason == "error") {
    s.done = true;
    s.status = 500;
    s.data = error_json(ApiError(500, d.error, "", "internal_error", "server_error"));
    return s;
  }
  if (stream()) {
    s.data = stream_chunks(d);
    if (d.finished) s.data += stream_end(d);
  } else {
    accumulate(d);
    if (d.finished) s.data = dump(whole(all_));
  }
  s.done = d.finished;
  return s;
}

json GenResponse::head(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

// The choice's logprobs for these tokens (prompt ones first), null when not asked.
json GenResponse::logprobs_of(const std::vector<TokenLogprob>& prompt,
                              const std::vector<TokenLogprob>& gen, bool keep) {
  if (job_->request().logprobs < 0) return nullptr;
  if (ep_ == Endpoint::kChat) {
    json content = json::array();
    for (const TokenLogprob& t : gen) content.push_back(chat_logprob(tok_, t));
    if (keep) {
      for (auto& c : content) chat_lp_.push_back(c);
      return nullptr;
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  CompletionLogprobs fresh;
  CompletionLogprobs& lp = keep ? lp_ : fresh;
  for (const TokenLogprob& t : prompt) lp.add(tok_, t, offset_);
  for (const TokenLogprob& t : gen) lp.add(tok_, t, offset_);
  return keep ? json(nullptr) : lp.to_json();
}

json GenResponse::chunk(const std::string& text, json logprobs, json finish) {
  const bool chat = ep_ == Endpoint::kChat;
  json c = head(chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}};
  if (chat) {
    json delta = json::object();
    if (first_) delta["role"] = "assistant";
    if (!text.empty() || first_) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  first_ = false;
  c["choices"] = json::array({choice});
  return c;
}

std::string GenResponse::stream_chunks(const Delta& d) {
  const GenRequest& r = job_->request();
  std::string text = d.text;
  if (first_ && r.echo) text = r.prompt_text + text;
  // Nothing to show: no chunk (the first one, which names the role, waits for the end).
  if (text.empty() && d.logprobs.empty() && d.prompt_logprobs.empty() && (!first_ || d.finished))
    return "";
  return sse(chunk(text, logprobs_of(d.prompt_logprobs, d.logprobs, false), nullptr));
}

std::string GenResponse::stream_end(const Delta& d) {
  std::string out;
  if (d.finish_reason == "error") {
    out += sse(error_body(ApiError(500, d.error, "", "internal_error", "server_error")));
  } else {
    json last = chunk("", nullptr, d.finish_reason);
    last["choices"][0]["stop_reason"] = stop_reason_json(d);
    out += sse(last);
    if (job_->request().include_usage) {
      json u = head(ep_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
      u["choices"] = json::array();
      u["usage"] = usage_json(d);
      out += sse(u);
    }
  }
  return out + "data: [DONE]\n\n";
}

void GenResponse::accumulate(const Delta& d) {
  all_.text += d.text;
  logprobs_of(d.prompt_logprobs, d.logprobs, true);
  all_.standing_from(d);
}

json GenResponse::whole(const Delta& d) {
  const GenRequest& r = job_->request();
  const bool chat = ep_ == Endpoint::kChat;
  json j = head(chat ? "chat.completion" : "text_completion");
  json choice = {
      {"index", 0}, {"finish_reason", d.finish_reason}, {"stop_reason", stop_reason_json(d)}};
  json lp = nullptr;
  if (r.logprobs >= 0)
    lp = chat ? json{{"content", chat_lp_}, {"refusal", nullptr}} : lp_.to_json();
  choice["logprobs"] = lp;
  if (chat)
    choice["message"] = {{"role", "assistant"}, {"content", d.text}, {"refusal", nullptr}};
  else
    choice["text"] = r.echo ? r.prompt_text + d.text : d.text;
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(d);
  return j;
}

}  // namespace smolrt::server
