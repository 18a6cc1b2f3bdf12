// The server's continuous-batching scheduler (server/scheduler.h) over a fake BatchBackend whose
// "model" is a deterministic function of each sequence's tokens: batching, chunked prompts,
// admission, preemption under a full KV pool, the bounded queue and cancellation are checked
// without a model or a server.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <numeric>

#include "backend/kv_pages.h"
#include "core/error.h"
#include "grammar/grammar_cache.h"
#include "model/synth.h"
#include "server/scheduler.h"

namespace smolrt::server {
namespace {

using namespace std::chrono_literals;

// The fake model: the next token after `h` (never an end-of-generation id of the byte vocab).
int next_token(std::span<const int> h) {
  const long s = std::accumulate(h.begin(), h.end(), 0L);
  return 3 + static_cast<int>((s * 31 + static_cast<long>(h.size())) % 200);
}

class FakeBatch : public BatchBackend {
 public:
  FakeBatch(int n_vocab, int max_seqs, int kv_tokens, int max_step, int seq_ctx = 256)
      : max_step_(max_step), hist_(max_seqs), ended_(max_seqs, false) {
    kv_ = std::make_unique<KvPages>(kv_tokens / 16, 16, max_seqs, seq_ctx);
    cfg_.vocab_size = n_vocab;
  }
  std::string name() const override { return "fake"; }
  std::string device_name() const override { return "fake"; }
  const ModelConfig& config() const override { return cfg_; }
  int max_step_tokens() const override { return max_step_; }
  int add_sequence() override {
    if (fail_add.exchange(false)) fail("fake: add_sequence fails");
    ++adds;
    const int s = kv_->add();
    hist_[s].clear();
    ended_[s] = false;
    return s;
  }
  int match_prefix(int seq, std::span<const int> tokens) override {
    const int n = kv_->match_prefix(seq, tokens);
    hist_[seq].assign(tokens.begin(), tokens.begin() + n);
    return n;
  }
  int fork_sequence(int seq) override {
    const int f = kv_->fork(seq);
    hist_[f] = hist_[seq];
    ended_[f] = false;
    return f;
  }
  void rollback(int seq, int pos) override {
    kv_->truncate(seq, pos);
    hist_[seq].resize(pos);
  }
  std::vector<SeqResult> step(std::span<const SeqStep> batch) override {
    {
      std::unique_lock lk(mu);
      ++entered;
      cv.notify_all();
      cv.wait(lk, [&] { return !hold; });
    }
    if (fail_step.exchange(false)) fail("fake: the step fails");
    int need = 0, total = 0;
    for (const SeqStep& s : batch) {
      need += pages_needed(s.seq, static_cast<int>(s.tokens.size()));
      total += static_cast<int>(s.tokens.size());
    }
    if (need > kv_->pages_free() || total > max_step_) fail("fake: the step does not fit");
    std::vector<SeqResult> out;
    std::vector<std::pair<int, int>> shape;
    for (const SeqStep& s : batch) {
      std::vector<PageCopy> copies;
      kv_->grow(s.seq, s.tokens, copies);
      SeqResult r;
      std::vector<int>& h = hist_[s.seq];
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        h.push_back(s.tokens[i]);
        if (s.logits == 2 || (s.logits == 1 && i + 1 == s.tokens.size())) {
          std::vector<float> row(cfg_.vocab_size, 0.0f);
          row[next_token(h)] = 5.0f;
          r.logits.insert(r.logits.end(), row.begin(), row.end());
        }
      }
      if (s.sample) {
        r.token = next_token(h);
        // Structured output: the first allowed token from the model's choice on.
        auto allowed = [&](int t) { return (s.allowed[t / 32] >> (t % 32)) & 1u; };
        if (!s.allowed.empty())
          for (int k = 0; k < cfg_.vocab_size && !allowed(r.token); ++k)
            r.token = (r.token + 1) % cfg_.vocab_size;
      }
      shape.emplace_back(s.seq, static_cast<int>(s.tokens.size()));
      out.push_back(std::move(r));
    }
    for (const SeqStep& s : batch) kv_->publish(s.seq);
    std::lock_guard lk(mu);
    steps.push_back(std::move(shape));
    for (const SeqStep& s : batch) {
      stepped_after_last = stepped_after_last || ended_[s.seq];
      if (s.last) ++last_steps, ended_[s.seq] = true, last_sampled = last_sampled && s.sample;
    }
    return out;
  }

