#include "server/server.h"

// Hundreds of clients connect at once (bench_serve.py at 256): httplib's backlog of 5 would
// reset some of them.
#define CPPHTTPLIB_LISTEN_BACKLOG 1024
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>

#include "core/error.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace smolrt::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// --- per-request log line (the handler and the logger run on the same worker thread) -------------

struct LogState {
  Clock::time_point start{};
  std::string note;  // "prompt=12 gen=34 finish=stop"
};
thread_local LogState t_log;

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, error_body(e));
  if (e.status == 503) res.set_header("Retry-After", "1");
}

const char* status_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 413:
      return "invalid_request_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

// The path as a metrics label: the served routes, "other" for anything else (bounded labels).
std::string endpoint_label(const std::string& path) {
  for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                        "/metrics", "/tokenize", "/detokenize"})
    if (path == p) return path;
  return "other";
}

json usage_json(const Delta& d) {
  return {{"prompt_tokens", d.n_prompt},
          {"completion_tokens", d.n_generated},
          {"total_tokens", d.n_prompt + d.n_generated}};
}

// --- logprobs in the two OpenAI shapes -----------------------------------------------------------

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

// Completions: parallel arrays; text_offset counts bytes of the response text.
struct CompletionLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  void add(const Tokenizer& tok, const TokenLogprob& lp, size_t& offset) {
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
  json to_json() const {
    return {{"tokens", tokens},
            {"token_logprobs", token_logprobs},
            {"top_logprobs", top_logprobs},
            {"text_offset", text_offset}};
  }
};

json chat_logprob(const Tokenizer& tok, const TokenLogprob& lp) {
  const std::string s = piece(tok, lp.token);
  json top = json::array();
  for (const TopLogprob& t : lp.top) {
    const std::string ts = piece(tok, t.token);
    top.push_back({{"token", ts}, {"logprob", t.logprob}, {"bytes", bytes_of(ts)}});
  }
  return {{"token", s}, {"logprob", lp.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}};
}

// --- one generation response being written ------------------------------------------------------

struct GenState {
  std::shared_ptr<Job> job;
  Endpoint ep;
  std::string id;
  long long created;
  std::string model;
  bool first = true;  // nothing written yet
  size_t offset = 0;  // completions: bytes of text so far (logprobs text_offset)
  Delta all;          // non-streaming: everything so far
  CompletionLogprobs lp;
  json chat_lp = json::array();
};

class Pump {
 public:
  Pump(GenState& st, const Tokenizer& tok) : st_(st), tok_(tok) {}

  // One call of the content provider: wait for news, write it. False: stop (client gone).
  bool operator()(httplib::DataSink& sink) {
    const GenRequest& r = st_.job->request();
    Delta d;
    if (!st_.job->take(d, std::chrono::milliseconds(1000))) {
      const std::string beat = r.stream ? ": keep-alive\n\n" : " ";
      if (!sink.write(beat.data(), beat.size())) return gone();
      return true;
    }
    std::string out = r.stream ? stream_chunks(d) : "";
    if (!r.stream) accumulate(d);
    if (d.finished) {
      out += r.stream ? stream_end(d) : dump(whole(st_.all)) + "\n";
      t_log.note = cat("prompt=", d.n_prompt, " gen=", d.n_generated, " finish=", d.finish_reason);
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) return gone();
    if (d.finished) sink.done();
    return true;
  }

 private:
  bool gone() {
    st_.job->cancel();
    t_log.note = "client disconnected";
    return false;
  }

  json head(const char* object) const {
    return {{"id", st_.id}, {"object", object}, {"created", st_.created}, {"model", st_.model}};
  }

  // The choice's logprobs for these tokens (prompt ones first), null when not asked.
  json logprobs_of(const std::vector<TokenLogprob>& prompt, const std::vector<TokenLogprob>& gen,
                   bool keep) {
    if (st_.job->request().logprobs < 0) return nullptr;
    if (st_.ep == Endpoint::kChat) {
      json content = json::array();
      for (const TokenLogprob& t : gen) content.push_back(chat_logprob(tok_, t));
      if (keep) {
        for (auto& c : content) st_.chat_lp.push_back(c);
        return nullptr;
      }
      return {{"content", content}, {"refusal", nullptr}};
    }
    CompletionLogprobs fresh;
    CompletionLogprobs& lp = keep ? st_.lp : fresh;
    for (const TokenLogprob& t : prompt) lp.add(tok_, t, st_.offset);
    for (const TokenLogprob& t : gen) lp.add(tok_, t, st_.offset);
    return keep ? json(nullptr) : lp.to_json();
  }

