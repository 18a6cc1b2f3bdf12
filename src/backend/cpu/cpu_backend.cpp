// CpuBackend: one sequence on the CPU, the fast path ("cpu") or the fp32 oracle ("cpu-ref"). The
// forward pass is cpu::Forward (shared with the CPU BatchBackend): decode one token at a time,
// prompts in chunks of kPromptRows tokens (the logits only of the rows that need them); the KV pool
// is one page of n_ctx positions, so position p is slot p.
#include <algorithm>

#include "backend/backend.h"
#include "backend/cpu/cpu_forward.h"
#include "core/error.h"

namespace smolrt {

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& m, const BackendOptions& opt);

  std::string name() const override { return f_.fast() ? "cpu" : "cpu-ref"; }
  const ModelConfig& config() const override { return f_.config(); }
  int n_ctx() const override { return n_ctx_; }
  int position() const override { return pos_; }

  void reset() override { pos_ = 0; }
  void rollback(int pos) override;

  std::span<const float> forward_token(int token, int pos) override;
  std::span<const float> forward_prompt(std::span<const int> tokens) override;
  std::vector<float> forward_prompt_all(std::span<const int> tokens) override;

  void set_debug(bool on) override {
    debug_ = on;
    f_.set_debug(on);
  }
  std::vector<Activation> activations() const override { return f_.activations(); }
  std::string device_name() const override { return f_.device_name(); }

 private:
  static int checked_ctx(const ModelConfig& c, int n_ctx);
  void check_prompt(std::span<const int> tokens) const;
  // Runs tokens at pos_.. through the model kPromptRows at a time (each weight row read once per
  // chunk; every row's arithmetic is that of forward_token); on_logits gets the logits of the
  // rows that want them: all rows, or only the very last.
  void run_prompt(std::span<const int> tokens, bool all, const cpu::Forward::LogitsFn& on_logits);
  static constexpr int kPromptRows = 32;

  int n_ctx_ = 0;
  int pos_ = 0;
  cpu::Forward f_;
};

int CpuBackend::checked_ctx(const ModelConfig& c, int n_ctx) {
  if (n_ctx < 0)
    fail("--ctx ", n_ctx, " is invalid: it must be positive (0 = the model's ", c.n_ctx_train, ")");
  const int n = n_ctx > 0 ? n_ctx : c.n_ctx_train;
  if (c.n_ctx_train > 0 && n > c.n_ctx_train) {
    fail("--ctx ", n, " exceeds the model's training context of ", c.n_ctx_train,
         " tokens; use --ctx ", c.n_ctx_train, " or less");
  }
  if (n <= 0) fail("the model declares no context length; pass --ctx N");
  return n;
}

CpuBackend::CpuBackend(const Model& m, const BackendOptions& opt)
    : n_ctx_(checked_ctx(m.config, opt.n_ctx)),
      f_(m, n_ctx_, n_ctx_, kPromptRows, opt.n_threads, cpu::kernel_choice(opt.kind)) {}

void CpuBackend::rollback(int pos) {
  if (pos < 0 || pos > pos_) {
    fail("rollback to position ", pos, " is invalid: the KV cache holds ", pos_,
         " tokens (valid 0..", pos_, ")");
  }
  pos_ = pos;
}

std::span<const float> CpuBackend::forward_token(int token, int pos) {
  check_token(token);
  check_pos(pos);
  static constexpr int kWhole[1] = {0};  // one page holding the whole context
  const cpu::Forward::Row row{token, pos, kWhole, true};
  std::span<const float> logits;
  f_.forward({&row, 1}, n_ctx_, [&](int, std::span<const float> l) { logits = l; });
  pos_ = pos + 1;  // writing at pos drops everything after it
  return logits;
}

void CpuBackend::check_prompt(std::span<const int> tokens) const {
  if (tokens.empty()) fail("a prompt needs at least one token");
  for (int t : tokens) check_token(t);
  if (pos_ + static_cast<int64_t>(tokens.size()) > n_ctx_) {
    fail("the prompt has ", tokens.size(), " tokens but only ", n_ctx_ - pos_, " of the ", n_ctx_,
         " context positions are free; use a larger --ctx or a shorter prompt");
  }
}

void CpuBackend::run_prompt(std::span<const int> tokens, bool all,
                            const cpu::Forward::LogitsFn& on_logits) {
  static constexpr int kWhole[1] = {0};  // one page holding the whole context
  const int n = static_cast<int>(tokens.size());
  cpu::Forward::Row rows[kPromptRows];
  for (int i0 = 0; i0 < n;) {
    // With every row's logits wanted, the last token runs alone, so its logits sit where a
    // forward_token's would (callers have read that buffer after forward_prompt_all).
    const int m =
        all && i0 < n - 1 ? std::min(kPromptRows, n - 1 - i0) : std::min(kPromptRows, n - i0);
    for (int j = 0; j < m; ++j) {
      rows[j] = cpu::Forward::Row{tokens[size_t(i0 + j)], pos_ + j, kWhole, all || i0 + j == n - 1};
    }
    f_.forward({rows, size_t(m)}, n_ctx_, on_logits);
    pos_ += m;
    i0 += m;
  }
}

std::span<const float> CpuBackend::forward_prompt(std::span<const int> tokens) {
  check_prompt(tokens);
  std::span<const float> out;
  run_prompt(tokens, false, [&](int, std::span<const float> l) { out = l; });
  return out;  // the last row's logits stay valid until the next forward()
}

std::vector<float> CpuBackend::forward_prompt_all(std::span<const int> tokens) {
  check_prompt(tokens);
  std::vector<float> all;
  all.reserve(tokens.size() * size_t(config().vocab_size));
  run_prompt(tokens, true,
             [&](int, std::span<const float> l) { all.insert(all.end(), l.begin(), l.end()); });
  return all;
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& m, const BackendOptions& opt) {
  return std::make_unique<CpuBackend>(m, opt);
}

}  // namespace smolrt
