// smolrt bench: prefill and decode speed per prompt length, as a table or JSON lines.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/backend_flags.h"
#include "app/command.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/paths.h"
#include "runtime/bench.h"

namespace smolrt::app {
namespace {

struct BenchArgs {
  std::string model;
  bool synthetic = false;
  std::vector<int> prompt_lengths = {32, 128, 512};
  int gen_length = 128;
  int iterations = 5;
  BackendOptions backend;  // --backend, --ctx, --threads (app/backend_flags.h)
  bool json = false;
};

nlohmann::json stat_json(const Stat& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

int run_bench_cmd(const BenchArgs& a) {
  std::string path;
  if (a.synthetic) {
    if (!a.model.empty()) fail("--synthetic and -m/--model exclude each other; give one");
    path = ensure_synthetic_model();
  } else if (!a.model.empty()) {
    path = resolve_model_path(a.model);
  } else if (std::filesystem::exists(default_model_path())) {
    path = default_model_path().string();
  } else {
    std::fprintf(stderr,
                 "smolrt bench: default model %s not found; benchmarking the synthetic "
                 "SmolLM-135M-shaped Q4_0 model instead (scripts/fetch_model.sh fetches the real "
                 "one)\n",
                 default_model_path().string().c_str());
    path = ensure_synthetic_model();
  }

  Model model = load_model(path);
  std::unique_ptr<Backend> be = make_backend(model, a.backend);
  BenchConfig cfg;
  cfg.prompt_lengths = a.prompt_lengths;
  cfg.gen_length = a.gen_length;
  cfg.iterations = a.iterations;
  const std::vector<BenchRow> rows = run_bench(*be, model, cfg);
  const double copy_bw = be->copy_bandwidth_gbs();

  if (a.json) {
    const std::string date = utc_now();
    for (const BenchRow& r : rows) {
      nlohmann::json j = {
          {"gpu", be->device_name()},
          {"backend", be->name()},
          {"f16_weights", a.backend.f16_weights},
          {"commit", build_commit()},
          {"date", date},
          {"model", std::filesystem::path(path).filename().string()},
          {"model_file_bytes", model.file->file_size()},
          {"decode_weight_bytes", decode_weight_bytes(model)},
          {"prompt_length", r.prompt_length},
          {"gen_length", r.gen_length},
          {"iterations", a.iterations},
          {"prefill_tok_s", stat_json(r.prefill_tok_s)},
          {"decode_tok_s", stat_json(r.decode_tok_s)},
          {"ttft_ms", stat_json(r.ttft_ms)},
          {"decode_us_per_token", stat_json(r.decode_us_per_token)},
          {"decode_weight_gb_s", r.decode_weight_gb_s},
          {"copy_bandwidth_gb_s", copy_bw},
      };
      std::printf("%s\n", j.dump().c_str());
    }
    return 0;
  }
  std::printf("model   %s (%.2f MiB)\nbackend %s on %s\n", path.c_str(),
              model.file->file_size() / 1048576.0, be->name().c_str(), be->device_name().c_str());
  if (copy_bw > 0) std::printf("device copy bandwidth %.0f GB/s (measured)\n", copy_bw);
  std::printf("%7s %5s | %26s | %26s | %9s | %8s | %8s\n", "prompt", "gen",
              "prefill tok/s med [min,max]", "decode tok/s med [min,max]", "TTFT ms", "us/token",
              "GB/s");
  for (const BenchRow& r : rows) {
    std::printf("%7d %5d | %10.0f [%6.0f,%6.0f] | %10.1f [%6.1f,%6.1f] | %9.2f | %8.1f | %8.0f",
                r.prompt_length, r.gen_length, r.prefill_tok_s.median, r.prefill_tok_s.min,
                r.prefill_tok_s.max, r.decode_tok_s.median, r.decode_tok_s.min, r.decode_tok_s.max,
                r.ttft_ms.median, r.decode_us_per_token.median, r.decode_weight_gb_s);
    if (copy_bw > 0) std::printf(" (%.0f%% of copy)", 100.0 * r.decode_weight_gb_s / copy_bw);
    std::printf("\n");
  }
  return 0;
}

REGISTER_COMMAND(Command{
    "bench", "Benchmark prefill and decode speed", 60, [](CLI::App& sub) {
      auto a = std::make_shared<BenchArgs>();
      sub.add_option("-m,--model", a->model, "GGUF model (default: the SmolLM2-135M Q4_0)");
      sub.add_flag("--synthetic", a->synthetic,
                   "benchmark the synthetic SmolLM-135M-shaped Q4_0 model (made once, cached)");
      sub.add_option("--prompt-lengths", a->prompt_lengths, "prompt lengths, comma separated")
          ->delimiter(',')
          ->check(CLI::Range(1, 1 << 24));
      sub.add_option("--gen-length", a->gen_length, "tokens to decode per run")
          ->check(CLI::Range(1, 1 << 24));
      sub.add_option("--iterations", a->iterations, "timed iterations (after three untimed ones)")
          ->check(CLI::Range(1, 1 << 24));
      add_backend_flags(sub, a->backend);
      sub.add_flag("--json", a->json, "one JSON object per prompt length (JSON lines)");
      return [a] { return run_bench_cmd(*a); };
    }});

}  // namespace
}  // namespace smolrt::app