  std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

  json chunk(const std::string& text, json logprobs, json finish) {
    const bool chat = st_.ep == Endpoint::kChat;
    json c = head(chat ? "chat.completion.chunk" : "text_completion");
    json choice = {{"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}};
    if (chat) {
      json delta = json::object();
      if (st_.first) delta["role"] = "assistant";
      if (!text.empty() || st_.first) delta["content"] = text;
      choice["delta"] = delta;
    } else {
      choice["text"] = text;
    }
    st_.first = false;
    c["choices"] = json::array({choice});
    return c;
  }

  std::string stream_chunks(const Delta& d) {
    const GenRequest& r = st_.job->request();
    std::string text = d.text;
    if (st_.first && r.echo) text = r.prompt_text + text;
    // Nothing to show: no chunk (the first one, which names the role, waits for the end).
    if (text.empty() && d.logprobs.empty() && d.prompt_logprobs.empty() &&
        (!st_.first || d.finished))
      return "";
    return sse(chunk(text, logprobs_of(d.prompt_logprobs, d.logprobs, false), nullptr));
  }

  std::string stream_end(const Delta& d) {
    std::string out;
    if (d.finish_reason == "error") {
      out += sse(error_body(ApiError(500, d.error, "", "internal_error", "server_error")));
    } else {
      out += sse(chunk("", nullptr, d.finish_reason));
      const auto& so = st_.job->request();
      if (so.include_usage) {
        json u = head(st_.ep == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
        u["choices"] = json::array();
        u["usage"] = usage_json(d);
        out += sse(u);
      }
    }
    return out + "data: [DONE]\n\n";
  }

  void accumulate(const Delta& d) {
    st_.all.text += d.text;
    logprobs_of(d.prompt_logprobs, d.logprobs, true);
    st_.all.finished = d.finished;
    st_.all.finish_reason = d.finish_reason;
    st_.all.error = d.error;
    st_.all.n_prompt = d.n_prompt;
    st_.all.n_generated = d.n_generated;
  }

  json whole(const Delta& d) {
    if (d.finish_reason == "error")
      return error_body(ApiError(500, d.error, "", "internal_error", "server_error"));
    const GenRequest& r = st_.job->request();
    const bool chat = st_.ep == Endpoint::kChat;
    json j = head(chat ? "chat.completion" : "text_completion");
    json choice = {{"index", 0}, {"finish_reason", d.finish_reason}};
    json lp = nullptr;
    if (r.logprobs >= 0)
      lp = chat ? json{{"content", st_.chat_lp}, {"refusal", nullptr}} : st_.lp.to_json();
    choice["logprobs"] = lp;
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", d.text}, {"refusal", nullptr}};
    else
      choice["text"] = r.echo ? r.prompt_text + d.text : d.text;
    j["choices"] = json::array({choice});
    j["usage"] = usage_json(d);
    return j;
  }

  GenState& st_;
  const Tokenizer& tok_;
};

}  // namespace

Server::Server(Scheduler& sched, Metrics& metrics, ParseContext pc, ServerOptions opt, json info)
    : http_(std::make_unique<httplib::Server>()),
      sched_(sched),
      metrics_(metrics),
      pc_(std::move(pc)),
      opt_(std::move(opt)),
      info_(std::move(info)),
      created_(static_cast<long long>(std::time(nullptr))) {
  std::signal(SIGPIPE, SIG_IGN);  // a write to a closed socket must fail, not kill the server
  int threads = opt_.http_threads;
  if (threads <= 0) threads = 64;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second server bind a port in use.
  http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http_->set_payload_max_length(opt_.max_body_bytes);
  http_->set_keep_alive_timeout(1);  // idle connections do not hold up shutdown long
  http_->set_read_timeout(30);
  http_->set_write_timeout(30);
  routes();
}

Server::~Server() = default;

int Server::bind() {
  int port = opt_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(opt_.host);
  } else if (!http_->bind_to_port(opt_.host, port)) {
    port = -1;
  }
  if (port < 0)
    fail("cannot listen on ", opt_.host, ":", opt_.port,
         " (in use, or not an address of this host); pick another --port or --host");
  return port;
}

void Server::run() {
  http_->listen_after_bind();
}
void Server::stop() {
  http_->stop();
}

void Server::routes() {
  httplib::Server& s = *http_;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    t_log.start = Clock::now();
    t_log.note.clear();
    if (!opt_.api_key.empty() && req.path != "/health") {
      const std::string want = "Bearer " + opt_.api_key;
      if (req.get_header_value("Authorization") != want) {
        send_error(res, ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", "",
                                 "invalid_api_key", "authentication_error"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Statuses httplib sets itself (404 no route, 413 body too large, 400 bad HTTP) get a body.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.content_provider_)
          return httplib::Server::HandlerResponse::Unhandled;
        std::string msg = cat("HTTP ", res.status, " for ", req.method, " ", req.path);
        std::string code = "error";
        if (res.status == 404)
          msg = cat("no route ", req.method, " ", req.path), code = "not_found";
        if (res.status == 413) msg = "the request body is too large", code = "payload_too_large";
        send_error(res, ApiError(res.status, msg, "", code, status_type(res.status)));
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, ApiError(500, what, "", "internal_error", "server_error"));
      });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.request(endpoint_label(req.path), res.status);
    if (opt_.log_requests) {
      const double ms =
          t_log.start == Clock::time_point{}
              ? 0.0
              : std::chrono::duration<double, std::milli>(Clock::now() - t_log.start).count();
      std::fprintf(stderr, "%s %s %s %d %.1f ms%s%s\n", req.remote_addr.c_str(), req.method.c_str(),
                   req.path.c_str(), res.status, ms, t_log.note.empty() ? "" : " ",
                   t_log.note.c_str());
    }
    t_log = LogState{};
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    json j = info_;
    j["status"] = sched_.accepting() ? "ok" : "draining";
    j["running"] = sched_.running();
    j["waiting"] = sched_.waiting();
    send_json(res, sched_.accepting() ? 200 : 503, j);
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = info_;
    m["id"] = pc_.model_name;
    m["object"] = "model";
    m["created"] = created_;
    m["owned_by"] = "smolrt";
    m["max_model_len"] = pc_.seq_ctx;
    send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.serialize(), "text/plain; version=0.0.4");
  });
  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      send_json(res, 200, {{"tokens", parse_tokenize(parse_json_body(req.body), pc_)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      const std::vector<int> ids = parse_detokenize(parse_json_body(req.body), pc_);
      send_json(res, 200, {{"content", pc_.tok->decode(ids)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req, res, Endpoint::kCompletions);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req, res, Endpoint::kChat);
  });
}

void Server::generate(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
  std::shared_ptr<Job> job;
  try {
    const json body = parse_json_body(req.body);
    job =
        sched_.submit(ep == Endpoint::kChat ? parse_chat(body, pc_) : parse_completion(body, pc_));
  } catch (const ApiError& e) {
    send_error(res, e);
    return;
  } catch (const Error& e) {
    send_error(res, ApiError(400, e.what()));
    return;
  }
  if (!job) {
    send_error(res, ApiError(503,
                             cat("the server is busy (", sched_.running(), " running, ",
                                 sched_.waiting(), " waiting) or shutting down; retry later"),
                             "", "overloaded", "server_error"));
    return;
  }
  ++in_flight_;
  auto st = std::make_shared<GenState>();
  st->job = job;
  st->ep = ep;
  st->id = cat(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-", std::hex, created_, "-", next_id_++);
  st->created = static_cast<long long>(std::time(nullptr));
  st->model = pc_.model_name;
  const Tokenizer& tok = *pc_.tok;
  res.set_chunked_content_provider(
      job->request().stream ? "text/event-stream" : "application/json",
      [st, &tok](size_t, httplib::DataSink& sink) { return Pump(*st, tok)(sink); },
      [this, st](bool) {
        st->job->cancel();  // no-op when it finished; frees the sequence when the client left
        --in_flight_;
      });
}

}  // namespace smolrt::server
