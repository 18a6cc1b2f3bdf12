#include "app/backend_flags.h"

#include <climits>
#include <string>

#include "app/flag_checks.h"

namespace smolrt::app {
namespace {

CLI::Validator non_negative(const std::string& fix) {
  return int_range(0, INT_MAX, fix);
}

}  // namespace

CLI::Option* add_backend_kind_flag(CLI::App& sub, std::string& kind) {
  return sub
      .add_option("--backend", kind,
                  "cpu (int8 SIMD kernels) | cpu-ref (the fp32 oracle) | cuda | auto (cuda when a "
                  "GPU is present, else cpu)")
      ->check(CLI::IsMember({"cpu", "cpu-ref", "cuda", "auto"}))
      ->capture_default_str();
}

void add_backend_flags(CLI::App& sub, BackendOptions& o) {
  add_backend_kind_flag(sub, o.kind);
  sub.add_option("--ctx", o.n_ctx, "KV cache size in tokens (0 = the model's training context)")
      ->check(non_negative("give a positive context size (0 = the model's)"))
      ->capture_default_str();
  sub.add_option("--threads", o.n_threads, "CPU threads (0 = the physical cores)")
      ->check(non_negative("give a count >= 0 (0 = all cores)"))
      ->capture_default_str();
  add_kv_type_flag(sub, o.kv_half);
  add_f16_weights_flag(sub, o.f16_weights);
}

void add_kv_type_flag(CLI::App& sub, bool& kv_half) {
  sub.add_option_function<std::string>(
         "--kv-type", [&kv_half](const std::string& v) { kv_half = v == "f16"; },
         "KV cache element type (CUDA): f16 | f32 (f32: the exact mode, for comparisons with the "
         "CPU)")
      ->check(CLI::IsMember({"f16", "f32"}))
      ->default_str("f16");
}

void add_f16_weights_flag(CLI::App& sub, bool& f16_weights) {
  sub.add_flag_callback(
      "--no-f16-weights", [&f16_weights] { f16_weights = false; },
      "CUDA: keep no fp16 copy of the weights (saves 2 bytes per weight of GPU memory; prompts "
      "and batches of many rows then run on the slower quantized GEMM)");
}

}  // namespace smolrt::app
