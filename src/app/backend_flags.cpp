#include "app/backend_flags.h"

#include "core/error.h"

namespace smolrt::app {

void add_backend_flags(CLI::App& sub, BackendOptions& o) {
  sub.add_option("--backend", o.kind, "cpu | cuda | auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  sub.add_option("--ctx", o.n_ctx, "KV cache size in tokens (0 = the model's training context)")
      ->capture_default_str();
  sub.add_option("--threads", o.n_threads, "CPU threads (0 = all cores)")->capture_default_str();
}

void check_backend_flags(const BackendOptions& o) {
  if (o.n_ctx < 0)
    fail("--ctx ", o.n_ctx, " is invalid: give a positive context size (0 = the model's)");
  if (o.n_threads < 0)
    fail("--threads ", o.n_threads, " is invalid: give a count >= 0 (0 = all cores)");
}

}  // namespace smolrt::app
