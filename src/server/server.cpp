#include "server/server.h"

#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <thread>

#include "core/error.h"
#include "server/gen_response.h"
#include "server/http_conn.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace smolrt::server {

using json = nlohmann::json;
using error_code = boost::system::error_code;

namespace {

// Connections answered 503 past the limit at once, at most; beyond them a new connection is
// closed without an answer (each one answered holds a descriptor for up to the linger time).
constexpr int kMaxRefusing = 64;
constexpr int kSendBuffer = 64 << 10;

// The path as a metrics label: the served routes, "other" for anything else (bounded labels).
std::string endpoint_label(const std::string& path) {
  for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                        "/metrics", "/tokenize", "/detokenize"})
    if (path == p) return path;
  return "other";
}

Reply json_reply(int status, const json& j) {
  Reply r;
  r.status = status;
  r.body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

Reply error_reply(const ApiError& e) {
  Reply r;
  r.status = e.status;
  r.body = error_json(e);
  if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

// Equal, in a time that does not depend on where they differ (the API key).
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Access-Control-Request-Headers echoed back when it holds only header-name characters.
bool header_list(std::string_view s) {
  return !s.empty() && s.size() < 1024 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ',' ||
           c == ' ';
  });
}

}  // namespace

// --- the server ----------------------------------------------------------------------------------

struct Server::Impl {
  Impl(Scheduler& sched, Metrics& metrics, ParseContext pc, ServerOptions opt, json info);
  ~Impl();

  void accept();
  void on_accept(error_code ec, tcp::socket s, Lane& lane);
  void stop();

  // Routes (a worker thread).
  Reply handle(HttpRequest& req);
  Reply route(HttpRequest& req);
  Reply preflight(const HttpRequest& req);
  Reply health(bool authorized);
  Reply generate(HttpRequest& req, Endpoint ep);
  bool cors_allowed(std::string_view origin) const;
  void log(const LogEntry& e);

  Scheduler& sched;
  Metrics& metrics;
  ParseContext pc;
  ServerOptions opt;
  json info;
  long long created;
  std::atomic<unsigned long long> next_id{1};

  HttpShared shared;
  std::unique_ptr<net::thread_pool> workers;
  std::vector<std::unique_ptr<Lane>> lanes;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> accept_retry;
  size_t next_lane = 0;
  Clock::time_point last_accept_error{};
};

Server::Impl::Impl(Scheduler& s, Metrics& m, ParseContext p, ServerOptions o, json i)
    : sched(s),
      metrics(m),
      pc(std::move(p)),
      opt(std::move(o)),
      info(std::move(i)),
      created(static_cast<long long>(std::time(nullptr))) {
  std::signal(SIGPIPE, SIG_IGN);  // a write to a closed socket must fail, not kill the server
  shared.limits.max_body_bytes = opt.max_body_bytes;
  shared.limits.idle_timeout_s = opt.idle_timeout_s;
  shared.limits.header_timeout_s = opt.header_timeout_s;
  shared.limits.body_timeout_s = opt.body_timeout_s;
  shared.limits.write_timeout_s = opt.write_timeout_s;
  shared.handle = [this](HttpRequest& req) { return handle(req); };
  shared.log = [this](const LogEntry& e) { log(e); };
  shared.metrics = &metrics;
  int n = opt.http_threads;
  if (n <= 0) n = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 4);
  // The workers parse and tokenize request bodies (up to 8 MiB), off the I/O threads.
  workers = std::make_unique<net::thread_pool>(std::max(2, n));
  shared.workers = workers.get();
  for (int k = 0; k < n; ++k) lanes.push_back(std::make_unique<Lane>());
  accept_retry.emplace(lanes[0]->ioc());
  metrics.connections(0);
}

Server::Impl::~Impl() {
  stop();
  workers->join();  // no worker posts to a lane after this
  accept_retry.reset();
  acceptor.reset();
  lanes.clear();  // drops the connections (their Jobs are cancelled)
}

void Server::Impl::stop() {
  for (auto& l : lanes) l->ioc().stop();
}

void Server::Impl::accept() {
  Lane& lane = *lanes[next_lane++ % lanes.size()];
  acceptor->async_accept(lane.ioc(), [this, &lane](error_code ec, tcp::socket s) {
    on_accept(ec, std::move(s), lane);
  });
}

