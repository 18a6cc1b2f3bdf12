// smolrt synth --preset smollm-135m|smollm-360m|smollm2-360m|smollm2-1.7b|tiny|qwen2.5-0.5b|
//                       llama-3.2-1b|gemma3-270m|tiny-qwen2|tiny-llama3|tiny-gemma3
//              [--tokenizer tokenizer.json] [--type q4_0|q4_k_m|q6_k|...] [--seed N] -o out.gguf
#include <chrono>
#include <cstdio>

#include "app/command.h"
#include "core/error.h"
#include "model/quantize_model.h"
#include "model/synth.h"
#include "quant/format.h"

namespace smolrt::app {
namespace {

struct SynthArgs {
  std::string preset = "smollm-135m";
  std::string tokenizer;
  std::string type = "q4_0";
  uint64_t seed = 42;
  std::string out;
};

int run_synth(const SynthArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  SynthOptions o;
  o.preset = a.preset;
  o.tokenizer_json = a.tokenizer;
  o.type = parse_quant_target(a.type, "--type");
  o.seed = a.seed;
  synth_preset(o.preset);  // validate before any work
  SynthModel m = synth_model(o);
  const auto t1 = std::chrono::steady_clock::now();
  m.writer.write(a.out);  // atomic: writes a .tmp beside it, then renames
  const auto t2 = std::chrono::steady_clock::now();
  std::fprintf(stderr,
               "synth: wrote %s: preset %s, type %s, seed %llu, vocab %d, %llu tensors, "
               "%.2f M params, %.2f MiB of tensor data (%llu bytes); generate %.2f s, "
               "write %.2f s\n",
               a.out.c_str(), a.preset.c_str(), target_name(o.type).c_str(),
               (unsigned long long)a.seed, m.vocab_size, (unsigned long long)m.n_tensors,
               m.n_params / 1e6, m.tensor_bytes / 1048576.0, (unsigned long long)m.tensor_bytes,
               std::chrono::duration<double>(t1 - t0).count(),
               std::chrono::duration<double>(t2 - t1).count());
  return 0;
}

REGISTER_COMMAND(Command{
    "synth", "Write a GGUF (llama, qwen2, gemma3) with random weights and a real model's shapes",
    70, [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<SynthArgs>();
      sub.add_option(
             "-p,--preset", a->preset,
             "smollm-135m | smollm-360m (= smollm2-360m) | smollm2-360m | smollm2-1.7b | tiny | "
             "qwen2.5-0.5b | llama-3.2-1b | gemma3-270m | tiny-qwen2 | tiny-llama3 | tiny-gemma3")
          ->capture_default_str();
      sub.add_option("--tokenizer", a->tokenizer,
                     "Hugging Face tokenizer.json to embed (default: a built-in byte-level vocab)");
      sub.add_option(
             "-t,--type", a->type,
             "any `smolrt quantize --type`: " + format_names() + ", q4_k_s, q4_k_m, q5_k_s, q5_k_m")
          ->capture_default_str();
      sub.add_option("-s,--seed", a->seed, "random seed (same seed, same bytes)")
          ->capture_default_str();
      sub.add_option("-o,--output", a->out, "GGUF to write")->required();
      return [a] { return run_synth(*a); };
    }});

}  // namespace
}  // namespace smolrt::app
