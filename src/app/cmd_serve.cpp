// `smolrt serve`: an OpenAI-compatible HTTP server with continuous batching (src/server/).
// Prints "listening on http://HOST:PORT" to stderr once it accepts requests (--port 0 picks a
// free port), then one line per request. SIGTERM / SIGINT: new generation requests get 503,
// running ones may finish until shortly before --grace seconds have passed, the rest are then
// cancelled (finish_reason "stop", stop_reason "shutdown"; queued ones get 503) and the process
// exits 0 within --grace seconds, whatever its clients do. A second signal cuts the wait short.
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "app/backend_flags.h"
#include "app/command.h"
#include "app/flag_checks.h"
#include "backend/batch.h"
#include "core/build_info.h"
#include "core/error.h"
#include "grammar/grammar_cache.h"
#include "model/model.h"
#include "runtime/chat_template.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace smolrt::app {

namespace {

struct ServeArgs {
  std::string model;
  std::string model_name;
  std::string chat_template = "auto";
  server::ServerOptions http;
  BatchOptions batch;
  int queue = -1;  // -1 = 4 x --parallel
  double grace_s = 10.0;
  int step_delay_ms = 0;
  bool special_in_content = true;
};

// Blocks SIGINT/SIGTERM in this thread and every thread started after it; a watcher takes them
// with sigtimedwait.
sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

bool take_signal(const sigset_t& set, int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  return sigtimedwait(&set, nullptr, &ts) > 0;
}

// Raises the open-file limit to its hard limit (a connection is a descriptor) and checks that
// --max-connections fits.
void raise_fd_limit(int max_connections) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  // Past the limit up to 64 connections are answered 503; the model, pipes and the I/O threads'
  // epoll and eventfd descriptors need some more.
  const rlim_t need = static_cast<rlim_t>(max_connections) + 64 + 64;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
    fail("--max-connections ", max_connections, " needs about ", need,
         " file descriptors but this process may open only ", rl.rlim_cur,
         "; lower --max-connections or raise the limit (ulimit -n)");
}

// "*" or an origin as browsers send it: scheme://host[:port], no path.
std::string check_origin(std::string& v) {
  const size_t sep = v.find("://");
  const bool ok = v == "*" || (sep != std::string::npos && sep > 0 && sep + 3 < v.size() &&
                               v.find_first_of("/ \t", sep + 3) == std::string::npos);
  return ok ? "" : "'" + v + "' is invalid: give '*' or scheme://host[:port] (no path)";
}

