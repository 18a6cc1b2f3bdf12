#include "server/scheduler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "runtime/sampler.h"
#include "runtime/stop.h"
#include "server/metrics.h"

namespace smolrt::server {

using Clock = std::chrono::steady_clock;

namespace {
// Seconds from one time point to another (a request's parts measured on one clock add up).
double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}
double since(Clock::time_point t) {
  return seconds(t, Clock::now());
}

// The matcher's allowed-token bitset as the backends take it (SeqStep::allowed: 32-bit words,
// token t at bit t % 32 of word t / 32): the same bytes as its 64-bit words on a little-endian
// machine. A model with more rows than the tokenizer has tokens (padded embeddings) needs more
// words: a copy in buf, the extra rows never allowed. Valid until the matcher's next call.
std::span<const uint32_t> mask_words(grammar::GrammarMatcher& m, int n_vocab,
                                     std::vector<uint32_t>& buf) {
  static_assert(std::endian::native == std::endian::little, "masks are read as 32-bit words");
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(m.mask());
  const size_t have = 2 * static_cast<size_t>(m.grammar().vocab().mask_words());
  const size_t need = (static_cast<size_t>(n_vocab) + 31) / 32;
  if (have >= need) return {bits, have};
  buf.assign(need, 0);
  std::copy_n(bits, have, buf.begin());
  return buf;
}

// A request's logit_bias as a token mask over n_vocab logits: its "only" tokens (any token when
// none), less its banned ones; empty when it has neither.
std::vector<uint32_t> bias_mask(const GenRequest& r, int n_vocab) {
  if (r.banned_tokens.empty() && r.only_tokens.empty()) return {};
  const size_t words = (static_cast<size_t>(n_vocab) + 31) / 32;
  std::vector<uint32_t> m(words, r.only_tokens.empty() ? ~0u : 0u);
  if (r.only_tokens.empty() && n_vocab % 32) m.back() = (1u << (n_vocab % 32)) - 1;
  for (int t : r.only_tokens) m[t / 32] |= 1u << (t % 32);
  for (int t : r.banned_tokens) m[t / 32] &= ~(1u << (t % 32));
  return m;
}
}  // namespace

// --- logprobs ------------------------------------------------------------------------------------

TokenLogprob token_logprob(std::span<const float> row, int token, int top_n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : row)
    if (v > mx) mx = v;
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprob r;
  r.token = token;
  r.logprob = static_cast<float>(row[token] - lse);
  if (top_n > 0) {
    std::vector<int> ids(row.size());
    std::iota(ids.begin(), ids.end(), 0);
    const size_t k = std::min<size_t>(top_n, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (size_t i = 0; i < k; ++i) r.top.push_back({ids[i], static_cast<float>(row[ids[i]] - lse)});
  }
  return r;
}

// --- Job -----------------------------------------------------------------------------------------

bool Job::take(Delta& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  // No wait at all for a zero timeout (a condition variable's expired wait is still a syscall).
  if (!news_ && (timeout.count() <= 0 || !cv_.wait_for(lk, timeout, [&] { return news_; })))
    return false;
  out.text += pending_.text;
  for (std::vector<TokenLogprob> Delta::*v : {&Delta::logprobs, &Delta::prompt_logprobs}) {
    auto& src = pending_.*v;
    (out.*v).insert((out.*v).end(), std::make_move_iterator(src.begin()),
                    std::make_move_iterator(src.end()));
  }
  out.standing_from(pending_);
  pending_.text.clear();
  pending_.logprobs.clear();
  pending_.prompt_logprobs.clear();
  news_ = false;
  return true;
}

void Job::cancel(CancelReason why) {
  CancelReason none = CancelReason::kNone;
  if (cancel_reason_.compare_exchange_strong(none, why) && on_cancel_) on_cancel_();
}

