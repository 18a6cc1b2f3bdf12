#include "backend/backend.h"

#include <cstdio>

#include "backend/cpu/ops.h"
#include "backend/cpu/sample.h"
#include "core/error.h"

namespace smolrt {

int Backend::forward_token_greedy(int token, int pos) {
  std::span<const float> logits = forward_token(token, pos);
  return cpu::argmax(logits.data(), static_cast<int>(logits.size()));
}

int Backend::forward_token_sample(int token, int pos, const SamplingParams& p, float u,
                                  std::span<const int> history) {
  std::span<const float> logits = forward_token(token, pos);
  thread_local cpu::SampleScratch scratch;
  return cpu::sample(logits, p, u, history, scratch);
}

int Backend::forward_prompt_sample(std::span<const int> tokens, const SamplingParams& p, float u,
                                   std::span<const int> history) {
  std::span<const float> logits = forward_prompt(tokens);
  thread_local cpu::SampleScratch scratch;
  return cpu::sample(logits, p, u, history, scratch);
}

void Backend::check_token(int token) const {
  if (token < 0 || token >= config().vocab_size) {
    fail("token id ", token, " is out of range: the vocabulary has ", config().vocab_size,
         " tokens (valid ids 0..", config().vocab_size - 1, ")");
  }
}

void Backend::check_pos(int pos) const {
  if (pos < 0 || pos > position()) {
    fail("position ", pos, " is invalid: the KV cache holds ", position(),
         " tokens, so the next position must be in 0..", position());
  }
  if (pos >= n_ctx()) {
    fail("position ", pos, " is past the context of ", n_ctx(),
         " tokens; use a larger --ctx (up to the model's ", config().n_ctx_train,
         ") or a shorter prompt/generation");
  }
}

BackendKind resolve_backend(const std::string& kind, BackendKind cpu_fallback) {
  if (kind == "cpu") return BackendKind::Cpu;
  if (kind == "cpu-ref") return BackendKind::CpuRef;
  if (kind == "cuda") {
#if defined(SMOLRT_HAVE_CUDA)
    if (!cuda_device_available()) {
      fail("--backend cuda was asked for but no CUDA GPU is visible; use --backend cpu");
    }
    return BackendKind::Cuda;
#else
    fail(
        "--backend cuda was asked for but this build has no CUDA support; rebuild with nvcc "
        "present (cmake -DSMOLRT_CUDA=ON) or use --backend cpu");
#endif
  }
  if (kind == "auto") {
#if defined(SMOLRT_HAVE_CUDA)
    if (cuda_device_available()) return BackendKind::Cuda;
    std::fprintf(stderr, "smolrt: no CUDA GPU found, using the CPU backend\n");
#endif
    return cpu_fallback;
  }
  fail("unknown backend '", kind, "'; use cpu, cpu-ref, cuda or auto");
}

std::unique_ptr<Backend> make_backend(const Model& m, const BackendOptions& opt) {
  const BackendKind k = resolve_backend(opt.kind);
#if defined(SMOLRT_HAVE_CUDA)
  if (k == BackendKind::Cuda) return make_cuda_backend(m, opt);
#endif
  BackendOptions cpu = opt;
  cpu.kind = k == BackendKind::CpuRef ? "cpu-ref" : "cpu";
  return make_cpu_backend(m, cpu);
}

}  // namespace smolrt
