#include "server/http_conn.h"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>

#include <pthread.h>

#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "server/metrics.h"
#include "server/tcp_progress.h"

namespace smolrt::server {

namespace beast = boost::beast;
using error_code = boost::system::error_code;

namespace {

constexpr auto kTick = std::chrono::milliseconds(250);
// After an error answer the connection reads (and drops) what the client still sends for this
// long, so closing does not reset the connection before the client has read the answer.
constexpr auto kLinger = std::chrono::seconds(2);
constexpr size_t kLingerBytes = 16u << 20;
constexpr size_t kReadChunk = 4096;
// Input buffered while a response is being produced (pipelined requests); past it the socket is
// not read until the response is done.
constexpr size_t kPipelinedMax = 64u << 10;
constexpr auto kNever = Clock::time_point::max();

Clock::time_point after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The peer left (or never finished its request): nothing to answer.
bool peer_gone(const error_code& ec) {
  return ec == http::error::end_of_stream || ec == http::error::partial_message ||
         ec == net::error::eof || ec == net::error::connection_reset ||
         ec == net::error::broken_pipe || ec == net::error::connection_aborted ||
         ec == net::error::operation_aborted;
}

}  // namespace

// --- NewsQueue -----------------------------------------------------------------------------------

void NewsQueue::push(const std::weak_ptr<Connection>& c) {
  std::lock_guard lk(mu_);
  if (!ioc_) return;
  ready_.push_back(c);
  if (posted_) return;
  posted_ = true;
  net::post(*ioc_, [self = shared_from_this()] { self->drain(); });
}

void NewsQueue::detach() {
  std::lock_guard lk(mu_);
  ioc_ = nullptr;
  ready_.clear();
}

void NewsQueue::drain() {
  std::vector<std::weak_ptr<Connection>> batch;
  {
    std::lock_guard lk(mu_);
    batch.swap(ready_);
    posted_ = false;
  }
  for (const auto& w : batch)
    if (auto c = w.lock()) c->on_news();
  batch.clear();
  std::lock_guard lk(mu_);
  if (ready_.empty()) ready_.swap(batch);  // keeps the capacity: no allocation per burst
}

// --- Lane ----------------------------------------------------------------------------------------

Lane::Lane() : timer_(ioc_), news_(std::make_shared<NewsQueue>(ioc_)) {}

Lane::~Lane() {
  news_->detach();  // Jobs outlive the lane: their callbacks must not post to a dead io_context
}

void Lane::run() {
  pthread_setname_np(pthread_self(), "smolrt-http");  // for top -H, perf, gdb
  tick();
  while (true) {
    try {
      ioc_.run();
      return;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "smolrt serve: I/O thread: %s\n", e.what());
    }
  }
}

void Lane::add(const std::shared_ptr<Connection>& c) {
  conns_.push_back(c);
}

std::function<void()> Lane::news_callback(std::weak_ptr<Connection> c) {
  return [q = news_, c = std::move(c)] { q->push(c); };
}

void Lane::tick() {
  const auto now = Clock::now();
  size_t kept = 0;
  for (size_t i = 0; i < conns_.size(); ++i) {
    auto c = conns_[i].lock();
    if (!c) continue;
    c->tick(now);
    if (kept != i) conns_[kept] = std::move(conns_[i]);
    ++kept;
  }
  conns_.resize(kept);
  timer_.expires_after(kTick);
  timer_.async_wait([this](error_code ec) {
    if (!ec) tick();
  });
}

// --- Connection: reading a request ---------------------------------------------------------------

Connection::Connection(tcp::socket socket, Lane& lane, HttpShared& shared, bool refused)
    : socket_(std::move(socket)),
      lane_(lane),
      shared_(shared),
      refused_(refused),
      buffer_(shared.limits.max_header_bytes + kPipelinedMax + 2 * kReadChunk) {}

Connection::~Connection() {
  if (refused_) {
    --shared_.refusing;
  } else {
    const int open = --shared_.open;
    if (shared_.metrics) shared_.metrics->connections(open);
  }
  if (gen_) --shared_.in_flight;  // gen_'s destructor cancels its job
}

void Connection::start() {
  error_code ec;
  const tcp::endpoint ep = socket_.remote_endpoint(ec);
  remote_ = ec ? std::string("?") : cat(ep.address().to_string(), ":", ep.port());
  read_next();
}

