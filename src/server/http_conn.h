// The server's HTTP/1.1 connections on Boost.Beast + Asio (header-only, epoll): no thread per
// connection. A Lane is one I/O thread with its io_context; each connection lives on one lane and
// all its handlers run there, so a connection needs no locks. Route handlers (JSON parsing,
// tokenization, submitting to the scheduler) run on a small worker pool, never on a lane.
//
// A connection reads one request at a time (pipelined requests wait in its buffer and are
// answered in order), always reading a request's whole body before answering it, so a rejected
// request's body is never parsed as the next request; a request whose framing is wrong (bad or
// conflicting Content-Length, a Transfer-Encoding other than a lone "chunked", a body over the
// limit, a deadline passed) is answered and the connection closed. Deadlines: the idle wait for
// the next request, the whole header from its first byte, the whole body, and a response's
// progress (a client that acknowledges none of the bytes waiting for it for that long is cut off
// and its Job cancelled: server/tcp_progress.h). They are checked by a 250 ms tick per lane, so no
// timer is armed per read or write.
//
// A generation response is fed by its Job's news callback: the scheduler's notifier thread
// queues the connection on its lane (one post per lane per burst, however many jobs had news) and
// the lane takes everything pending at once, so tokens that arrive while a write is in flight
// go out together in the next one (at most one write in flight per connection: a slow reader
// makes coalesced events, never an unbounded buffer). While generating, the socket is read too:
// a client that closes or resets is noticed at once and its Job cancelled, streaming or not.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "server/gen_response.h"

namespace smolrt::server {

class Metrics;

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

struct HttpLimits {
  size_t max_body_bytes = 8u << 20;     // any content type
  size_t max_header_bytes = 32u << 10;  // request line and fields
  double idle_timeout_s = 30;           // keep-alive: waiting for the next request's first byte
  double header_timeout_s = 10;         // the whole header, from its first byte
  double body_timeout_s = 30;           // the whole body, from the end of the header
  double write_timeout_s = 30;          // a response's client taking none of its bytes
};

// A request as a route handler gets it.
struct HttpRequest {
  http::request<http::string_body> msg;
  std::string path;               // the target without its query
  std::string remote;             // "address:port"
  std::function<void()> on_news;  // for a Job this request starts (Scheduler::submit)
};

// A route handler's answer: a whole response, or (gen set) a generation to stream from its Job.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // Retry-After, Allow, CORS, ...
  std::unique_ptr<GenResponse> gen;
  std::string note;  // appended to the request's log line
};

struct LogEntry {
  const std::string& remote;
  const std::string& method;
  const std::string& path;
  int status;
  double ms;
  const std::string& note;
};

// What the connections of one server share.
struct HttpShared {
  HttpLimits limits;
  std::function<Reply(HttpRequest&)> handle;  // on a worker thread; ApiError-free (answers them)
  std::function<void(const LogEntry&)> log;   // one finished request (a lane thread)
  net::thread_pool* workers = nullptr;
  Metrics* metrics = nullptr;
  std::atomic<int> open{0};       // connections being served (not counting refused ones)
  std::atomic<int> refusing{0};   // connections being answered 503 past the limit
  std::atomic<int> in_flight{0};  // generation responses not yet fully written
};

class Connection;

// Connections with news from their Jobs, handed from any thread to one lane.
class NewsQueue : public std::enable_shared_from_this<NewsQueue> {
 public:
  explicit NewsQueue(net::io_context& ioc) : ioc_(&ioc) {}
  void push(const std::weak_ptr<Connection>& c);  // any thread
  void detach();                                  // no more posts (the lane is going away)

 private:
  void drain();
  std::mutex mu_;
  net::io_context* ioc_;
  std::vector<std::weak_ptr<Connection>> ready_;
  bool posted_ = false;
};

// One I/O thread's io_context, its connections and their deadline tick.
class Lane {
 public:
  Lane();
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  net::io_context& ioc() { return ioc_; }
  void run();                                      // the lane's thread: until ioc().stop()
  void add(const std::shared_ptr<Connection>& c);  // lane thread
  std::function<void()> news_callback(std::weak_ptr<Connection> c);

 private:
  void tick();
  net::io_context ioc_{1};
  net::steady_timer timer_;
  std::vector<std::weak_ptr<Connection>> conns_;  // lane thread only
  std::shared_ptr<NewsQueue> news_;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // refused: a connection past the limit (counted in shared.refusing, answered 503).
  Connection(tcp::socket socket, Lane& lane, HttpShared& shared, bool refused);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Lane thread only, from here on.
  void start();                      // serve requests
  void refuse(std::string body);     // answer 503 with this JSON body, then close
  void tick(Clock::time_point now);  // deadlines
  void on_news();                    // the Job has news
  void close();                      // at once, no answer

 private:
  enum class Phase { kIdle, kHeader, kBody, kBusy, kLinger, kClosed };
  enum class Next { kNone, kRead, kLinger };

  void read_next();
  void read_header();
  void on_header(boost::system::error_code ec);
  void read_body();
  void on_body(boost::system::error_code ec);
  void dispatch();
  void on_reply(Reply r);
  void send(Reply r);
  void after_response(bool keep);
  void fail(int status, const std::string& message, const std::string& code);
  void fail_read(boost::system::error_code ec);
  void linger();
  void linger_read();
  void watch();
  void on_watch(boost::system::error_code ec, size_t n);
  void pump();
  void write_stream(std::string bytes, bool done);
  std::string stream_header();
  void end_generation();  // the generation's response is over (written, or abandoned)
  void client_gone();
  void log(int status, const std::string& note);

  tcp::socket socket_;
  Lane& lane_;
  HttpShared& shared_;
  const bool refused_;
  std::string remote_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kIdle;
  Clock::time_point deadline_ = Clock::time_point::max();  // of the read phase
  // The response being written: when the client last took bytes (or had none waiting), and the
  // bytes it had acknowledged then.
  Clock::time_point progress_at_{};
  uint64_t last_acked_ = 0;
  bool writing_ = false;
  bool watching_ = false;
  bool timed_out_ = false;
  Next after_watch_ = Next::kNone;
  std::unique_ptr<char[]> scratch_;  // lingering: discarded input
  size_t linger_bytes_ = 0;

  // The request being answered.
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_ = false;
  std::string method_ = "-", path_ = "-";
  Clock::time_point started_{};

  // The response being written.
  std::optional<http::response<http::string_body>> res_;
  std::optional<http::response_serializer<http::string_body>> sr_;
  std::string out_;

  // A generation being answered.
  std::unique_ptr<GenResponse> gen_;
  std::vector<std::pair<std::string, std::string>> gen_headers_;
  bool gen_done_ = false;  // its last bytes are written or being written
  bool stream_started_ = false;
};

}  // namespace smolrt::server