int serve_main(const ServeArgs& a) {
  const sigset_t stop_signals = block_stop_signals();
  raise_fd_limit(a.http.max_connections);

  const std::string path = resolve_model_path(a.model);
  const Model model = load_model(path);
  const Tokenizer tok(vocab_from_gguf(*model.file));
  const std::string& tmpl = tok.vocab().chat_template;

  server::ParseContext pc;
  pc.tok = &tok;
  pc.model_name = a.model_name.empty() ? std::filesystem::path(path).stem().string() : a.model_name;
  pc.special_in_content = a.special_in_content;
  pc.grammars =
      std::make_shared<grammar::GrammarCache>(std::make_shared<const grammar::TokenVocab>(tok));
  if (a.chat_template == "none") {
    pc.chat = false;
  } else {
    try {
      pc.format = resolve_chat_format(a.chat_template, tmpl);
      pc.chat = true;
      pc.default_system = template_default_system(tmpl);
    } catch (const Error&) {
      // auto on a model without a known template: /v1/chat/completions answers 400 saying so;
      // a format asked for by name is always known, so only auto lands here.
      if (a.chat_template != "auto") throw;
      pc.chat = false;
    }
  }

  std::unique_ptr<BatchBackend> be = make_batch_backend(model, a.batch);
  be->warm_up();
  pc.seq_ctx = be->seq_ctx();

  server::SchedulerOptions so;
  so.max_queue = a.queue >= 0 ? a.queue : 4 * be->max_seqs();
  so.step_delay_ms = a.step_delay_ms;
  if (pc.chat) {
    const std::vector<int> end =
        tok.encode(chat_end_marker(pc.format), /*parse_special=*/true, /*add_bos=*/0);
    if (end.size() == 1) so.extra_eog = end;
  }
  server::Metrics metrics;
  server::Scheduler sched(*be, tok, &metrics, so);

  const server::ServerOptions& ho = a.http;
  nlohmann::json info = {{"backend", be->name()},
                         {"device", be->device_name()},
                         {"model_path", path},
                         {"seq_ctx", be->seq_ctx()},
                         {"max_seqs", be->max_seqs()},
                         {"kv_tokens", be->kv_tokens()},
                         {"kv_ring_rows", be->kv_ring_rows()},
                         {"commit", build_commit()},
                         {"kv_type", be->name() == "cuda" && a.batch.kv_half ? "f16" : "f32"},
                         {"prefix_cache", be->prefix_cache()}};
  server::Server srv(sched, metrics, pc, ho, info);
  const int port = srv.bind();

  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done && !take_signal(stop_signals, 100)) {
    }
    if (done) return;
    std::fprintf(stderr, "smolrt serve: shutting down: %d request(s) in flight, grace %g s\n",
                 srv.in_flight(), a.grace_s);
    sched.stop_accepting();
    using Clock = std::chrono::steady_clock;
    const auto seconds = [](double s) {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    // The end of the grace period, less a moment (at most 0.5 s) for the cancelled requests'
    // last events to be written; then the connections are dropped whatever their clients do.
    const auto deadline = Clock::now() + seconds(a.grace_s);
    const auto abort_at = deadline - seconds(std::min(0.5, a.grace_s / 2));
    bool again = false;  // a second signal skips the grace period
    while (srv.in_flight() > 0 && Clock::now() < abort_at && !again)
      again = take_signal(stop_signals, 20);
    if (srv.in_flight() > 0) {
      std::fprintf(stderr, "smolrt serve: cancelling %d request(s)\n", srv.in_flight());
      sched.abort_all();
      const auto flush_end = again ? std::min(deadline, Clock::now() + seconds(0.2)) : deadline;
      while (srv.in_flight() > 0 && Clock::now() < flush_end)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    srv.stop();
  });

  const std::string rings = be->kv_ring_rows() > 0
                                ? " (sliding-window layers: a ring of " +
                                      std::to_string(be->kv_ring_rows()) + " rows per sequence)"
                                : "";
  const std::string dense =
      be->dense_rows() > 0 ? ", fp16 dense GEMMs from " + std::to_string(be->dense_rows()) + " rows"
                           : "";
  std::fprintf(
      stderr,
      "smolrt serve: %s as '%s' on %s (%s), %d sequences x %d tokens, KV pool %d tokens%s%s, "
      "chat %s\n",
      path.c_str(), pc.model_name.c_str(), be->name().c_str(), be->device_name().c_str(),
      be->max_seqs(), be->seq_ctx(), be->kv_tokens(), rings.c_str(), dense.c_str(),
      pc.chat ? "on" : "off");
  std::fprintf(stderr, "listening on http://%s:%d\n", ho.host.c_str(), port);
  std::fflush(stderr);
  srv.run();
  done = true;
  watcher.join();
  std::fprintf(stderr, "smolrt serve: stopped\n");
  return 0;
}