void Connection::read_next() {
  phase_ = Phase::kIdle;
  deadline_ = after(shared_.limits.idle_timeout_s);
  timed_out_ = false;
  head_ = false;
  version_ = 11;  // until the next request line says otherwise (a 408 before it)
  method_ = path_ = "-";
  started_ = {};
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(shared_.limits.max_header_bytes));
  parser_->body_limit(shared_.limits.max_body_bytes);
  if (buffer_.size() > 0) return read_header();  // a pipelined request is here already
  // An idle connection holds no read buffer (a read grows it to 64 KiB; thousands of kept-alive
  // connections would hold that much each).
  buffer_.shrink_to_fit();
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
    if (self->phase_ != Phase::kIdle) return;
    if (ec) return self->close();
    self->read_header();
  });
}

void Connection::read_header() {
  phase_ = Phase::kHeader;
  started_ = Clock::now();
  deadline_ = after(shared_.limits.header_timeout_s);
  http::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
}

void Connection::on_header(error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec) return fail_read(ec);
  const auto& req = parser_->get();
  method_ = std::string(req.method_string());
  const std::string_view target = req.target();
  path_ = std::string(target.substr(0, target.find('?')));
  version_ = req.version();
  keep_alive_ = req.keep_alive();
  head_ = req.method() == http::verb::head;
  if (version_ != 10 && version_ != 11) {
    version_ = 11;
    return fail(505, "only HTTP/1.0 and HTTP/1.1 are served", "http_version_not_supported");
  }
  if (req.count(http::field::transfer_encoding) > 0) {
    const std::string_view te = trim(req[http::field::transfer_encoding]);
    if (!beast::iequals(te, "chunked"))
      return fail(501, cat("Transfer-Encoding '", te, "' is not supported (only 'chunked')"),
                  "unsupported_transfer_encoding");
  }
  if (version_ == 11 && req.count(http::field::host) != 1)
    return fail(400, "an HTTP/1.1 request needs exactly one Host header", "bad_request");
  bool expect_continue = false;
  if (req.count(http::field::expect) > 0) {
    if (!beast::iequals(trim(req[http::field::expect]), "100-continue"))
      return fail(417, "only 'Expect: 100-continue' is understood", "expectation_failed");
    expect_continue = version_ == 11 && !parser_->is_done();
  }
  phase_ = Phase::kBody;
  deadline_ = after(shared_.limits.body_timeout_s);
  if (parser_->is_done()) return dispatch();
  if (!expect_continue) return read_body();
  static const std::string k100 = "HTTP/1.1 100 Continue\r\n\r\n";
  net::async_write(socket_, net::buffer(k100), [self = shared_from_this()](error_code e, size_t) {
    if (self->phase_ == Phase::kClosed) return;
    if (e) return self->fail_read(e);
    self->read_body();
  });
}

void Connection::read_body() {
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](error_code ec, size_t) { self->on_body(ec); });
}

void Connection::on_body(error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec) return fail_read(ec);
  dispatch();
}

void Connection::fail_read(error_code ec) {
  const HttpLimits& l = shared_.limits;
  if (timed_out_) {
    const bool header = phase_ == Phase::kHeader;
    return fail(408,
                cat("the request ", header ? "header" : "body", " did not arrive within ",
                    seconds_text(header ? l.header_timeout_s : l.body_timeout_s)),
                "timeout");
  }
  if (peer_gone(ec)) return close();
  if (ec == http::error::body_limit)
    return fail(413,
                cat("the request body is larger than the limit of ", l.max_body_bytes, " bytes"),
                "payload_too_large");
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow)
    return fail(
        431, cat("the request header is larger than the limit of ", l.max_header_bytes, " bytes"),
        "header_too_large");
  if (ec == http::error::bad_version)
    return fail(505, "only HTTP/1.0 and HTTP/1.1 are served", "http_version_not_supported");
  if (ec == http::error::bad_content_length)
    return fail(400,
                "bad Content-Length: it must be one non-negative decimal number, not repeated "
                "with another value and not beside Transfer-Encoding",
                "bad_content_length");
  if (ec == http::error::bad_transfer_encoding)
    return fail(400, "bad Transfer-Encoding: give one 'Transfer-Encoding: chunked' or none",
                "bad_transfer_encoding");
  fail(400, cat("malformed HTTP request: ", ec.message()), "bad_request");
}

void Connection::dispatch() {
  phase_ = Phase::kBusy;
  deadline_ = kNever;
  auto req = std::make_shared<HttpRequest>();
  req->msg = parser_->release();
  req->path = path_;
  req->remote = remote_;
  req->on_news = lane_.news_callback(weak_from_this());
  net::post(*shared_.workers, [self = shared_from_this(), req] {
    Reply r;
    try {
      r = self->shared_.handle(*req);
    } catch (const std::exception& e) {
      r.status = 500;
      r.body = error_json(ApiError(500, e.what(), "", "internal_error", "server_error"));
    }
    net::post(self->socket_.get_executor(),
              [self, r = std::move(r)]() mutable { self->on_reply(std::move(r)); });
  });
}

