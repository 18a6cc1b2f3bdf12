// The Backend interface: what the generator, tests and benchmarks talk to. CpuBackend (the fast
// path or the fp32 oracle) and, on a GPU, one sequence of the CUDA engine (single_sequence.h)
// implement it, so every check runs on both and compares them.
//
// Positions: the KV cache holds positions [0, position()). forward_token(token, pos) needs
// 0 <= pos <= position() and pos < n_ctx(); it writes the KV entry at pos, attends to [0, pos]
// and leaves position() == pos + 1 (writing at pos < position() drops everything after it).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/sampling.h"
#include "model/model.h"

namespace smolrt {

struct Activation {
  std::string name;           // "blk.3.attn_out", "blk.3.ffn_out", "final_norm", "logits", ...
  std::vector<float> values;  // for the last token processed
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu" | "cpu-ref" | "cuda"
  virtual const ModelConfig& config() const = 0;
  virtual int n_ctx() const = 0;     // KV capacity in tokens
  virtual int position() const = 0;  // tokens currently in the KV cache

  virtual void reset() = 0;            // empty the KV cache
  virtual void rollback(int pos) = 0;  // keep positions [0, pos); Error if pos > position()

  // One token at `pos`; returns the vocab_size logits (valid until the next call).
  virtual std::span<const float> forward_token(int token, int pos) = 0;
  // Same step, returns argmax(logits) (ties -> lowest index, NaN never wins). The CUDA backend
  // runs argmax on the GPU and reads back 4 bytes.
  virtual int forward_token_greedy(int token, int pos);

  // Sampling steps: the same forward, then the token chosen by the pipeline of
  // backend/sampling.h from this step's logits with the uniform draw u in [0, 1) and the penalty
  // history (oldest first; the last p.repeat_last_n entries are used). The default runs
  // cpu::sample on the returned logits; the CUDA backend samples on the GPU and reads back only
  // the token id. The caller owns the PRNG (runtime/sampler.h) so every backend sees the same
  // draws for the same seed.
  virtual int forward_token_sample(int token, int pos, const SamplingParams& p, float u,
                                   std::span<const int> history);
  // forward_prompt(tokens), then sample from the last token's logits as above.
  virtual int forward_prompt_sample(std::span<const int> tokens, const SamplingParams& p, float u,
                                    std::span<const int> history);

  // All tokens, starting at position(); returns logits of the last token.
  virtual std::span<const float> forward_prompt(std::span<const int> tokens) = 0;
  // All tokens, starting at position(); logits for every position, row-major [n][vocab].
  virtual std::vector<float> forward_prompt_all(std::span<const int> tokens) = 0;

  // Where it runs, for benchmark records: "NVIDIA H100 80GB HBM3", or the CPU's model name.
  virtual std::string device_name() const { return "cpu"; }
  // Measured device-memory copy bandwidth in GB/s (bytes read + written per second; a large
  // device-to-device copy), measured once and cached; 0 when not measured.
  virtual double copy_bandwidth_gbs() { return 0.0; }

  // Debug: when enabled, each forward records named per-layer activations of the last token.
  virtual void set_debug(bool on) { debug_ = on; }
  virtual std::vector<Activation> activations() const { return {}; }

 protected:
  bool debug_ = false;
  // Shared argument checks: token in [0, vocab), pos in [0, position()] and < n_ctx().
  void check_token(int token) const;
  void check_pos(int pos) const;
};

struct BackendOptions {
  // "cpu" (the fast CPU path) | "cpu-ref" (the fp32 oracle) | "cuda" | "auto" (cuda when a GPU is
  // present, else cpu)
  std::string kind = "auto";
  int n_ctx = 0;      // 0: the model's training context
  int n_threads = 0;  // CPU backends: 0 = the physical cores this process may run on
  // CUDA: keep fp16 copies of the layer matrices (two bytes per weight more) so that batches of
  // many tokens run on cuBLASLt's tensor-core GEMMs (cuda/dense_gemm.h); false: every batch on the
  // quantized GEMM (less memory; slower prompts and served steps, more so for larger models).
  bool f16_weights = true;
  // CUDA: fp16 KV cache (BatchOptions::kv_half, as `serve` keeps it), else fp32 (--kv-type f32:
  // the exact mode the comparisons with the fp32 CPU oracle use).
  bool kv_half = true;
  // Rows from which prompt chunks take the dense GEMMs: 0 = measured at start-up
  // (cuda::measure_dense_rows); n > 0 forces n (tests).
  int dense_rows = 0;
};

enum class BackendKind { Cpu, CpuRef, Cuda };

// Resolves a backend kind ("cpu" | "cpu-ref" | "cuda" | "auto"). Throws Error for an unknown kind,
// "cuda" without a GPU or without CUDA support in this build; "auto" is Cuda when a GPU is present,
// else cpu_fallback (a CUDA build says on stderr that it falls back to the CPU).
BackendKind resolve_backend(const std::string& kind, BackendKind cpu_fallback = BackendKind::Cpu);

// Throws Error for an unknown kind, "cuda" without a GPU or without CUDA support in this build.
std::unique_ptr<Backend> make_backend(const Model& m, const BackendOptions& opt);
// The CPU backend opt.kind names: "cpu-ref" the oracle, "cpu" or "auto" the fast path.
std::unique_ptr<Backend> make_cpu_backend(const Model& m, const BackendOptions& opt);
#if defined(SMOLRT_HAVE_CUDA)
std::unique_ptr<Backend> make_cuda_backend(const Model& m, const BackendOptions& opt);
bool cuda_device_available();
#endif

}  // namespace smolrt
