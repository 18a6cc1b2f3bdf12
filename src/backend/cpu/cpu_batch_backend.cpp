// The CPU BatchBackend: cpu::Forward (the fast path for "cpu", the fp32 oracle for "cpu-ref") over
// a paged KV pool whose pages KvPages hands out. A step's tokens (every sequence's) go through the
// layers together, so each weight row is read once per step; each token's arithmetic is that of
// the single-sequence CpuBackend of the same kind, so a sequence's results are bit-identical
// whatever else shares its step.
#include <algorithm>

#include "backend/batch.h"
#include "backend/cpu/cpu_forward.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/sample.h"
#include "backend/kv_pages.h"
#include "core/error.h"

namespace smolrt {

namespace {

class CpuBatchBackend final : public BatchBackend {
 public:
  CpuBatchBackend(const Model& m, const BatchOptions& opt, const BatchGeometry& g)
      : max_step_tokens_(opt.max_step_tokens != 0 ? opt.max_step_tokens : kCpuStepTokens),
        f_(m, g.n_pages * opt.page_size, g.seq_ctx, max_step_tokens_, opt.n_threads,
           cpu::kernel_choice(opt.kind)) {
    kv_ = std::make_unique<KvPages>(g.n_pages, opt.page_size, opt.max_seqs, g.seq_ctx,
                                    opt.prefix_cache);
  }

  std::string name() const override { return f_.fast() ? "cpu" : "cpu-ref"; }
  std::string device_name() const override { return f_.device_name(); }
  const ModelConfig& config() const override { return f_.config(); }
  int max_step_tokens() const override { return max_step_tokens_; }

  std::vector<SeqResult> step(std::span<const SeqStep> batch) override;

 private:
  int max_step_tokens_;
  cpu::Forward f_;
  cpu::SampleScratch scratch_;
  std::vector<float> masked_;
};

std::vector<SeqResult> CpuBatchBackend::step(std::span<const SeqStep> batch) {
  check_step(batch);
  std::vector<int> start(batch.size());
  size_t grown = 0;
  try {
    std::vector<PageCopy> copies;
    for (; grown < batch.size(); ++grown) {
      const SeqStep& s = batch[grown];
      start[grown] = kv_->position(s.seq);
      kv_->grow(s.seq, s.tokens, copies);
    }
    const int ps = kv_->page_size();
    for (const PageCopy& c : copies) f_.copy_kv(c.src * ps, c.dst * ps, ps);
    // One row per token, sequences in batch order, each in position order; owner[i]: the entry
    // row i belongs to.
    std::vector<cpu::Forward::Row> rows;
    std::vector<int> owner;
    for (size_t b = 0; b < batch.size(); ++b) {
      const SeqStep& s = batch[b];
      const int n = static_cast<int>(s.tokens.size());
      for (int i = 0; i < n; ++i) {
        const bool last = i == n - 1;
        rows.push_back({s.tokens[i], start[b] + i, kv_->block_table(s.seq),
                        s.logits == 2 || (last && (s.logits == 1 || s.sample))});
        owner.push_back(static_cast<int>(b));
      }
    }
    std::vector<SeqResult> out(batch.size());
    for (size_t b = 0; b < batch.size(); ++b)
      if (batch[b].logits == 2) out[b].logits.reserve(batch[b].tokens.size() * config().vocab_size);
    f_.forward(rows, kv_->page_size(), [&](int i, std::span<const float> logits) {
      const SeqStep& s = batch[owner[i]];
      SeqResult& r = out[owner[i]];
      if (s.logits == 2) r.logits.insert(r.logits.end(), logits.begin(), logits.end());
      if (i + 1 < static_cast<int>(rows.size()) && owner[i + 1] == owner[i]) return;  // not last
      const std::span<const float> last = cpu::mask_logits(logits, s.allowed, masked_);
      if (s.logits == 1) r.logits.assign(last.begin(), last.end());
      // The same call as Backend::forward_token_sample's default, so the token matches it.
      if (s.sample) r.token = cpu::sample(last, s.params, s.u, s.history, scratch_);
    });
    for (const SeqStep& s : batch) kv_->publish(s.seq);
    return out;
  } catch (...) {
    // check_step makes this unreachable in practice; still, an Error must leave every sequence
    // as it was (batch.h), and the KV rows before `start` were never touched.
    for (size_t i = 0; i < grown; ++i) kv_->truncate(batch[i].seq, start[i]);
    throw;
  }
}

}  // namespace

std::unique_ptr<BatchBackend> make_cpu_batch_backend(const Model& m, const BatchOptions& opt) {
  // fp32 K and V rows of every layer per token (kv_half is a CUDA option).
  const int64_t bytes_per_token = int64_t(2) * m.config.n_layers * m.config.kv_dim() * 4;
  return std::make_unique<CpuBatchBackend>(m, opt, batch_geometry(m.config, opt, bytes_per_token));
}

}  // namespace smolrt
