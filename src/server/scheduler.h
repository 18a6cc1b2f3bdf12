// Continuous batching over one BatchBackend. One thread owns the backend; each step:
//   1. every running sequence that is decoding contributes its one pending token;
//   2. prompt chunks of newly admitted requests (oldest first) fill the rest of the step's token
//      budget (BatchBackend::max_step_tokens), so running streams keep advancing while long
//      prompts arrive;
//   3. the results are turned into text (StreamDecoder + StopMatcher per request) and logprobs,
//      and handed to each request's Job. Waking the readers (a futex syscall per blocked reader,
//      or the HTTP layer's news callback) is the scheduler thread's largest cost per token
//      (bench/bench_scheduler.cpp), so a notifier thread does it while the next step runs on
//      the GPU.
// Admission: the oldest waiting request gets a sequence when a slot is free and the KV pool has
// pages for its tokens plus `headroom_tokens` beyond what admitted prompts still need. When a
// decoding sequence cannot grow (pool full), the youngest running request is preempted: its
// sequence is freed and it goes back to the front of the queue to be recomputed (prompt plus
// what it generated; its sampler state carries on, so the output is the same). The waiting queue
// is bounded: submit() refuses when it is full (HTTP 503). A cancelled Job (client gone) frees
// its sequence at the next step; it ends with finish_reason "stop" and a stop_reason saying why.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/batch.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace smolrt::server {

class Metrics;

struct TopLogprob {
  int token = -1;
  float logprob = 0.0f;
};
struct TokenLogprob {
  int token = -1;
  bool has_logprob = true;  // false: the first prompt token (nothing predicts it)
  float logprob = 0.0f;
  std::vector<TopLogprob> top;  // the top-N, most likely first
};

// log_softmax(row)[token] and the top_n most likely tokens (ties -> lower id).
TokenLogprob token_logprob(std::span<const float> row, int token, int top_n);

// What a Job's reader gets: everything new since its last take().
struct Delta {
  std::string text;
  std::vector<TokenLogprob> logprobs;         // one per generated token, when asked
  std::vector<TokenLogprob> prompt_logprobs;  // echo + logprobs: one per prompt token, once
  bool finished = false;
  std::string finish_reason;  // "stop" | "length" | "error"
  // Why a "stop" came early: "" (end of generation or a stop string), "cancelled" (Job::cancel:
  // the client left) or "shutdown" (Scheduler::abort_all or destruction).
  std::string stop_reason;
  std::string error;  // when finish_reason == "error"
  // A request's own error (a 400 with this param and code), not the server's: a non-empty code.
  std::string error_param, error_code;
  int n_prompt = 0, n_generated = 0;
  // Prompt tokens whose K/V came from the prefix cache (usage.prompt_tokens_details.cached_tokens;
  // at the request's first admission).
  int n_cached = 0;

  // Takes d's standing (finished, the reasons, error, counts): everything but text and logprobs.
  void standing_from(const Delta& d) {
    finished = d.finished;
    finish_reason = d.finish_reason;
    stop_reason = d.stop_reason;
    error = d.error;
    error_param = d.error_param;
    error_code = d.error_code;
    n_prompt = d.n_prompt;
    n_generated = d.n_generated;
    n_cached = d.n_cached;
  }
};

enum class CancelReason { kNone, kClient, kShutdown };

// One request as its HTTP handler sees it: a channel from the scheduler thread. The reader either
// blocks in take() or, without blocking, takes what `on_news` announced.
class Job {
 public:
  // on_news: called (on the scheduler's notifier thread, or in submit() for a request with
  // nothing to compute) after news was published; it must not block. May be empty.
  explicit Job(GenRequest r, std::function<void()> on_news = {})
      : req_(std::move(r)), on_news_(std::move(on_news)) {}
  const GenRequest& request() const { return req_; }
  std::chrono::steady_clock::time_point arrived() const { return arrived_; }

  // Waits up to `timeout` (0: not at all) for news; moves it into `out` (appending). False when
  // nothing came.
  bool take(Delta& out, std::chrono::milliseconds timeout);
  // The client went away (or the server gives up on it): the scheduler frees its sequence. The
  // first reason given is the one reported.
  void cancel(CancelReason why = CancelReason::kClient);
  bool cancelled() const { return cancel_reason_.load() != CancelReason::kNone; }

 private:
  friend class Scheduler;
  // Applies f to the pending delta. Wakes the reader unless `wake` is false; then returns whether
  // the caller must call wake() later (false when the job had already finished).
  bool publish(const std::function<void(Delta&)>& f, bool wake = true);
  void wake();
  std::string stop_reason() const;  // of a cancelled job

