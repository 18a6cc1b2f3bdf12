// smolrt quantize in.gguf out.gguf --type q4_0|q8_0|f16 : requantize a llama GGUF.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "app/command.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "model/quantize_model.h"

namespace smolrt::app {
namespace {

struct QuantizeArgs {
  std::string in, out, type;
  bool quiet = false;
};

int run_quantize(const QuantizeArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  const GgmlType target = parse_target_type(a.type, "--type");
  if (!std::filesystem::exists(a.in)) {
    fail("input file '", a.in,
         "' does not exist; pass the GGUF to requantize as the first argument");
  }
  std::error_code ec;
  if (std::filesystem::equivalent(a.in, a.out, ec)) {
    fail("output '", a.out, "' is the input file; choose a different output path");
  }
  auto in = gguf::File::open(a.in);
  const bool quiet = a.quiet;
  QuantizedModel q = quantize_model(*in, target, [quiet](const std::string& line) {
    if (!quiet || line.rfind("note:", 0) == 0) std::fprintf(stderr, "%s\n", line.c_str());
  });
  q.writer.write(a.out);  // atomic: writes a .tmp beside it, then renames
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "quantize: wrote %s: %llu tensors, %.2f M params, %.2f MiB of tensor data "
               "(%llu bytes), type %s, %zu f16 fallback(s), %.2f s\n",
               a.out.c_str(), (unsigned long long)q.n_tensors, q.n_params / 1e6,
               q.tensor_bytes / 1048576.0, (unsigned long long)q.tensor_bytes, type_name(target),
               q.fallbacks.size(), secs);
  return 0;
}

REGISTER_COMMAND(Command{
    "quantize", "Requantize a llama GGUF (q4_0 | q4_1 | q8_0 | f16 | bf16 | f32)", 60,
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<QuantizeArgs>();
      sub.add_option("input", a->in, "source GGUF (f32/f16/bf16/q4_0/q4_1/q8_0 tensors)")
          ->required();
      sub.add_option("output", a->out, "GGUF to write")->required();
      sub.add_option("-t,--type", a->type,
                     "target type of the weight matrices: q4_0 (embedding q8_0), q4_1, q8_0, "
                     "f16, bf16, f32")
          ->required();
      sub.add_flag("-q,--quiet", a->quiet, "no per-tensor progress (notes and summary remain)");
      return [a] { return run_quantize(*a); };
    }});

}  // namespace
}  // namespace smolrt::app