void Server::Impl::on_accept(error_code ec, tcp::socket s, Lane& lane) {
  if (ec == net::error::operation_aborted) return;
  if (ec) {
    // Out of descriptors (EMFILE) or memory: retry shortly instead of spinning on the error.
    const auto now = Clock::now();
    if (now - last_accept_error > std::chrono::seconds(1)) {
      std::fprintf(stderr, "smolrt serve: accept: %s (%d connections open)\n", ec.message().c_str(),
                   shared.open.load());
      last_accept_error = now;
    }
    accept_retry->expires_after(std::chrono::milliseconds(50));
    accept_retry->async_wait([this](error_code e) {
      if (!e) accept();
    });
    return;
  }
  error_code ig;
  s.set_option(tcp::no_delay(true), ig);  // events go out as written
  // A modest kernel send buffer (the kernel doubles it; autotuning would grow it to megabytes):
  // a slow reader pushes back after ~128 KiB, and its pending tokens are coalesced in its Job.
  s.set_option(net::socket_base::send_buffer_size(kSendBuffer), ig);
  const bool refused = shared.open.load() >= opt.max_connections;
  if (refused) {
    metrics.connection_rejected();
    if (shared.refusing.load() >= kMaxRefusing) {
      s.close(ig);
      return accept();
    }
    ++shared.refusing;
  } else {
    metrics.connections(++shared.open);
  }
  auto c = std::make_shared<Connection>(std::move(s), lane, shared, refused);
  net::post(lane.ioc(), [this, c, &lane, refused] {
    lane.add(c);
    if (!refused) return c->start();
    c->refuse(error_json(ApiError(503,
                                  cat("the server has ", opt.max_connections,
                                      " connections open (its --max-connections); retry later"),
                                  "", "too_many_connections", "server_error")));
  });
  accept();
}

// --- routes --------------------------------------------------------------------------------------

Reply Server::Impl::handle(HttpRequest& req) {
  Reply r;
  try {
    r = route(req);
  } catch (const ApiError& e) {
    r = error_reply(e);
  } catch (const Error& e) {
    r = error_reply(ApiError(400, e.what()));
  } catch (const std::exception& e) {
    r = error_reply(ApiError(500, e.what(), "", "internal_error", "server_error"));
  }
  const std::string_view origin = req.msg[http::field::origin];
  if (!origin.empty() && cors_allowed(origin)) {
    const bool any =
        std::find(opt.cors_origins.begin(), opt.cors_origins.end(), "*") != opt.cors_origins.end();
    r.headers.emplace_back("Access-Control-Allow-Origin", any ? "*" : std::string(origin));
    if (!any) r.headers.emplace_back("Vary", "Origin");
  }
  return r;
}

bool Server::Impl::cors_allowed(std::string_view origin) const {
  for (const std::string& o : opt.cors_origins)
    if (o == "*" || o == origin) return true;
  return false;
}

Reply Server::Impl::preflight(const HttpRequest& req) {
  Reply r;
  r.status = 204;
  r.content_type.clear();
  r.headers.emplace_back("Allow", "GET, HEAD, POST, OPTIONS");
  if (!cors_allowed(req.msg[http::field::origin])) return r;
  r.headers.emplace_back("Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
  const std::string_view asked = req.msg[http::field::access_control_request_headers];
  r.headers.emplace_back("Access-Control-Allow-Headers",
                         header_list(asked) ? std::string(asked) : "Authorization, Content-Type");
  r.headers.emplace_back("Access-Control-Max-Age", "600");
  return r;
}

Reply Server::Impl::route(HttpRequest& req) {
  const auto& m = req.msg;
  if (m.method() == http::verb::options) return preflight(req);
  struct Route {
    const char* path;
    http::verb verb;
  };
  static const Route kRoutes[] = {
      {"/v1/completions", http::verb::post}, {"/v1/chat/completions", http::verb::post},
      {"/v1/models", http::verb::get},       {"/health", http::verb::get},
      {"/metrics", http::verb::get},         {"/tokenize", http::verb::post},
      {"/detokenize", http::verb::post}};
  const Route* rt = nullptr;
  for (const Route& x : kRoutes)
    if (req.path == x.path) rt = &x;
  if (!rt)
    throw ApiError(404, cat("no route ", m.method_string(), " ", req.path), "", "not_found",
                   "not_found_error");
  const bool get = rt->verb == http::verb::get;
  if (m.method() != rt->verb && !(get && m.method() == http::verb::head)) {
    Reply r = error_reply(ApiError(405, cat(m.method_string(), " is not allowed on ", req.path), "",
                                   "method_not_allowed"));
    r.headers.emplace_back("Allow", get ? "GET, HEAD, OPTIONS" : "POST, OPTIONS");
    return r;
  }
  const bool authorized = opt.api_key.empty() || same_secret(m[http::field::authorization],
                                                             std::string("Bearer ") + opt.api_key);
  if (req.path == "/health") return health(authorized);
  if (!authorized)
    throw ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", "",
                   "invalid_api_key", "authentication_error");

  if (req.path == "/v1/completions") return generate(req, Endpoint::kCompletions);
  if (req.path == "/v1/chat/completions") return generate(req, Endpoint::kChat);
  if (req.path == "/v1/models") {
    json mj = info;
    mj["id"] = pc.model_name;
    mj["object"] = "model";
    mj["created"] = created;
    mj["owned_by"] = "smolrt";
    mj["max_model_len"] = pc.seq_ctx;
    return json_reply(200, {{"object", "list"}, {"data", json::array({mj})}});
  }
  if (req.path == "/metrics") {
    Reply r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics.serialize();
    return r;
  }
  if (req.path == "/tokenize")
    return json_reply(200, {{"tokens", parse_tokenize(parse_json_body(m.body()), pc)}});
  const std::vector<int> ids = parse_detokenize(parse_json_body(m.body()), pc);
  return json_reply(200, {{"content", pc.tok->decode(ids)}});
}