  GenRequest req_;
  std::function<void()> on_news_;
  std::chrono::steady_clock::time_point arrived_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  std::condition_variable cv_;
  Delta pending_;
  bool news_ = false;
  bool done_ = false;
  std::atomic<CancelReason> cancel_reason_{CancelReason::kNone};
  std::function<void()> on_cancel_;  // wakes the scheduler
};

struct SchedulerOptions {
  int max_queue = 256;       // waiting requests at most (the HTTP layer answers 503 past it)
  int headroom_tokens = 16;  // KV room beyond its tokens a request needs to be admitted
  // Token ids that end generation besides the tokenizer's end-of-generation ids (chat: the
  // ChatML end marker), unless the request sets ignore_eos.
  std::vector<int> extra_eog;
  int step_delay_ms = 0;  // developer knob: sleep after each step (tests of queueing, cancelling)
};

class Scheduler {
 public:
  // Starts the thread that owns `be`. `metrics` may be null.
  Scheduler(BatchBackend& be, const Tokenizer& tok, Metrics* metrics, SchedulerOptions opt = {});
  ~Scheduler();  // cancels what is left and joins
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request (on_news: see Job). nullptr when the waiting queue is full or the scheduler
  // no longer accepts (draining); ApiError 400 when its prompt can never fit the KV pool. r.n must
  // be 1 (submit_n takes more).
  std::shared_ptr<Job> submit(GenRequest r, std::function<void()> on_news = {});
  // r.n choices of one prompt, one Job each (all announced through on_news): the first prefills
  // the prompt, the others fork its sequence once the prompt is in (sharing its KV pages) and
  // sample the last prompt token's successor with their own draws. Empty when the queue lacks room
  // for all of them (or the scheduler no longer accepts).
  std::vector<std::shared_ptr<Job>> submit_n(GenRequest r, std::function<void()> on_news = {});

  void stop_accepting() { accepting_ = false; }
  // Ends every request still queued or running: finish_reason "stop", stop_reason "shutdown".
  void abort_all();
  int running() const { return n_running_.load(); }
  int waiting() const { return n_waiting_.load(); }
  bool idle() const { return running() == 0 && waiting() == 0; }
  int max_queue() const { return opt_.max_queue; }
  bool accepting() const { return accepting_.load(); }

 private:
  struct Entry;
  struct Group;
  void loop();
  bool reap();  // drops cancelled entries; true when any was dropped
  void admit();
  void run_step();
  // Ends e. A non-empty stop_reason (a cancelled job's) drops the text still held back;
  // error_code (with error_param): the error is the request's own (its client gets a 400).
  void finish(Entry& e, const std::string& reason, const std::string& error = "",
              const std::string& stop_reason = "", const std::string& error_param = "",
              const std::string& error_code = "");
  void preempt(Entry& e);
  // A choice group's leader stops being the source of forks (it is done with its prompt and every
  // follower has forked, or it leaves): the followers it still holds join the queue's front.
  void release_followers(Entry& leader);
  void on_token(Entry& e, int token, const std::vector<float>* logits, int row);
  void publish_counts();
  void recover(const std::string& what);
  // publish() on the scheduler thread: the reader is woken by the notifier thread after the step.
  void post(const std::shared_ptr<Job>& job, const std::function<void(Delta&)>& f);
  void hand_wakes();  // gives the jobs posted since the last call to the notifier thread
  void notifier_loop();

  BatchBackend& be_;
  const Tokenizer& tok_;
  Metrics* metrics_;
  SchedulerOptions opt_;
  const int page_size_, pages_total_, seq_ctx_;  // the backend's geometry
  const int n_vocab_;                            // the model's logits per token

  std::mutex mu_;  // guards waiting_, stop_, abort_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Entry>> waiting_;
  bool stop_ = false;
  bool abort_ = false;
  std::atomic<bool> accepting_{true};
  std::atomic<int> n_running_{0}, n_waiting_{0};
  int64_t steps_ahead_ = 0;         // the backend's steps_ahead() at the last step (metrics)
  int64_t graph_captures_ = 0;      // the backend's graph_captures() at the last step (metrics)
  int64_t shared_prefix_rows_ = 0;  // and its shared_prefix_rows()

  std::vector<std::unique_ptr<Entry>> running_;  // scheduler thread only
  uint64_t next_order_ = 0;
  std::vector<std::shared_ptr<Job>> posted_;  // scheduler thread only: jobs to wake

  std::mutex wake_mu_;  // guards to_wake_, wake_stop_
  std::condition_variable wake_cv_;
  std::vector<std::shared_ptr<Job>> to_wake_;
  bool wake_stop_ = false;
  std::thread notifier_;
  std::thread thread_;
};

}  // namespace smolrt::server