// --- Connection: answering -----------------------------------------------------------------------

void Connection::on_reply(Reply r) {
  if (phase_ == Phase::kClosed) return;  // r.gen's destructor cancels its job
  if (!r.gen) return send(std::move(r));
  gen_ = std::move(r.gen);
  gen_headers_ = std::move(r.headers);
  gen_done_ = false;
  stream_started_ = false;
  ++shared_.in_flight;
  progress_at_ = Clock::now();
  watch();
  if (!gen_->stream()) return pump();
  // The stream's header goes out at once, so the client knows it is queued.
  stream_started_ = true;
  write_stream(stream_header(), false);
}

void Connection::send(Reply r) {
  phase_ = Phase::kBusy;
  deadline_ = kNever;
  const bool keep = keep_alive_;
  res_.emplace(static_cast<http::status>(r.status), version_);
  if (!r.content_type.empty()) res_->set(http::field::content_type, r.content_type);
  for (const auto& [name, value] : r.headers) res_->set(name, value);
  res_->body() = std::move(r.body);
  res_->keep_alive(keep);
  res_->prepare_payload();
  if (r.status == 204) res_->erase(http::field::content_length);
  log(r.status, r.note);
  sr_.emplace(*res_);
  writing_ = true;
  progress_at_ = Clock::now();
  auto done = [self = shared_from_this(), keep](error_code ec, size_t) {
    self->writing_ = false;
    if (self->phase_ == Phase::kClosed) return;
    if (ec) return self->close();
    self->sr_.reset();
    self->res_.reset();
    self->end_generation();  // a generation answered as a whole
    self->after_response(keep);
  };
  if (head_)
    http::async_write_header(socket_, *sr_, std::move(done));
  else
    http::async_write(socket_, *sr_, std::move(done));
}

void Connection::after_response(bool keep) {
  if (watching_) {  // the generation's watch read goes first (one read at a time)
    after_watch_ = keep ? Next::kRead : Next::kLinger;
    error_code ec;
    socket_.cancel(ec);
    return;
  }
  if (keep)
    read_next();
  else
    linger();
}

void Connection::fail(int status, const std::string& message, const std::string& code) {
  keep_alive_ = false;
  Reply r;
  r.status = status;
  r.body = error_json(ApiError(status, message, "", code,
                               status >= 500 ? "server_error" : "invalid_request_error"));
  r.note = code;
  send(std::move(r));
}

void Connection::refuse(std::string body) {
  keep_alive_ = false;
  Reply r;
  r.status = 503;
  r.body = std::move(body);
  r.headers.emplace_back("Retry-After", "1");
  send(std::move(r));
}

void Connection::linger() {
  phase_ = Phase::kLinger;
  deadline_ = Clock::now() + kLinger;
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) return close();
  if (!scratch_) scratch_ = std::make_unique<char[]>(kReadChunk);
  linger_bytes_ = 0;
  linger_read();
}

void Connection::linger_read() {
  socket_.async_read_some(net::buffer(scratch_.get(), kReadChunk),
                          [self = shared_from_this()](error_code ec, size_t n) {
                            if (self->phase_ != Phase::kLinger) return;
                            self->linger_bytes_ += n;
                            if (ec || self->linger_bytes_ > kLingerBytes) return self->close();
                            self->linger_read();
                          });
}

void Connection::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  if (gen_ && !gen_done_) log(stream_started_ ? 200 : 499, "connection closed");
  end_generation();
}

void Connection::tick(Clock::time_point now) {
  if (phase_ == Phase::kClosed) return;
  if (writing_ || (gen_ && stream_started_)) {  // a response on its way
    const TcpProgress p = tcp_progress(socket_.native_handle());
    if ((!writing_ && p.queued == 0) || p.acked != last_acked_) {
      last_acked_ = p.acked;
      progress_at_ = now;
    }
  }
  if (now - progress_at_ >= std::chrono::duration<double>(shared_.limits.write_timeout_s) &&
      (writing_ || (gen_ && stream_started_))) {
    if (shared_.metrics) shared_.metrics->http_timeout("write");
    if (gen_ && !gen_done_) {
      log(stream_started_ ? 200 : 499, cat("cut off: the client took no bytes for ",
                                           seconds_text(shared_.limits.write_timeout_s)));
      gen_done_ = true;
    }
    return close();
  }
  if (now < deadline_) return;
  switch (phase_) {
    case Phase::kHeader:
    case Phase::kBody: {
      // The pending read ends with operation_aborted; its handler answers 408.
      timed_out_ = true;
      deadline_ = kNever;
      if (shared_.metrics)
        shared_.metrics->http_timeout(phase_ == Phase::kHeader ? "header" : "body");
      error_code ec;
      socket_.cancel(ec);
      return;
    }
    case Phase::kIdle:
    case Phase::kLinger:
      return close();
    case Phase::kBusy:
    case Phase::kClosed:
      return;
  }
}

