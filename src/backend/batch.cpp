#include "backend/batch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/sample.h"
#include "core/error.h"

namespace smolrt {

void BatchBackend::check_step(std::span<const SeqStep> batch) const {
  const int vocab = config().vocab_size;
  int64_t total = 0, pages = 0;
  std::vector<char> seen(static_cast<size_t>(max_seqs()), 0);
  auto exists = [&](int seq) { return kv_->exists(seq); };
  for (const SeqStep& s : batch) {
    if (!exists(s.seq))
      fail("step: sequence ", s.seq, " does not exist; use an id from add_sequence()");
    if (seen[s.seq]++)
      fail("step: sequence ", s.seq, " appears twice in one step; give it one entry per step");
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n == 0) fail("step: sequence ", s.seq, " has no tokens; each entry needs at least one");
    for (int t : s.tokens) {
      if (t < 0 || t >= vocab)
        fail("step: sequence ", s.seq, ": token id ", t, " is out of range (valid ids 0..",
             vocab - 1, ")");
    }
    if (position(s.seq) + n > seq_ctx())
      fail("step: sequence ", s.seq, " holds ", position(s.seq), " tokens; ", n,
           " more pass its context of ", seq_ctx(),
           " positions; shorten the prompt or the generation");
    if (s.logits < 0 || s.logits > 2)
      fail("step: sequence ", s.seq, ": logits = ", s.logits,
           " is invalid; use 0 (none), 1 (last token) or 2 (every token)");
    if (s.sample) {
      try {
        validate(s.params);
      } catch (const Error& e) {  // validate names the CLI flag; say which sequence too
        fail("step: sequence ", s.seq, ": ", e.what());
      }
      if (!s.allowed.empty() && s.allowed.size() < (static_cast<size_t>(vocab) + 31) / 32)
        fail("step: sequence ", s.seq, ": the allowed-token mask has ", s.allowed.size(),
             " words; the vocabulary of ", vocab, " tokens needs ", (vocab + 31) / 32);
      if (!s.params.greedy() && !(s.u >= 0.0f && s.u < 1.0f))
        fail("step: sequence ", s.seq, ": the draw u = ", s.u, " is outside [0, 1)");
      // cpu::sample rejects such ids only after the forward; check before anything changes.
      if (s.params.has_penalties()) {
        for (int t : cpu::penalty_window(s.history, s.params)) {
          if (t < 0 || t >= vocab)
            fail("step: sequence ", s.seq, ": token id ", t,
                 " in the sampling history is out of range (valid ids 0..", vocab - 1, ")");
        }
      }
    }
    total += n;
    pages += pages_needed(s.seq, static_cast<int>(n));
  }
  if (total > max_step_tokens())
    fail("step: ", total, " tokens exceed the step limit of ", max_step_tokens(),
         "; split prompts into smaller chunks");
  if (pages > kv_pages_free())
    fail("step: the KV pool has ", kv_pages_free(), " free pages of ", page_size(), " tokens; ",
         pages, " are needed; free a sequence or step fewer tokens");
}

BatchGeometry batch_geometry(const ModelConfig& c, const BatchOptions& opt,
                             int64_t kv_bytes_per_token, int64_t kv_cap_bytes) {
  if (opt.max_seqs <= 0)
    fail("max_seqs ", opt.max_seqs, " is invalid: allow at least 1 sequence (--parallel)");
  if (opt.page_size <= 0)
    fail("page_size ", opt.page_size, " is invalid: a KV page holds at least 1 token");
  if (opt.max_step_tokens < 0)
    fail("max_step_tokens ", opt.max_step_tokens,
         " is invalid: a step carries at least 1 token (0: the backend's default)");
  if (opt.seq_ctx < 0)
    fail("seq_ctx ", opt.seq_ctx, " is invalid: use 0 (the model's ", c.n_ctx_train,
         ") or a positive count");
  if (opt.kv_tokens < 0)
    fail("kv_tokens ", opt.kv_tokens, " is invalid: use 0 (sized from max_seqs) or a count > 0");
  BatchGeometry g;
  g.seq_ctx = opt.seq_ctx > 0 ? opt.seq_ctx : c.n_ctx_train;
  if (g.seq_ctx <= 0) fail("the model declares no context length; set seq_ctx (--ctx N)");
  if (c.n_ctx_train > 0 && g.seq_ctx > c.n_ctx_train)
    fail("seq_ctx ", g.seq_ctx, " exceeds the model's training context of ", c.n_ctx_train,
         " tokens; use ", c.n_ctx_train, " or less");
  int64_t tokens = opt.kv_tokens;
  if (tokens == 0) {
    const int64_t cap = kv_cap_bytes / std::max<int64_t>(kv_bytes_per_token, 1);
    tokens = std::max<int64_t>(std::min(int64_t(g.seq_ctx) * opt.max_seqs, cap), g.seq_ctx);
  }
  const int64_t pages = (tokens + opt.page_size - 1) / opt.page_size;
  if (pages * opt.page_size > INT32_MAX)
    fail("a KV pool of ", tokens, " tokens is too large; use a smaller kv_tokens or page_size");
  g.n_pages = static_cast<int>(pages);
  return g;
}

std::unique_ptr<BatchBackend> make_batch_backend(const Model& m, const BatchOptions& opt) {
  const BackendKind k = resolve_backend(opt.kind);
#if defined(SMOLRT_HAVE_CUDA)
  if (k == BackendKind::Cuda) return make_cuda_batch_backend(m, opt);
#endif
  BatchOptions cpu = opt;
  cpu.kind = k == BackendKind::CpuRef ? "cpu-ref" : "cpu";
  return make_cpu_batch_backend(m, cpu);
}

}  // namespace smolrt
