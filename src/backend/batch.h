// The multi-sequence backend: what the server's scheduler drives. Many sequences, each with an
// id, its own positions in a shared paged KV pool and its own sampling state; one step() advances
// any subset of them: a sequence contributes one decode token or a chunk of its prompt, and gets
// back its next token (sampled on the device with its own parameters and draw) and, when asked,
// logits. A sequence's results do not depend on which others share its step (up to the
// floating-point bound each implementation states).
//
// KV pool: kv_tokens() token slots in pages of page_size() tokens; a sequence holds
// ceil(position / page_size) pages (a block table), taken as it grows and returned by
// free_sequence. pages_needed() tells the scheduler whether a step fits before it asks.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_pages.h"
#include "core/sampling.h"
#include "model/model.h"

namespace smolrt {

// Default step budgets. CPU: a step's time grows with its tokens, and every running stream waits
// for it. CUDA: a step's fixed cost (its kernel chain) is shared by more prompt tokens in bigger
// steps, while every stream's next token waits for the whole step; 768 tokens gets most of the
// served throughput of larger budgets at a smaller time to first token.
constexpr int kCpuStepTokens = 512;
constexpr int kCudaStepTokens = 768;

struct BatchOptions {
  std::string kind = "auto";  // "cpu" | "cpu-ref" | "cuda" | "auto" (backend.h's BackendOptions)
  int max_seqs = 64;          // sequences that may exist at once (the server's --parallel)
  int seq_ctx = 0;            // positions per sequence at most; 0 = the model's training context
  int kv_tokens = 0;          // KV pool size in tokens; 0 = seq_ctx * max_seqs capped by memory
  int page_size = 16;         // tokens per KV page
  // Tokens one step() may carry in all (prompt chunks + decodes); 0: the backend's default,
  // kCpuStepTokens or kCudaStepTokens (CUDA takes up to 2,048).
  int max_step_tokens = 0;
  int n_threads = 0;  // CPU: 0 = the physical cores this process may run on
  // CUDA: fp16 KV pool (halves attention bytes; llama.cpp's and vLLM's default too), else fp32.
  // CPU ignores it.
  bool kv_half = true;
  // CUDA: fp16 weight copies for the large-batch GEMMs (BackendOptions::f16_weights), and the rows
  // from which a step takes them: 0 = measured at start-up, n > 0 forces n (tests).
  bool f16_weights = true;
  int dense_rows = 0;
  // Full KV pages kept after their sequence ends and shared by later prompts that begin with the
  // same tokens (kv_pages.h). CUDA models whose sliding-window layers keep per-sequence rings
  // (gemma3 at contexts past the window) cache nothing: a ring cannot be shared.
  bool prefix_cache = true;
};

// BatchOptions resolved against a model, shared by the implementations so their defaults agree:
// seq_ctx 0 -> the training context; kv_tokens 0 -> seq_ctx * max_seqs, capped at what
// kv_cap_bytes of KV (kv_bytes_per_token: K and V of every layer) hold but at least seq_ctx;
// rounded up to whole pages. Throws Error naming the option for a count out of range.
struct BatchGeometry {
  int seq_ctx = 0;
  int n_pages = 0;
};
BatchGeometry batch_geometry(const ModelConfig& c, const BatchOptions& opt,
                             int64_t kv_bytes_per_token, int64_t kv_cap_bytes = int64_t(1) << 30);

// One sequence's part of a step.
struct SeqStep {
  int seq = -1;                 // from add_sequence()
  std::span<const int> tokens;  // >= 1 ids, at positions [position(seq), position(seq) + n)
  // After the last token: sample the next token (params / u / history as Backend's sampling
  // steps: u from TokenSampler::step_draw, history its penalty history)...
  bool sample = true;
  SamplingParams params;
  float u = 0.0f;
  std::span<const int> history;
  // ...and/or return logits: 0 = none, 1 = the last token's, 2 = every token's of this chunk
  // (prompt scoring: echo + logprobs).
  int logits = 0;
  // Structured output: the tokens the sampled one may be (a bitset over the vocabulary, bit t of
  // word t / 32; ceil(vocab / 32) words, valid during step()), or empty for any. The others'
  // logits of the last token are -inf, for sampling and in the returned logits (logprobs then
  // describe the constrained distribution). An all-zero mask samples token 0.
  std::span<const uint32_t> allowed;
  // The caller ends the sequence after this step's token (its token budget is spent): an engine
  // that launches a sequence's next step ahead (the CUDA engine's speculation) launches none.
  bool last = false;
};

struct SeqResult {
  int token = -1;             // the sampled id when SeqStep::sample, else -1
  std::vector<float> logits;  // [rows][vocab] as SeqStep::logits asked (raw, before penalties)
};

class BatchBackend {
 public:
  virtual ~BatchBackend() = default;

