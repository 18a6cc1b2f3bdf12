// The OpenAI-compatible HTTP layer (cpp-httplib) over a Scheduler:
//   POST /v1/completions, POST /v1/chat/completions (SSE when "stream": true),
//   GET /v1/models, GET /health, GET /metrics (Prometheus text), POST /tokenize, POST /detokenize.
// Errors are OpenAI error objects; with an API key every endpoint but /health needs
// "Authorization: Bearer KEY". One line per request goes to stderr.
//
// Responses of the generation endpoints are written as they are produced (chunked): a handler
// notices a client that went away at its next write (tokens, or a heartbeat every second: an SSE
// comment when streaming, a space before the JSON otherwise) and cancels its Job, which frees
// the sequence.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "server/request.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace smolrt::server {

class Scheduler;
class Metrics;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0 = any free port (bind() returns it)
  std::string api_key;
  size_t max_body_bytes = 8u << 20;
  int http_threads = 0;  // 0 = enough for every running and queued request plus a few
  bool log_requests = true;
};

class Server {
 public:
  // `info` goes into /health and /v1/models (backend, device, context, ...).
  Server(Scheduler& sched, Metrics& metrics, ParseContext pc, ServerOptions opt,
         nlohmann::json info);
  ~Server();

  int bind();  // binds host:port; returns the port. Throws Error when it cannot.
  void run();  // serves until stop(); returns after in-flight handlers have finished
  void stop();
  int in_flight() const { return in_flight_.load(); }  // generation responses being written

 private:
  void routes();
  void generate(const httplib::Request& req, httplib::Response& res, Endpoint ep);

  std::unique_ptr<httplib::Server> http_;
  Scheduler& sched_;
  Metrics& metrics_;
  ParseContext pc_;
  ServerOptions opt_;
  nlohmann::json info_;
  long long created_;
  std::atomic<int> in_flight_{0};
  std::atomic<unsigned long long> next_id_{1};
};

}  // namespace smolrt::server