Reply Server::Impl::health(bool authorized) {
  const bool ok = sched.accepting();
  json j = authorized ? info : json::object();
  j["status"] = ok ? "ok" : "draining";
  if (authorized) {
    j["running"] = sched.running();
    j["waiting"] = sched.waiting();
    j["connections"] = shared.open.load();
  }
  return json_reply(ok ? 200 : 503, j);
}

Reply Server::Impl::generate(HttpRequest& req, Endpoint ep) {
  const Body body = parse_json_body(req.msg.body());
  GenRequest g = ep == Endpoint::kChat ? parse_chat(body, pc) : parse_completion(body, pc);
  std::vector<std::shared_ptr<Job>> jobs = sched.submit_n(std::move(g), std::move(req.on_news));
  if (jobs.empty()) {
    throw ApiError(503,
                   cat("the server is busy (", sched.running(), " running, ", sched.waiting(),
                       " waiting) or shutting down; retry later"),
                   "", "overloaded", "server_error");
  }
  Reply r;
  r.gen = std::make_unique<GenResponse>(
      std::move(jobs), ep,
      cat(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-", std::hex, created, "-", next_id++),
      static_cast<long long>(std::time(nullptr)), pc.model_name, *pc.tok);
  return r;
}

void Server::Impl::log(const LogEntry& e) {
  metrics.request(endpoint_label(e.path), e.status);
  if (!opt.log_requests) return;
  std::fprintf(stderr, "%s %s %s %d %.1f ms%s%s\n", e.remote.c_str(), e.method.c_str(),
               e.path.c_str(), e.status, e.ms, e.note.empty() ? "" : " ", e.note.c_str());
}

// --- Server --------------------------------------------------------------------------------------

Server::Server(Scheduler& sched, Metrics& metrics, ParseContext pc, ServerOptions opt, json info)
    : impl_(
          std::make_unique<Impl>(sched, metrics, std::move(pc), std::move(opt), std::move(info))) {}

Server::~Server() = default;

int Server::bind() {
  Impl& m = *impl_;
  const auto cannot = [&](const error_code& ec) {
    fail("cannot listen on ", m.opt.host, ":", m.opt.port, " (", ec.message(),
         "); pick another --port or --host");
  };
  error_code ec;
  tcp::endpoint ep;
  const net::ip::address addr = net::ip::make_address(m.opt.host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, static_cast<unsigned short>(m.opt.port));
  } else {
    tcp::resolver resolver(m.lanes[0]->ioc());
    auto found = resolver.resolve(m.opt.host, std::to_string(m.opt.port), ec);
    if (ec || found.empty()) cannot(ec);
    ep = found.begin()->endpoint();
  }
  m.acceptor.emplace(m.lanes[0]->ioc());
  m.acceptor->open(ep.protocol(), ec);
  if (!ec) m.acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) m.acceptor->bind(ep, ec);
  if (!ec) m.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) cannot(ec);
  return m.acceptor->local_endpoint().port();
}

void Server::run() {
  impl_->accept();
  std::vector<std::thread> threads;
  for (auto& l : impl_->lanes) threads.emplace_back([&l] { l->run(); });
  for (auto& t : threads) t.join();
}

void Server::stop() {
  impl_->stop();
}

int Server::in_flight() const {
  return impl_->shared.in_flight.load();
}

}  // namespace smolrt::server