  // Submits every request while the steps are held, so they all compete from the start.
  std::vector<std::shared_ptr<Job>> submit_all(Scheduler& s, const std::vector<GenRequest>& rs) {
    set_hold(true);
    std::vector<std::shared_ptr<Job>> jobs;
    for (const GenRequest& r : rs) jobs.push_back(s.submit(r));
    set_hold(false);
    return jobs;
  }
  void set_hold(bool on) {
    {
      std::lock_guard lk(mu);
      hold = on;
    }
    cv.notify_all();
  }

  std::mutex mu;
  std::condition_variable cv;
  bool hold = false;  // step() blocks while set
  int entered = 0;
  int adds = 0;
  std::atomic<bool> fail_step{false}, fail_add{false};  // the next call throws
  std::vector<std::vector<std::pair<int, int>>> steps;  // (seq, tokens) per step
  // SeqStep::last: steps marked, whether a marked one always sampled, whether a sequence was
  // stepped after its marked step
  int last_steps = 0;
  bool last_sampled = true, stepped_after_last = false;

 private:
  int max_step_;
  ModelConfig cfg_;
  std::vector<std::vector<int>> hist_;
  std::vector<bool> ended_;
};

struct Env {
  Tokenizer tok{builtin_byte_vocab()};
  std::vector<int> prompt(int n, int salt) const {
    std::vector<int> p;
    for (int i = 0; i < n; ++i) p.push_back(3 + (i * 7 + salt * 13) % 250);
    return p;
  }
  GenRequest request(std::vector<int> prompt, int max_tokens) const {
    GenRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temp = 0;
    return r;
  }
  // What the fake model generates after `prompt`, as text.
  std::string expected(std::vector<int> h, int n) const {
    std::vector<int> gen;
    for (int i = 0; i < n; ++i) {
      gen.push_back(next_token(h));
      h.push_back(gen.back());
    }
    return tok.decode(gen);
  }
};

Delta wait_done(Job& j) {
  Delta d;
  for (int i = 0; i < 200 && !d.finished; ++i) j.take(d, 50ms);
  EXPECT_TRUE(d.finished);
  return d;
}

TEST(ServerScheduler, BatchedRequestsMatchTheModelAndFreeEverything) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 4, 4096, 64);
  Scheduler s(be, env.tok, nullptr);
  std::vector<GenRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(env.request(env.prompt(5 + i, i), 20));
  const std::vector<std::shared_ptr<Job>> jobs = be.submit_all(s, reqs);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(jobs[i]);
    const Delta d = wait_done(*jobs[i]);
    EXPECT_EQ(d.text, env.expected(env.prompt(5 + i, i), 20)) << "request " << i;
    EXPECT_EQ(d.finish_reason, "length");
    EXPECT_EQ(d.n_prompt, 5 + i);
    EXPECT_EQ(d.n_generated, 20);
  }
  EXPECT_EQ(be.kv_pages_free(), be.kv_pages_total());
  size_t widest = 0;
  for (const auto& st : be.steps) widest = std::max(widest, st.size());
  EXPECT_EQ(widest, 4u) << "4 sequences never shared a step";
  // Each request's step that sampled its last token (max_tokens) said so, and was its last.
  EXPECT_EQ(be.last_steps, 8);
  EXPECT_TRUE(be.last_sampled);
  EXPECT_FALSE(be.stepped_after_last);
}

TEST(ServerScheduler, FullPoolPreemptsTheYoungestAndRecomputesTheSameText) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 4, 64, 64);  // 4 pages of 16: not enough for 4 x 45 tokens
  Scheduler s(be, env.tok, nullptr);
  std::vector<GenRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(env.request(env.prompt(5, i), 40));
  const std::vector<std::shared_ptr<Job>> jobs = be.submit_all(s, reqs);
  for (int i = 0; i < 6; ++i) {
    const Delta d = wait_done(*jobs[i]);
    EXPECT_EQ(d.text, env.expected(env.prompt(5, i), 40)) << "request " << i;
    EXPECT_EQ(d.finish_reason, "length");
  }
  EXPECT_GT(be.adds, 6) << "no request was preempted";
  EXPECT_EQ(be.kv_pages_free(), be.kv_pages_total());
}

