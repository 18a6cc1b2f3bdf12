#include "backend/single_sequence.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace smolrt {
namespace {

class SingleSequence final : public Backend {
 public:
  explicit SingleSequence(std::unique_ptr<BatchBackend> e) : e_(std::move(e)) {
    seq_ = e_->add_sequence();
  }

  std::string name() const override { return e_->name(); }
  const ModelConfig& config() const override { return e_->config(); }
  int n_ctx() const override { return e_->seq_ctx(); }
  int position() const override { return e_->position(seq_); }
  std::string device_name() const override { return e_->device_name(); }
  double copy_bandwidth_gbs() override { return e_->copy_bandwidth_gbs(); }

  void reset() override {
    e_->free_sequence(seq_);
    seq_ = e_->add_sequence();
  }
  void rollback(int pos) override {
    if (pos < 0 || pos > position())
      fail("rollback to position ", pos, " is invalid: the KV cache holds ", position(),
           " tokens (valid 0..", position(), ")");
    e_->rollback(seq_, pos);
  }

  std::span<const float> forward_token(int token, int pos) override {
    SeqStep s = one(token, pos);
    s.sample = false, s.logits = 1;
    logits_ = std::move(run(s).logits);
    return logits_;
  }
  int forward_token_greedy(int token, int pos) override {
    SeqStep s = one(token, pos);
    return run(s).token;
  }
  int forward_token_sample(int token, int pos, const SamplingParams& p, float u,
                           std::span<const int> history) override {
    SeqStep s = one(token, pos);
    s.params = p, s.u = u, s.history = history;
    return run(s).token;
  }

  std::span<const float> forward_prompt(std::span<const int> tokens) override {
    SeqStep last;
    last.sample = false, last.logits = 1;
    logits_ = std::move(prompt(tokens, last, nullptr).logits);
    return logits_;
  }
  int forward_prompt_sample(std::span<const int> tokens, const SamplingParams& p, float u,
                            std::span<const int> history) override {
    SeqStep last;
    last.params = p, last.u = u, last.history = history;
    return prompt(tokens, last, nullptr).token;
  }
  std::vector<float> forward_prompt_all(std::span<const int> tokens) override {
    SeqStep last;
    last.sample = false, last.logits = 2;
    std::vector<float> all;
    all.reserve(tokens.size() * size_t(config().vocab_size));
    SeqResult r = prompt(tokens, last, &all);
    all.insert(all.end(), r.logits.begin(), r.logits.end());
    return all;
  }

 private:
  // A one-token step at pos (rolling back to it first); greedy sampling unless changed.
  SeqStep one(int token, int pos) {
    check_token(token);
    check_pos(pos);
    if (pos < position()) e_->rollback(seq_, pos);
    tok_ = token;
    SeqStep s;
    s.tokens = std::span<const int>(&tok_, 1);
    s.params.temp = 0.0f;  // greedy
    return s;
  }
  SeqResult run(SeqStep& s) {
    s.seq = seq_;
    std::vector<SeqResult> r = e_->step(std::span<const SeqStep>(&s, 1));
    return std::move(r[0]);
  }
  // The prompt in steps of max_step_tokens(); `last` says what the last step returns, earlier
  // steps return nothing (or, with `all`, their logits of every token appended to it).
  SeqResult prompt(std::span<const int> tokens, SeqStep last, std::vector<float>* all) {
    if (tokens.empty()) fail("forward_prompt: the prompt is empty; give at least one token");
    for (int t : tokens) check_token(t);
    if (size_t(position()) + tokens.size() > size_t(n_ctx()))
      fail("the prompt of ", tokens.size(), " tokens at position ", position(),
           " does not fit the context of ", n_ctx(), " tokens; pass a larger --ctx (at most ",
           config().n_ctx_train, ") or a shorter prompt");
    const size_t step = size_t(e_->max_step_tokens());
    for (size_t i = 0;; i += step) {
      const size_t n = std::min(step, tokens.size() - i);
      if (i + n == tokens.size()) {
        last.tokens = tokens.subspan(i, n);
        return run(last);
      }
      SeqStep s;
      s.tokens = tokens.subspan(i, n);
      s.sample = false, s.logits = all ? 2 : 0;
      SeqResult r = run(s);
      if (all) all->insert(all->end(), r.logits.begin(), r.logits.end());
    }
  }

  std::unique_ptr<BatchBackend> e_;
  int seq_ = -1;
  int tok_ = 0;
  std::vector<float> logits_;
};

}  // namespace

BatchOptions single_sequence_options(const BackendOptions& opt) {
  BatchOptions b;
  b.kind = opt.kind;
  b.max_seqs = 1;
  b.seq_ctx = opt.n_ctx;
  b.page_size = kSinglePageTokens;
  b.n_threads = opt.n_threads;
  b.kv_half = opt.kv_half;
  b.f16_weights = opt.f16_weights;
  b.dense_rows = opt.dense_rows;
  b.prefix_cache = false;
  return b;
}

std::unique_ptr<Backend> make_single_sequence(std::unique_ptr<BatchBackend> engine) {
  return std::make_unique<SingleSequence>(std::move(engine));
}

}  // namespace smolrt