REGISTER_COMMAND(Command{
    "serve", "OpenAI-compatible HTTP server with continuous batching", 25,
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ServeArgs>();
      sub.add_option("-m,--model", a->model, "GGUF model file (default: the cached SmolLM2-135M)");
      sub.add_option("--host", a->http.host, "address to bind")->capture_default_str();
      sub.add_option("--port", a->http.port, "port; 0 = a free one (printed)")
          ->check(int_range(0, 65535, "give a port in [0, 65535] (0 = a free one)"))
          ->capture_default_str();
      sub.add_option("--parallel", a->batch.max_seqs, "sequences decoded together at most")
          ->check(int_range(1, 4096, "give a count in [1, 4096]"))
          ->capture_default_str();
      sub.add_option("--ctx", a->batch.seq_ctx,
                     "positions per sequence (0 = the model's training context)")
          ->check(int_range(0, 1 << 24, "give a context size in [0, 16777216] (0 = the model's)"))
          ->capture_default_str();
      sub.add_option("--kv-size", a->batch.kv_tokens,
                     "KV pool size in tokens, shared by all sequences (0 = ctx x parallel, capped "
                     "by memory)")
          ->check(int_range(0, INT_MAX, "give a token count >= 0 (0 = automatic)"))
          ->capture_default_str();
      add_kv_type_flag(sub, a->batch.kv_half);
      sub.add_option("--max-step-tokens", a->batch.max_step_tokens,
                     "tokens one batched step carries at most (decodes + prompt chunks); 0 = the "
                     "backend's default (CPU " +
                         std::to_string(kCpuStepTokens) + ", CUDA " +
                         std::to_string(kCudaStepTokens) + ")")
          ->check(int_range(0, 1 << 20, "give a token count >= 0 (0 = the backend's default)"))
          ->capture_default_str();
      sub.add_option("--threads", a->batch.n_threads, "CPU threads (0 = the physical cores)")
          ->check(int_range(0, 4096, "give a count in [0, 4096] (0 = the physical cores)"))
          ->capture_default_str();
      add_backend_kind_flag(sub, a->batch.kind);
      add_f16_weights_flag(sub, a->batch.f16_weights);
      sub.add_flag("!--no-prefix-cache", a->batch.prefix_cache,
                   "keep no KV pages of finished requests for later prompts that begin alike "
                   "(the prefix cache is on by default)");
      sub.add_option("--api-key", a->http.api_key,
                     "require 'Authorization: Bearer KEY' (all endpoints but /health)");
      sub.add_option("--queue", a->queue,
                     "waiting requests at most before 503 (default 4 x --parallel)")
          ->check(int_range(0, 1 << 20, "give a count in [0, 1048576]"));
      sub.add_option("--model-name", a->model_name,
                     "the name clients pass as 'model' (default: the file name without .gguf)");
      sub.add_option("--chat-template", a->chat_template,
                     "auto (the format of the model's template) | chatml | gemma | llama3 | none")
          ->check(CLI::IsMember({"auto", "chatml", "gemma", "llama3", "none"}))
          ->capture_default_str();
      sub.add_option("--grace", a->grace_s,
                     "seconds after SIGTERM/SIGINT until the process ends; in-flight requests "
                     "may finish until shortly before, then they are cancelled")
          ->check(seconds_range(0, 86400))
          ->capture_default_str();
      sub.add_option("--max-connections", a->http.max_connections,
                     "HTTP connections served at once; more get 503 and are closed")
          ->check(int_range(1, 1000000, "give a count in [1, 1000000]"))
          ->capture_default_str();
      sub.add_option("--idle-timeout", a->http.idle_timeout_s,
                     "seconds a kept-alive connection may wait for its next request")
          ->check(seconds_range(0.1, 86400))
          ->capture_default_str();
      sub.add_option("--header-timeout", a->http.header_timeout_s,
                     "seconds for a request's whole header, from its first byte (then 408)")
          ->check(seconds_range(0.1, 86400))
          ->capture_default_str();
      sub.add_option("--body-timeout", a->http.body_timeout_s,
                     "seconds for a request's whole body, after its header (then 408)")
          ->check(seconds_range(0.1, 86400))
          ->capture_default_str();
      sub.add_option("--write-timeout", a->http.write_timeout_s,
                     "seconds a client may take no response bytes before it is cut off (and its "
                     "request cancelled)")
          ->check(seconds_range(0.1, 86400))
          ->capture_default_str();
      sub.add_option("--http-threads", a->http.http_threads,
                     "I/O threads serving the connections (0 = min(4, cores / 4), at least 1)")
          ->check(int_range(0, 64, "give a count in [0, 64] (0 = automatic)"))
          ->capture_default_str();
      sub.add_option("--cors-origin", a->http.cors_origins,
                     "allow browser pages from this origin (scheme://host[:port], repeatable, or "
                     "'*' for any); default: no CORS headers")
          ->check(CLI::Validator(check_origin, "ORIGIN"))
          ->delimiter(',');
      sub.add_flag("!--no-special-in-content", a->special_in_content,
                   "tokenize chat message content as plain text: special-token text in it (such "
                   "as <|im_start|>) does not become control tokens");
      sub.add_flag("!--no-log", a->http.log_requests, "no per-request log lines");
      sub.add_option("--step-delay-ms", a->step_delay_ms,
                     "developer: sleep this long after each batched step (tests)")
          ->check(int_range(0, 60000, "give milliseconds in [0, 60000]"))
          ->group("Developer");
      return [a] { return serve_main(*a); };
    }});

}  // namespace

}  // namespace smolrt::app