// A prompt whose leading pages an earlier request left in the prefix cache starts after them:
// the same text, the cached tokens reported, and the first step carries only the rest.
TEST(ServerScheduler, PrefixCacheSkipsThePagesAnEarlierRequestComputed) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 4, 4096, 64);
  Scheduler s(be, env.tok, nullptr);
  const std::vector<int> p = env.prompt(40, 3);
  const Delta a = wait_done(*s.submit(env.request(p, 12)));
  EXPECT_EQ(a.n_cached, 0);
  be.steps.clear();
  const Delta b = wait_done(*s.submit(env.request(p, 12)));
  EXPECT_EQ(b.text, a.text);
  EXPECT_EQ(b.text, env.expected(p, 12));
  EXPECT_EQ(b.n_cached, 32);  // two whole pages of 16; the rest is computed
  ASSERT_FALSE(be.steps.empty());
  EXPECT_EQ(be.steps[0].size(), 1u);
  EXPECT_EQ(be.steps[0][0].second, 8);
  // A prompt that differs in its first page finds nothing.
  std::vector<int> q = p;
  q[0] += 1;
  EXPECT_EQ(wait_done(*s.submit(env.request(q, 4))).n_cached, 0);
  EXPECT_EQ(be.kv_pages_free(), be.kv_pages_total());  // cached pages count as free
}

// n > 1: the prompt is computed once; the other choices fork it and feed only its last token.
TEST(ServerScheduler, ChoicesShareThePromptOfTheFirst) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 8, 4096, 256);
  Scheduler s(be, env.tok, nullptr);
  const std::vector<int> p = env.prompt(37, 5);
  GenRequest r = env.request(p, 10);
  r.n = 4;
  be.set_hold(true);
  const std::vector<std::shared_ptr<Job>> jobs = s.submit_n(r);
  be.set_hold(false);
  ASSERT_EQ(jobs.size(), 4u);
  for (const auto& j : jobs) {
    const Delta d = wait_done(*j);
    EXPECT_EQ(d.text, env.expected(p, 10));  // the fake model is deterministic
    EXPECT_EQ(d.n_generated, 10);
    EXPECT_EQ(d.n_prompt, 37);
  }
  int prompt_rows = 0, one_token_prompts = 0;
  for (const auto& st : be.steps)
    for (const auto& [seq, n] : st) {
      if (n > 1) prompt_rows += n;
      if (n == 1) ++one_token_prompts;
    }
  EXPECT_EQ(prompt_rows, 37) << "the prompt was computed more than once";
  EXPECT_GE(one_token_prompts, 3 + 3 * 9);
  EXPECT_EQ(be.kv_pages_free(), be.kv_pages_total());
  EXPECT_THROW(s.submit(r), Error);  // submit takes one choice
  r.n = 0;
  EXPECT_THROW(s.submit_n(r), ApiError);
}

// Structured output: every token comes from the grammar's mask and the request ends, "stop", as
// soon as the text is complete (the fake model would otherwise run on to max_tokens).
TEST(ServerScheduler, GrammarConstrainsTheTokensAndEndsTheRequest) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 4, 4096, 64);
  Scheduler s(be, env.tok, nullptr);
  grammar::GrammarCache cache(std::make_shared<const grammar::TokenVocab>(env.tok));
  GenRequest r = env.request(env.prompt(9, 4), 50);
  r.grammar = cache.gbnf("root ::= \"{\\\"ok\\\": \" (\"true\" | \"false\") \"}\"");
  const Delta d = wait_done(*s.submit(r));
  EXPECT_TRUE(d.text == "{\"ok\": true}" || d.text == "{\"ok\": false}") << d.text;
  EXPECT_EQ(d.finish_reason, "stop");
  EXPECT_LT(d.n_generated, 50);
}