void Connection::log(int status, const std::string& note) {
  if (refused_ || !shared_.log) return;
  const double ms =
      started_ == Clock::time_point{}
          ? 0.0
          : std::chrono::duration<double, std::milli>(Clock::now() - started_).count();
  shared_.log(LogEntry{remote_, method_, path_, status, ms, note});
}

// --- Connection: a generation --------------------------------------------------------------------

void Connection::watch() {
  if (watching_ || phase_ == Phase::kClosed || buffer_.size() >= kPipelinedMax) return;
  watching_ = true;
  socket_.async_read_some(
      buffer_.prepare(kReadChunk),
      [self = shared_from_this()](error_code ec, size_t n) { self->on_watch(ec, n); });
}

void Connection::on_watch(error_code ec, size_t n) {
  watching_ = false;
  if (phase_ == Phase::kClosed) return;
  if (!ec) {
    buffer_.commit(n);
  } else if (ec != net::error::operation_aborted) {  // EOF or reset: the client left
    return client_gone();
  }
  if (gen_ && !gen_done_) {
    if (!ec) watch();
    return;
  }
  const Next next = std::exchange(after_watch_, Next::kNone);
  if (next == Next::kRead) read_next();
  if (next == Next::kLinger) linger();
}

void Connection::on_news() {
  pump();
}

void Connection::pump() {
  if (!gen_ || gen_done_ || writing_ || phase_ == Phase::kClosed) return;
  GenStep s = gen_->poll(stream_started_);
  if (!s.done && s.data.empty()) return;
  if (!gen_->stream()) {
    Reply r;
    r.status = s.status;
    r.body = std::move(s.data);
    r.headers = gen_headers_;
    if (s.status == 503) r.headers.emplace_back("Retry-After", "1");
    r.note = gen_->note();
    gen_done_ = true;
    return send(std::move(r));  // its completion ends the generation
  }
  const bool chunked = version_ == 11;
  std::string bytes;
  if (!s.data.empty()) {
    if (chunked) {
      char size[20];
      std::snprintf(size, sizeof size, "%zx\r\n", s.data.size());
      bytes += size;
      bytes += s.data;
      bytes += "\r\n";
    } else {
      bytes += s.data;
    }
  }
  if (s.done) {
    if (chunked) bytes += "0\r\n\r\n";
    gen_done_ = true;
    log(200, gen_->note());
  }
  write_stream(std::move(bytes), s.done);
}

std::string Connection::stream_header() {
  http::response<http::empty_body> h{http::status::ok, version_};
  h.set(http::field::content_type, "text/event-stream");
  h.set(http::field::cache_control, "no-cache");
  h.set("X-Accel-Buffering", "no");  // proxies pass events on as they come
  for (const auto& [name, value] : gen_headers_) h.set(name, value);
  if (version_ == 11) {
    h.chunked(true);
    h.keep_alive(keep_alive_);
  } else {
    h.keep_alive(false);  // HTTP/1.0: the body ends when the connection closes
  }
  std::ostringstream os;
  os << h.base();
  return os.str();
}

void Connection::write_stream(std::string bytes, bool done) {
  out_ = std::move(bytes);
  writing_ = true;
  net::async_write(socket_, net::buffer(out_),
                   [self = shared_from_this(), done](error_code ec, size_t) {
                     self->writing_ = false;
                     if (self->phase_ == Phase::kClosed) return;
                     if (ec) return self->client_gone();
                     if (!done) return self->pump();
                     std::string().swap(self->out_);
                     self->end_generation();
                     self->after_response(self->keep_alive_ && self->version_ == 11);
                   });
}

void Connection::end_generation() {
  if (!gen_) return;
  gen_.reset();  // cancels the job: a no-op once it finished, else it frees the sequence
  gen_headers_.clear();
  --shared_.in_flight;
}

void Connection::client_gone() {
  if (gen_ && !gen_done_) {
    log(stream_started_ ? 200 : 499, "client disconnected");
    gen_done_ = true;
  }
  close();
}

}  // namespace smolrt::server