  virtual std::string name() const = 0;  // "cpu" | "cpu-ref" | "cuda"
  virtual std::string device_name() const = 0;
  virtual const ModelConfig& config() const = 0;
  // Measured device-memory copy bandwidth in GB/s (Backend::copy_bandwidth_gbs); 0: not measured.
  virtual double copy_bandwidth_gbs() { return 0.0; }
  virtual int max_step_tokens() const = 0;
  // The KV pool's bookkeeping (kv_pages.h), the same for every implementation.
  int max_seqs() const { return kv_->max_seqs(); }
  int seq_ctx() const { return kv_->seq_ctx(); }  // positions per sequence at most
  int page_size() const { return kv_->page_size(); }
  int kv_pages_total() const { return kv_->pages_total(); }
  int kv_pages_free() const { return kv_->pages_free(); }
  int kv_tokens() const { return kv_pages_total() * page_size(); }
  // > 0: the sliding-window layers keep, outside the pool, a ring of this many rows per sequence
  // slot (the window plus a step's chunk), so the pool's pages hold only the global layers' K/V.
  // rollback() then goes back at most kv_ring_rows() - window + 1 positions (else Error;
  // kv_pages.h's sliding_ring_back), one less where decode steps are speculated (the CUDA engine).
  virtual int kv_ring_rows() const { return 0; }
  // > 0: steps of at least this many rows run fp16 dense GEMMs (the CUDA engine's measured
  // crossover, cuda::measure_dense_rows); 0: every step runs the quantized kernels.
  virtual int dense_rows() const { return 0; }
  // Runs every kind of step the engine has once on rows that touch no sequence, so that no
  // request pays a first use: the CUDA engine's kernels are loaded at their first launch (tens of
  // ms each kind of step), its fp16 GEMMs choose their kernels by timing each new row count, and
  // its one-row steps replay graphs. `serve` calls it before it listens. A no-op elsewhere.
  virtual void warm_up() {}
  // Steps so far that the engine launched before the previous one's token was read (the CUDA
  // engine's speculated decode steps) and then used; 0 where it never does.
  virtual int64_t steps_ahead() const { return 0; }
  // Step graphs captured so far: the CUDA engine records one per new step shape (bucket, output
  // rows, attention splits...) and replays it; the step that records one pays milliseconds. 0
  // where there are none.
  virtual int64_t graph_captures() const { return 0; }
  // Rows so far whose attention read a prefix their sequences share once for all of them (the
  // CUDA engine's cascade attention); 0 where it never does.
  virtual int64_t shared_prefix_rows() const { return 0; }

  // A new empty sequence; Error when max_seqs() sequences exist.
  virtual int add_sequence() { return kv_->add(); }
  // Returns its pages to the pool; the id may be reused. Unknown ids: Error.
  virtual void free_sequence(int seq) { kv_->remove(seq); }
  int position(int seq) const { return kv_->position(seq); }
  std::span<const int> block_table(int seq) const { return kv_->block_table(seq); }
  // Keep positions [0, pos) of seq (pages past them go back to the pool).
  virtual void rollback(int seq, int pos) { kv_->truncate(seq, pos); }
  // Pages seq must take from the pool to grow by n_tokens (0 when its last page has room; one
  // more when that page is shared and must be copied first, kv_pages.h).
  int pages_needed(int seq, int n_tokens) const { return kv_->pages_needed(seq, n_tokens); }

  // Prefix cache (kv_pages.h). For a new, empty sequence: takes the cached K/V pages that begin
  // `tokens` and returns how many tokens they hold (0 when none or when the cache is off); its
  // step() then starts after them.
  virtual int match_prefix(int seq, std::span<const int> tokens) {
    return kv_->match_prefix(seq, tokens);
  }
  // A new sequence holding everything seq holds, its pages shared until either writes into a
  // shared one (copied first): n > 1 samples of one prompt. Error when max_seqs() exist.
  virtual int fork_sequence(int seq) { return kv_->fork(seq); }
  PrefixStats prefix_stats() const { return kv_->stats(); }
  bool prefix_cache() const { return kv_->prefix_cache(); }

  // One step. Each sequence appears at most once; its tokens are valid ids; positions stay within
  // seq_ctx(); the total token count is <= max_step_tokens(); the pool has the pages (else Error,
  // and no sequence has changed). Results in the order of `batch`.
  virtual std::vector<SeqResult> step(std::span<const SeqStep> batch) = 0;

 protected:
  // Shared argument checks for step(): throws Error naming the problem.
  void check_step(std::span<const SeqStep> batch) const;
  // The pool's bookkeeping, made by the implementation's constructor.
  std::unique_ptr<KvPages> kv_;
};

// Throws Error for an unknown kind, "cuda" without a GPU or CUDA support, or options out of range.
std::unique_ptr<BatchBackend> make_batch_backend(const Model& m, const BatchOptions& opt);
std::unique_ptr<BatchBackend> make_cpu_batch_backend(const Model& m, const BatchOptions& opt);
#if defined(SMOLRT_HAVE_CUDA)
std::unique_ptr<BatchBackend> make_cuda_batch_backend(const Model& m, const BatchOptions& opt);
#endif

}  // namespace smolrt