// logit_bias reaches the engine as the token mask: only the tokens given 100, never a banned one
// (the fake model's own choice banned: another token), with a grammar their intersection, and a
// bias that leaves the grammar nothing ends that request with its error.
TEST(ServerScheduler, LogitBiasMasksTheSampledTokens) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 4, 4096, 64);
  Scheduler s(be, env.tok, nullptr);
  const int a = env.tok.encode("a", false, -1).at(0), b = env.tok.encode("b", false, -1).at(0);
  GenRequest only = env.request(env.prompt(9, 5), 12);
  only.only_tokens = {a, b};
  const Delta d1 = wait_done(*s.submit(only));
  EXPECT_EQ(d1.n_generated, 12);
  EXPECT_EQ(d1.text.find_first_not_of("ab"), std::string::npos) << d1.text;

  const std::vector<int> p = env.prompt(9, 6);
  GenRequest ban = env.request(p, 1);
  ban.banned_tokens = {next_token(p)};
  const Delta d2 = wait_done(*s.submit(ban));
  EXPECT_EQ(d2.n_generated, 1);
  EXPECT_NE(d2.text, env.expected(p, 1));

  grammar::GrammarCache cache(std::make_shared<const grammar::TokenVocab>(env.tok));
  GenRequest both = env.request(env.prompt(9, 7), 20);
  both.grammar = cache.gbnf("root ::= (\"a\" | \"b\" | \"c\")+ \".\"");
  both.banned_tokens = {a};
  const Delta d3 = wait_done(*s.submit(both));
  EXPECT_FALSE(d3.text.empty());
  EXPECT_EQ(d3.text.find('a'), std::string::npos) << d3.text;

  GenRequest none = env.request(env.prompt(9, 8), 20);
  none.grammar = cache.gbnf("root ::= \"a\" \"b\"");
  none.banned_tokens = {a};
  const Delta d4 = wait_done(*s.submit(none));
  EXPECT_EQ(d4.finish_reason, "error");
  EXPECT_EQ(d4.error_param, "logit_bias");
  EXPECT_EQ(d4.error_code, "logit_bias_excludes_format");
  EXPECT_NE(d4.error.find("logit_bias"), std::string::npos) << d4.error;
}

TEST(ServerScheduler, LongPromptsAreChunkedWhileDecodesKeepGoing) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 4, 4096, 16);
  SchedulerOptions o;
  o.step_delay_ms = 2;  // a decodes long enough for b's prompt to arrive
  Scheduler s(be, env.tok, nullptr, o);
  auto a = s.submit(env.request(env.prompt(4, 1), 60));
  Delta da;
  while (da.n_generated < 2) ASSERT_TRUE(a->take(da, 5s));
  auto b = s.submit(env.request(env.prompt(100, 2), 5));
  const Delta db = wait_done(*b);
  EXPECT_EQ(db.text, env.expected(env.prompt(100, 2), 5));
  da.text += wait_done(*a).text;
  EXPECT_EQ(da.text, env.expected(env.prompt(4, 1), 60));
  int chunked = 0;
  for (const auto& st : be.steps) {
    int total = 0;
    for (auto [seq, n] : st) total += n;
    EXPECT_LE(total, 16);
    if (st.size() == 2 && st[1].second > 1) {
      ++chunked;
      EXPECT_EQ(st[0].second, 1) << "the decode comes first";
    }
  }
  EXPECT_GE(chunked, 6) << "the 100-token prompt was not spread over steps beside the decode";
}

