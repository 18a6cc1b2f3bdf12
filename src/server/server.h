// The OpenAI-compatible HTTP server over a Scheduler:
//   POST /v1/completions, POST /v1/chat/completions (SSE when "stream": true),
//   GET /v1/models, GET /health, GET /metrics (Prometheus text), POST /tokenize, POST /detokenize.
// Errors are OpenAI error objects; with an API key every endpoint but /health needs
// "Authorization: Bearer KEY" (/health without it says only whether the server is up). OPTIONS
// answers 204 without the key (CORS preflight); with --cors-origin, responses to an allowed
// Origin carry Access-Control-Allow-Origin. One line per request goes to stderr.
//
// The HTTP layer is Boost.Beast on Asio (server/http_conn.h): a few I/O threads serve every
// connection, with deadlines and a connection limit; past the limit a connection gets a 503 and
// is closed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/request.h"

namespace smolrt::server {

class Scheduler;
class Metrics;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0 = any free port (bind() returns it)
  std::string api_key;
  size_t max_body_bytes = 8u << 20;
  int max_connections = 4096;  // served at once; more get a 503 and are closed
  double idle_timeout_s = 30;
  double header_timeout_s = 10;
  double body_timeout_s = 30;
  double write_timeout_s = 30;
  int http_threads = 0;                   // I/O threads; 0 = min(4, max(1, cores / 4))
  std::vector<std::string> cors_origins;  // "*" or origins ("https://app.example:8443")
  bool log_requests = true;
};

class Server {
 public:
  // `info` goes into /health (with the key) and /v1/models (backend, device, context, ...).
  Server(Scheduler& sched, Metrics& metrics, ParseContext pc, ServerOptions opt,
         nlohmann::json info);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int bind();             // binds host:port; returns the port. Throws Error when it cannot.
  void run();             // serves until stop()
  void stop();            // any thread: run() returns at once; open connections are dropped
  int in_flight() const;  // generation responses not yet fully written

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace smolrt::server