std::string Job::stop_reason() const {
  switch (cancel_reason_.load()) {
    case CancelReason::kShutdown:
      return "shutdown";
    case CancelReason::kClient:
      return "cancelled";
    case CancelReason::kNone:
      break;
  }
  return "";
}

void Job::wake() {
  cv_.notify_all();
  if (on_news_) on_news_();
}

bool Job::publish(const std::function<void(Delta&)>& f, bool wake) {
  {
    std::lock_guard lk(mu_);
    if (done_) return false;
    f(pending_);
    news_ = true;
    done_ = pending_.finished;
  }
  if (wake) this->wake();
  return !wake;
}

// --- Scheduler -----------------------------------------------------------------------------------

struct Scheduler::Group {
  Scheduler::Entry* source = nullptr;  // the leader, while its prompt is in its KV pages
  std::vector<std::unique_ptr<Scheduler::Entry>> held;  // followers not queued yet
};

struct Scheduler::Entry {
  Entry(std::shared_ptr<Job> j, const Tokenizer& tok)
      : job(std::move(j)),
        ctx(job->request().prompt),
        n_prompt(static_cast<int>(ctx.size())),
        sampler(job->request().sampling),
        dec(tok),
        stop(job->request().stops) {
    sampler.accept(ctx);
    if (job->request().grammar) matcher.emplace(job->request().grammar);
  }
  std::shared_ptr<Job> job;
  std::vector<int> ctx;  // prompt + generated tokens; the last generated one is not in the KV yet
  int n_prompt;
  int n_gen = 0;
  int max_gen = 0;   // generated tokens at most
  int seq = -1;      // backend sequence while running
  int n_done = 0;    // tokens of ctx in the KV cache
  int n_cached = 0;  // prompt tokens the prefix cache gave at the first admission
  uint64_t order = 0;
  // n > 1: the choices of one prompt. The leader prefills it; the others wait in the group until
  // it has, then fork its sequence.
  std::shared_ptr<Group> group;
  bool leader = false;
  bool prompt_scored = false;  // echo logprobs published
  bool counted = false;        // prompt tokens counted in the metrics (first admission)
  std::vector<TokenLogprob> prompt_lp;
  TokenSampler sampler;
  StreamDecoder dec;
  StopMatcher stop;
  // logit_bias as a token mask (SeqStep::allowed's words): empty when the request has none.
  std::vector<uint32_t> bias_mask;
  std::optional<grammar::GrammarMatcher> matcher;  // structured output
  std::vector<uint32_t> mask_buf;
  Clock::time_point last_token;
  // When its first step started (queue time before, prefill time after, in the metrics).
  std::optional<Clock::time_point> scheduled;

  const GenRequest& req() const { return job->request(); }
  int remaining() const { return static_cast<int>(ctx.size()) - n_done; }
  bool scoring() const { return req().echo && req().logprobs >= 0 && !prompt_scored; }
};

Scheduler::Scheduler(BatchBackend& be, const Tokenizer& tok, Metrics* metrics, SchedulerOptions opt)
    : be_(be),
      tok_(tok),
      metrics_(metrics),
      opt_(std::move(opt)),
      page_size_(be.page_size()),
      pages_total_(be.kv_pages_total()),
      seq_ctx_(be.seq_ctx()),
      n_vocab_(be.config().vocab_size) {
  publish_counts();
  notifier_ = std::thread([this] { notifier_loop(); });
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  while (!running_.empty()) {
    running_.back()->job->cancel(CancelReason::kShutdown);
    finish(*running_.back(), "stop", "", running_.back()->job->stop_reason());
  }
  std::vector<std::unique_ptr<Entry>> held;  // followers of leaders that never ran
  for (auto& e : waiting_)
    if (e->leader && e->group)
      for (auto& f : e->group->held) held.push_back(std::move(f));
  for (auto& f : held) waiting_.push_back(std::move(f));
  for (auto& e : waiting_) {
    e->job->cancel(CancelReason::kShutdown);
    e->job->publish([&](Delta& d) {
      d.finished = true;
      d.finish_reason = "stop";
      d.stop_reason = e->job->stop_reason();
      d.n_prompt = e->n_prompt;
    });
  }
  hand_wakes();
  {
    std::lock_guard lk(wake_mu_);
    wake_stop_ = true;
  }
  wake_cv_.notify_all();
  notifier_.join();  // wakes what was handed before it stops
}