TEST(ServerScheduler, QueueIsBoundedAndCancelFreesTheSequence) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 1, 4096, 64);
  SchedulerOptions o;
  o.max_queue = 1;
  Scheduler s(be, env.tok, nullptr, o);
  be.set_hold(true);
  auto a = s.submit(env.request(env.prompt(4, 1), 100));
  {
    std::unique_lock lk(be.mu);
    be.cv.wait(lk, [&] { return be.entered > 0; });  // a runs (blocked in its step)
  }
  auto b = s.submit(env.request(env.prompt(4, 2), 3));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(s.submit(env.request(env.prompt(4, 3), 3)), nullptr) << "queue of 1 overflowed";
  EXPECT_EQ(s.waiting(), 1);
  a->cancel();
  be.set_hold(false);
  const Delta da = wait_done(*a);
  EXPECT_EQ(da.finish_reason, "stop");
  EXPECT_EQ(da.stop_reason, "cancelled");
  EXPECT_EQ(wait_done(*b).text, env.expected(env.prompt(4, 2), 3));
  for (int i = 0; i < 100 && !s.idle(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(be.kv_pages_free(), be.kv_pages_total());
}

// The news callback fires for what a reader can take without blocking; abort_all ends running
// and queued requests with finish_reason "stop" and stop_reason "shutdown".
TEST(ServerScheduler, NewsCallbackAndShutdown) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 1, 4096, 64);
  Scheduler s(be, env.tok, nullptr);
  std::atomic<int> news{0};
  auto j = s.submit(env.request(env.prompt(4, 1), 5), [&] { ++news; });
  const Delta d = wait_done(*j);
  EXPECT_EQ(d.text, env.expected(env.prompt(4, 1), 5));
  for (int i = 0; i < 100 && news.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(news.load(), 1) << "the callback follows the condition variable's wake";
  EXPECT_TRUE(d.stop_reason.empty());
  Delta none;
  EXPECT_FALSE(j->take(none, 0ms)) << "news after the end";

  int before = 0;
  {
    std::lock_guard lk(be.mu);
    before = be.entered;
  }
  be.set_hold(true);
  auto a = s.submit(env.request(env.prompt(4, 2), 100));
  {
    std::unique_lock lk(be.mu);
    be.cv.wait(lk, [&] { return be.entered > before; });  // a runs (blocked in its step)
  }
  auto b = s.submit(env.request(env.prompt(4, 3), 100));  // queued behind a
  s.abort_all();
  be.set_hold(false);
  const Delta da = wait_done(*a), db = wait_done(*b);
  for (const Delta* dj : {&da, &db}) {
    EXPECT_TRUE(dj->finished);
    EXPECT_EQ(dj->finish_reason, "stop");
    EXPECT_EQ(dj->stop_reason, "shutdown");
  }
  EXPECT_EQ(db.n_generated, 0);
}

TEST(ServerScheduler, EchoLogprobsScoreEveryPromptToken) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 2, 4096, 8);  // the prompt spans several chunks
  Scheduler s(be, env.tok, nullptr);
  GenRequest r = env.request(env.prompt(20, 4), 2);
  r.echo = true;
  r.logprobs = 1;
  auto j = s.submit(r);
  const Delta d = wait_done(*j);
  ASSERT_EQ(d.prompt_logprobs.size(), 20u);
  EXPECT_FALSE(d.prompt_logprobs[0].has_logprob);
  std::vector<int> h;
  for (int i = 1; i < 20; ++i) {
    h.assign(r.prompt.begin(), r.prompt.begin() + i);
    const TokenLogprob& lp = d.prompt_logprobs[i];
    EXPECT_EQ(lp.token, r.prompt[i]);
    ASSERT_EQ(lp.top.size(), 1u);
    EXPECT_EQ(lp.top[0].token, next_token(h));  // the fake model's favourite
  }
  ASSERT_EQ(d.logprobs.size(), 2u);
  EXPECT_EQ(d.logprobs[0].token, d.logprobs[0].top[0].token);  // greedy: the top one
}

TEST(ServerScheduler, BackendErrorsEndTheirRequestsAndServingGoesOn) {
  Env env;
  FakeBatch be(env.tok.n_vocab(), 2, 4096, 64);
  Scheduler s(be, env.tok, nullptr);
  be.fail_step = true;
  Delta d = wait_done(*s.submit(env.request(env.prompt(4, 1), 5)));
  EXPECT_EQ(d.finish_reason, "error");
  EXPECT_NE(d.error.find("the step fails"), std::string::npos) << d.error;
  be.fail_add = true;
  d = wait_done(*s.submit(env.request(env.prompt(4, 2), 5)));
  EXPECT_EQ(d.finish_reason, "error");
  EXPECT_NE(d.error.find("add_sequence fails"), std::string::npos) << d.error;
  d = wait_done(*s.submit(env.request(env.prompt(4, 3), 5)));
  EXPECT_EQ(d.text, env.expected(env.prompt(4, 3), 5));
  EXPECT_EQ(be.kv_pages_free(), be.kv_pages_total());
}

TEST(ServerScheduler, TokenLogprobIsLogSoftmax) {
  const std::vector<float> row = {1.0f, 3.0f, 2.0f, 3.0f};
  const TokenLogprob lp = token_logprob(row, 2, 3);
  double z = 0;
  for (float v : row) z += std::exp(v);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 1);  // ties: the lower id first
  EXPECT_EQ(lp.top[1].token, 3);
  EXPECT_EQ(lp.top[2].token, 2);
}

}  // namespace
}  // namespace smolrt::server
