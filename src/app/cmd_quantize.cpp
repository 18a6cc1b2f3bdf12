// smolrt quantize in.gguf out.gguf --type q4_0|q4_k_m|... : requantize a llama GGUF.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "app/command.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "model/quantize_model.h"
#include "quant/format.h"

namespace smolrt::app {
namespace {

struct QuantizeArgs {
  std::string in, out, type;
  bool verbose = false;
};

int run_quantize(const QuantizeArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const QuantTarget target = parse_quant_target(a.type, "--type");
  if (!std::filesystem::exists(a.in)) {
    fail("input file '", a.in,
         "' does not exist; pass the GGUF to requantize as the first argument");
  }
  std::error_code ec;
  if (std::filesystem::equivalent(a.in, a.out, ec)) {
    fail("output '", a.out, "' is the input file; choose a different output path");
  }
  auto in = gguf::File::open(a.in);
  const bool verbose = a.verbose;
  QuantizedModel q = quantize_model(*in, target, [verbose](const std::string& line) {
    if (verbose) std::fprintf(stderr, "%s\n", line.c_str());
  });
  q.writer.write(a.out);  // atomic: writes a .tmp beside it, then renames
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string types;
  for (const auto& [t, n] : q.type_counts)
    types += cat(types.empty() ? "" : ", ", n, " ", type_name(t));
  std::fprintf(stderr,
               "quantize: wrote %s: %llu tensors, %.2f M params, %.2f MiB of tensor data "
               "(%llu bytes), type %s, %.2f s\n"
               "quantize: stored types: %s\n",
               a.out.c_str(), (unsigned long long)q.n_tensors, q.n_params / 1e6,
               q.tensor_bytes / 1048576.0, (unsigned long long)q.tensor_bytes,
               target_name(target).c_str(), secs, types.c_str());
  if (!q.fallbacks.empty()) {
    std::map<std::string, int> by_type;
    for (const auto& f : q.fallbacks) ++by_type[type_name(f.type)];
    std::string kinds;
    for (const auto& [t, n] : by_type) kinds += cat(kinds.empty() ? "" : ", ", n, " as ", t);
    std::fprintf(stderr,
                 "quantize: %zu tensor(s) kept another type, their row length not a multiple of "
                 "the target's block: %s%s\n",
                 q.fallbacks.size(), kinds.c_str(), verbose ? "" : " (-v lists them)");
  }
  return 0;
}

REGISTER_COMMAND(Command{
    "quantize", "Requantize a llama GGUF (q4_0 | q4_k_m | q5_k_m | q6_k | q8_0 | f16 | ...)", 60,
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<QuantizeArgs>();
      sub.add_option("input", a->in, "source GGUF (tensors of " + format_names() + ")")->required();
      sub.add_option("output", a->out, "GGUF to write")->required();
      sub.add_option("-t,--type", a->type,
                     "target: one format for every matrix, " + format_names() +
                         " (q4_1's embedding q8_0; the output/tied embedding q6_k or q8_0 for the "
                         "quantized ones), or llama.cpp's mixtures q4_k_s, q4_k_m, q5_k_s, q5_k_m")
          ->required();
      sub.add_flag("-v,--verbose", a->verbose,
                   "every tensor's conversion and each row-length fallback (default: a summary)");
      // Accepted for scripts written when the per-tensor lines were the default.
      sub.add_flag("-q,--quiet")->description("the default (kept for scripts)");
      return [a] { return run_quantize(*a); };
    }});

}  // namespace
}  // namespace smolrt::app