void Scheduler::post(const std::shared_ptr<Job>& job, const std::function<void(Delta&)>& f) {
  if (job->publish(f, false)) posted_.push_back(job);
}

void Scheduler::hand_wakes() {
  if (posted_.empty()) return;
  {
    std::lock_guard lk(wake_mu_);
    if (to_wake_.empty()) {
      to_wake_.swap(posted_);
    } else {
      to_wake_.insert(to_wake_.end(), posted_.begin(), posted_.end());
      posted_.clear();
    }
  }
  wake_cv_.notify_one();
}

void Scheduler::notifier_loop() {
  std::vector<std::shared_ptr<Job>> batch;
  while (true) {
    {
      std::unique_lock lk(wake_mu_);
      wake_cv_.wait(lk, [&] { return wake_stop_ || !to_wake_.empty(); });
      if (to_wake_.empty()) return;  // stopping, nothing left
      batch.swap(to_wake_);
    }
    for (const auto& job : batch) job->wake();
    batch.clear();  // drops the references outside the lock
  }
}

std::shared_ptr<Job> Scheduler::submit(GenRequest r, std::function<void()> on_news) {
  if (r.n != 1) fail("Scheduler::submit takes one choice; use submit_n");
  std::vector<std::shared_ptr<Job>> jobs = submit_n(std::move(r), std::move(on_news));
  return jobs.empty() ? nullptr : jobs[0];
}

std::vector<std::shared_ptr<Job>> Scheduler::submit_n(GenRequest r, std::function<void()> on_news) {
  const int n = r.n;
  if (n < 1) throw ApiError(400, cat("n = ", n, " is invalid: ask for at least one choice"), "n");
  // The backend's geometry was read at construction: HTTP threads never call into the backend.
  const long long len = static_cast<long long>(r.prompt.size());
  if ((len + page_size_) / page_size_ > pages_total_) {
    throw ApiError(400,
                   cat("the prompt has ", len, " tokens; the KV pool holds ",
                       static_cast<long long>(pages_total_) * page_size_,
                       " (start the server with a larger --kv-size)"),
                   r.endpoint == Endpoint::kChat ? "messages" : "prompt",
                   "context_length_exceeded");
  }
  r.n = 1;
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<std::unique_ptr<Entry>> es;
  auto group = n > 1 ? std::make_shared<Group>() : nullptr;
  const std::vector<uint32_t> bias = bias_mask(r, n_vocab_);
  for (int i = 0; i < n; ++i) {
    GenRequest c = r;
    if (i > 0 && c.sampling.seed >= 0) c.sampling.seed += i;  // else each its own random seed
    auto job = std::make_shared<Job>(std::move(c), on_news);
    auto e = std::make_unique<Entry>(job, tok_);  // validates the sampling parameters
    e->max_gen = seq_ctx_ - e->n_prompt + 1;
    if (job->request().max_tokens >= 0)
      e->max_gen = std::min(e->max_gen, job->request().max_tokens);
    e->bias_mask = bias;
    e->group = group;
    e->leader = i == 0;
    e->counted = i > 0;        // the prompt counts once, with the leader's admission
    e->prompt_scored = i > 0;  // echo + logprobs: the leader scores the prompt for all
    jobs.push_back(job);
    es.push_back(std::move(e));
  }
  if (es[0]->max_gen == 0 && !es[0]->scoring()) {  // nothing to compute
    for (auto& e : es) {
      e->job->publish([&](Delta& d) {
        d.finished = true;
        d.finish_reason = "length";
        d.n_prompt = e->n_prompt;
      });
    }
    return jobs;
  }
  {
    std::lock_guard lk(mu_);
    if (!accepting_ || stop_ || static_cast<int>(waiting_.size()) >= opt_.max_queue) return {};
    for (auto& e : es) e->job->on_cancel_ = [this] { cv_.notify_all(); };
    waiting_.push_back(std::move(es[0]));
    for (size_t i = 1; i < es.size(); ++i) group->held.push_back(std::move(es[i]));
    n_waiting_ = static_cast<int>(waiting_.size());
  }
  if (metrics_) metrics_->queue(running(), waiting());
  cv_.notify_all();
  return jobs;
}

