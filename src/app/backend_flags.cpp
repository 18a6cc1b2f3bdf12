#include "app/backend_flags.h"

#include <string>

namespace smolrt::app {
namespace {

// A count >= 0, else an error naming the value and the fix (CLI11 prefixes the flag).
CLI::Validator non_negative(const std::string& fix) {
  return CLI::Validator(
      [fix](std::string& v) -> std::string {
        try {
          size_t used = 0;
          if (std::stoll(v, &used) >= 0 && used == v.size()) return {};
        } catch (const std::exception&) {
        }
        return "'" + v + "' is invalid: " + fix;
      },
      "INT>=0");
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
}

}  // namespace smolrt::app