void Scheduler::release_followers(Entry& leader) {
  if (!leader.group || !leader.leader) return;
  Group& g = *leader.group;
  if (leader.seq < 0) g.source = nullptr;  // leaving: nothing to fork from any more
  if (g.held.empty()) return;
  std::lock_guard lk(mu_);
  for (auto it = g.held.rbegin(); it != g.held.rend(); ++it) waiting_.push_front(std::move(*it));
  g.held.clear();
  n_waiting_ = static_cast<int>(waiting_.size());
}

void Scheduler::abort_all() {
  {
    std::lock_guard lk(mu_);
    abort_ = true;
  }
  cv_.notify_all();
}

void Scheduler::publish_counts() {
  n_running_ = static_cast<int>(running_.size());
  if (metrics_) {
    metrics_->queue(running(), waiting());
    metrics_->kv_pages(be_.kv_pages_total() - be_.kv_pages_free(), be_.kv_pages_total());
  }
}

void Scheduler::loop() {
  while (true) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || abort_ || !waiting_.empty() || !running_.empty(); });
      if (stop_) return;
      if (abort_) {
        abort_ = false;
        for (auto& e : waiting_) e->job->cancel(CancelReason::kShutdown);
        for (auto& e : running_) e->job->cancel(CancelReason::kShutdown);
      }
    }
    try {
      reap();
      admit();
      if (!running_.empty()) run_step();
    } catch (const std::exception& ex) {
      recover(ex.what());
    }
    hand_wakes();
    publish_counts();
  }
}

void Scheduler::recover(const std::string& what) {
  // The backend refused something it should not have: end what is running (and the request
  // that was being admitted) with an error instead of taking the server down.
  std::fprintf(stderr, "smolrt serve: scheduler error: %s\n", what.c_str());
  const std::string msg = cat("the server's scheduler failed: ", what);
  while (!running_.empty()) {
    Entry& e = *running_.back();
    try {
      if (e.seq >= 0) be_.free_sequence(e.seq);
    } catch (const std::exception&) {
    }
    e.seq = -1;
    finish(e, "error", msg);
  }
  std::unique_ptr<Entry> front;
  {
    std::lock_guard lk(mu_);
    if (!waiting_.empty()) {
      front = std::move(waiting_.front());
      waiting_.pop_front();
      n_waiting_ = static_cast<int>(waiting_.size());
    }
  }
  if (front) finish(*front, "error", msg);
}

bool Scheduler::reap() {
  bool any = false;
  {
    std::lock_guard lk(mu_);
    std::vector<std::unique_ptr<Entry>> released;  // followers of cancelled leaders
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if ((*it)->job->cancelled()) {
        if ((*it)->leader && (*it)->group) {
          for (auto& f : (*it)->group->held) released.push_back(std::move(f));
          (*it)->group->held.clear();
        }
        post((*it)->job, [&](Delta& d) {
          d.finished = true;
          d.finish_reason = "stop";
          d.stop_reason = (*it)->job->stop_reason();
          d.n_prompt = (*it)->n_prompt;
        });
        it = waiting_.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    for (auto& f : released) waiting_.push_front(std::move(f));  // reaped next time if cancelled
    n_waiting_ = static_cast<int>(waiting_.size());
  }
  for (size_t i = 0; i < running_.size();) {
    if (running_[i]->job->cancelled()) {
      finish(*running_[i], "stop", "", running_[i]->job->stop_reason());  // erases running_[i]
      any = true;
    } else {
      ++i;
    }
  }
  return any;
}

void Scheduler::admit() {
  const int page = be_.page_size();
  std::lock_guard lk(mu_);
  while (!waiting_.empty() && static_cast<int>(running_.size()) < be_.max_seqs()) {
    // Pages that admitted prompts will still take.
    int reserved = 0;
    for (const auto& r : running_)
      if (r->remaining() > 1) reserved += be_.pages_needed(r->seq, r->remaining());
    Entry& e = *waiting_.front();
    // A follower of a choice group whose leader holds the prompt forks it: it takes the page it
    // writes first (a copy of the shared last one) and its headroom.
    Entry* src = e.group && !e.leader && e.n_gen == 0 ? e.group->source : nullptr;
    if (src && src->seq < 0) src = nullptr;
    const int own = src ? 1 : static_cast<int>(e.ctx.size());
    const int want = (own + opt_.headroom_tokens + page - 1) / page + (src ? 1 : 0);
    const int avail = be_.kv_pages_free() - reserved;
    // A lone request only needs its own tokens (the headroom may exceed a small pool).
    const int need = running_.empty() ? (static_cast<int>(e.ctx.size()) + page - 1) / page : want;
    if (running_.empty() && need > be_.kv_pages_total()) {
      // A preempted request that grew past the whole pool: it ends where it is.
      std::unique_ptr<Entry> gone = std::move(waiting_.front());
      waiting_.pop_front();
      if (gone->leader && gone->group) {  // its followers queue on (the lock is held here)
        for (auto& f : gone->group->held) waiting_.push_front(std::move(f));
        gone->group->held.clear();
      }
      finish(*gone, "length");
      continue;
    }
    if (avail < need) break;
    e.order = next_order_++;
    if (src) {
      // The prompt's K/V are the leader's: all but the last token, which the follower feeds and
      // samples from with its own draw.
      e.seq = be_.fork_sequence(src->seq);
      be_.rollback(e.seq, e.n_prompt - 1);
      e.n_done = e.n_prompt - 1;
    } else {
      e.seq = be_.add_sequence();
      // The prefix cache: pages other requests computed for the same leading tokens (not when the
      // prompt's own logits are wanted: echo with logprobs scores every prompt token).
      e.n_done = e.scoring() ? 0 : be_.match_prefix(e.seq, e.ctx);
      if (!e.counted) {
        e.n_cached = std::min(e.n_done, e.n_prompt);
        if (metrics_) metrics_->cached_tokens(e.n_cached);
      }
    }
    if (metrics_) {
      const PrefixStats ps = be_.prefix_stats();
      if (ps.queried_tokens > 0)
        metrics_->prefix_hit_ratio(static_cast<double>(ps.cached_tokens) / ps.queried_tokens);
    }
    if (!e.counted && metrics_) metrics_->prompt_tokens(e.n_prompt);
    e.counted = true;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  n_waiting_ = static_cast<int>(waiting_.size());
  n_running_ = static_cast<int>(running_.size());
}

void Scheduler::preempt(Entry& e) {
  be_.free_sequence(e.seq);
  e.seq = -1;
  e.n_done = 0;
  release_followers(e);
  if (metrics_) metrics_->preemption();
  auto it = std::find_if(running_.begin(), running_.end(), [&](auto& p) { return p.get() == &e; });
  std::unique_ptr<Entry> owned = std::move(*it);
  running_.erase(it);
  std::lock_guard lk(mu_);
  waiting_.push_front(std::move(owned));
  n_waiting_ = static_cast<int>(waiting_.size());
}

void Scheduler::finish(Entry& e, const std::string& reason, const std::string& error,
                       const std::string& stop_reason, const std::string& error_param,
                       const std::string& error_code) {
  if (e.seq >= 0) be_.free_sequence(e.seq);
  e.seq = -1;
  release_followers(e);  // they compute the prompt themselves now (the prefix cache may help)
  const bool complete = reason != "error" && stop_reason.empty();
  std::string tail;
  if (complete) {
    tail = e.stop.push(e.dec.flush());
    tail += e.stop.flush();
  }
  const int n_gen = e.n_gen;
  post(e.job, [&](Delta& d) {
    d.text += tail;
    d.finished = true;
    d.finish_reason = reason;
    d.stop_reason = stop_reason;
    d.error = error;
    d.error_param = error_param;
    d.error_code = error_code;
    d.n_prompt = e.n_prompt;
    d.n_generated = n_gen;
    d.n_cached = e.n_cached;
  });
  if (metrics_ && complete) metrics_->request_duration(since(e.job->arrived()));
  auto it = std::find_if(running_.begin(), running_.end(), [&](auto& p) { return p.get() == &e; });
  if (it != running_.end()) running_.erase(it);  // destroys e
}

void Scheduler::on_token(Entry& e, int token, const std::vector<float>* logits, int row) {
  const int n_vocab = n_vocab_;
  std::optional<TokenLogprob> lp;
  if (e.req().logprobs >= 0 && logits && !logits->empty()) {
    lp = token_logprob(std::span<const float>(*logits).subspan(size_t(row) * n_vocab, n_vocab),
                       token, e.req().logprobs);
  }
  const auto now = Clock::now();
  if (metrics_) {
    metrics_->generated_tokens(1);
    if (e.n_gen == 0) {
      metrics_->time_to_first_token(seconds(e.job->arrived(), now));
      if (e.scheduled) metrics_->prefill_time(seconds(*e.scheduled, now));
    } else {
      metrics_->inter_token_latency(seconds(e.last_token, now));
    }
  }
  e.last_token = now;
  ++e.n_gen;
  e.sampler.accept(token);
  e.ctx.push_back(token);
  // Structured output: the token was sampled under the grammar's mask, so it is accepted; the
  // request is complete when nothing but the end may follow.
  bool grammar_done = false;
  std::string grammar_error;
  if (e.matcher) {
    try {
      grammar_done = !e.matcher->accept_token(token) || e.matcher->is_done();
    } catch (const grammar::GrammarError& ex) {  // past the matcher's work limit
      grammar_done = true;
      grammar_error = ex.what();
    }
  }
  const bool eog = !e.req().ignore_eos &&
                   (tok_.is_eog(token) || std::find(opt_.extra_eog.begin(), opt_.extra_eog.end(),
                                                    token) != opt_.extra_eog.end());
  std::string text;
  if (!eog) text = e.stop.push(e.dec.push(token));
  if (!text.empty() || lp) {
    post(e.job, [&](Delta& d) {
      d.text += text;
      if (lp) d.logprobs.push_back(std::move(*lp));
      d.n_prompt = e.n_prompt;
      d.n_generated = e.n_gen;
    });
  }
  if (!grammar_error.empty())
    finish(e, "error", grammar_error, "", "", "grammar_too_ambiguous");
  else if (eog || e.stop.stopped() || grammar_done)
    finish(e, "stop");
  else if (e.n_gen >= e.max_gen)
    finish(e, "length");
}

void Scheduler::run_step() {
  const int page = be_.page_size();
  const int n_vocab = n_vocab_;
  std::vector<Entry*> order;
  std::vector<std::pair<Entry*, int>> chunks;  // entry, tokens this step
  while (true) {
    order.clear();
    for (auto& e : running_) order.push_back(e.get());
    std::sort(order.begin(), order.end(), [](Entry* a, Entry* b) { return a->order < b->order; });
    // Decodes first: each needs one token's room.
    int need = 0;
    for (Entry* e : order)
      if (e->remaining() == 1) need += be_.pages_needed(e->seq, 1);
    int free = be_.kv_pages_free();
    if (need > free) {
      if (order.size() > 1) {
        preempt(*order.back());  // the youngest goes back to the queue
      } else {
        finish(*order.back(), "length");  // alone and the pool cannot hold more
      }
      if (running_.empty()) return;
      continue;
    }
    chunks.clear();
    int budget = be_.max_step_tokens();
    for (Entry* e : order) {
      if (e->remaining() == 1 && budget > 0) {
        chunks.emplace_back(e, 1);
        --budget;
      }
    }
    free -= need;
    for (Entry* e : order) {
      if (e->remaining() <= 1 || budget <= 0) continue;
      const int pos = be_.position(e->seq);
      const int room = (page - pos % page) % page + free * page;
      const int n = std::min({e->remaining(), budget, room});
      if (n <= 0) continue;
      chunks.emplace_back(e, n);
      budget -= n;
      free -= be_.pages_needed(e->seq, n);
    }
    if (!chunks.empty()) break;
    // Nothing fits: make room by preempting the youngest (or give up on a lone request).
    if (order.size() > 1)
      preempt(*order.back());
    else
      finish(*order.back(), "length");
    if (running_.empty()) return;
  }

  // Whether e's chunk of n tokens ends its context and so samples its next token.
  auto samples = [](const Entry& e, int n) {
    return e.n_done + n == static_cast<int>(e.ctx.size()) && e.n_gen < e.max_gen;
  };
  // The tokens e may sample (SeqStep::allowed): its grammar's mask, its logit_bias mask, or both
  // (their intersection, in e.mask_buf); empty: any. Valid until the matcher's next call.
  auto allowed = [&](Entry& e) -> std::span<const uint32_t> {
    if (!e.matcher) return e.bias_mask;
    const std::span<const uint32_t> g = mask_words(*e.matcher, n_vocab, e.mask_buf);
    if (e.bias_mask.empty()) return g;
    if (g.data() != e.mask_buf.data()) e.mask_buf.assign(g.begin(), g.end());
    for (size_t i = 0; i < e.mask_buf.size(); ++i)
      e.mask_buf[i] &= i < e.bias_mask.size() ? e.bias_mask[i] : 0u;
    return e.mask_buf;
  };
  // The masks first: a grammar past the matcher's work limit (one so ambiguous that a mask would
  // stall every request for seconds), or a logit_bias that leaves none of the tokens the grammar
  // allows next, ends its own request with the error.
  struct Refused {
    Entry* e;
    std::string what, param, code;
  };
  std::vector<Refused> refused;
  std::erase_if(chunks, [&](const std::pair<Entry*, int>& c) {
    Entry* e = c.first;
    if (!e->matcher || !samples(*e, c.second)) return false;
    try {
      const std::span<const uint32_t> m = allowed(*e);
      if (!e->bias_mask.empty() &&
          std::all_of(m.begin(), m.end(), [](uint32_t w) { return w == 0; })) {
        refused.push_back({e, "logit_bias bans every token the response format allows next",
                           "logit_bias", "logit_bias_excludes_format"});
        return true;
      }
      return false;
    } catch (const grammar::GrammarError& ex) {
      refused.push_back({e, ex.what(), "", "grammar_too_ambiguous"});
      return true;
    }
  });
  for (const Refused& r : refused) finish(*r.e, "error", r.what, "", r.param, r.code);
  if (chunks.empty()) return;

  std::vector<SeqStep> steps;
  steps.reserve(chunks.size());
  int n_tokens = 0;
  for (auto& [e, n] : chunks) {
    SeqStep s;
    s.seq = e->seq;
    s.tokens = std::span<const int>(e->ctx).subspan(e->n_done, n);
    s.sample = samples(*e, n);
    s.last = s.sample && e->n_gen + 1 == e->max_gen;
    s.params = e->sampler.params();
    s.u = s.sample ? e->sampler.step_draw() : 0.0f;
    if (s.sample) s.allowed = allowed(*e);
    s.history = e->sampler.history();
    if (e->scoring() && e->n_done < e->n_prompt)
      s.logits = 2;
    else if (s.sample && e->req().logprobs >= 0)
      s.logits = 1;
    steps.push_back(s);
    n_tokens += n;
  }
  const auto t0 = Clock::now();
  for (auto& c : chunks) {
    Entry& e = *c.first;
    if (e.scheduled) continue;
    e.scheduled = t0;
    if (metrics_) metrics_->queue_time(seconds(e.job->arrived(), t0));
  }
  std::vector<SeqResult> results;
  try {
    results = be_.step(steps);
    if (results.size() != steps.size()) fail("the backend returned ", results.size(), " results");
  } catch (const std::exception& ex) {
    // The step failed as a whole: end its requests with an error, keep serving the rest.
    std::vector<Entry*> failed;
    for (auto& c : chunks) failed.push_back(c.first);
    for (Entry* e : failed) finish(*e, "error", cat("the backend step failed: ", ex.what()));
    return;
  }
  if (metrics_) {
    metrics_->step(static_cast<int>(steps.size()), n_tokens, since(t0));
    const int64_t ahead = be_.steps_ahead();
    metrics_->steps_ahead(static_cast<int>(ahead - steps_ahead_));
    steps_ahead_ = ahead;
    const int64_t captures = be_.graph_captures();
    metrics_->graph_captures(static_cast<int>(captures - graph_captures_));
    graph_captures_ = captures;
    const int64_t shared = be_.shared_prefix_rows();
    metrics_->shared_prefix_rows(static_cast<int>(shared - shared_prefix_rows_));
    shared_prefix_rows_ = shared;
  }
  if (opt_.step_delay_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(opt_.step_delay_ms));

  for (size_t i = 0; i < chunks.size(); ++i) {
    auto [e, n] = chunks[i];
    const int p0 = e->n_done;
    e->n_done += n;
    const SeqResult& r = results[i];
    if (steps[i].logits == 2 && r.logits.size() == size_t(n) * n_vocab) {
      if (e->prompt_lp.empty()) {
        e->prompt_lp.resize(e->n_prompt);
        e->prompt_lp[0].token = e->ctx[0];
        e->prompt_lp[0].has_logprob = false;
      }
      for (int j = 0; j < n && p0 + j + 1 < e->n_prompt; ++j) {
        const int t = e->ctx[p0 + j + 1];
        e->prompt_lp[p0 + j + 1] =
            token_logprob(std::span<const float>(r.logits).subspan(size_t(j) * n_vocab, n_vocab), t,
                          e->req().logprobs);
      }
      if (e->n_done >= e->n_prompt) {
        e->prompt_scored = true;
        // (Captures the member, not the structured binding e: clang before 16 refuses that.)
        post(e->job, [&lp = e->prompt_lp](Delta& d) { d.prompt_logprobs = std::move(lp); });
      }
    }
    // A choice group's leader with its whole prompt in the KV pages: the others may fork it.
    if (e->leader && e->group && e->n_done >= e->n_prompt && !e->group->held.empty()) {
      e->group->source = e;
      release_followers(*e);
    }
    if (steps[i].sample) {
      const int rows = steps[i].logits == 2 ? n : 1;
      on_token(*e, r.token, &r.logits, rows - 1);  // may finish (and destroy) e
    } else if (e->n_done == static_cast<int>(e->ctx.size())) {
      finish(*e, "length");  // max_tokens 0: the prompt alone (scoring)
    }
  }
}

}  // namespace smolrt::server
