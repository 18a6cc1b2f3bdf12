// `smolrt run`: load a model, generate from a prompt, stream the text to stdout and the speeds
// to stderr (or print one JSON object with --json).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/backend_flags.h"
#include "app/command.h"
#include "app/sampling_flags.h"
#include "backend/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace smolrt::app {

namespace {

struct RunArgs {
  std::string model;
  std::string prompt;
  int n_predict = 64;
  BackendOptions backend;  // --backend, --ctx, --threads (app/backend_flags.h)
  bool json = false;
  SamplingParams sampling;  // llama.cpp defaults (app/sampling_flags.h); --temp 0 = greedy
  std::vector<std::string> stops;
};

int run_main(const RunArgs& a) {
  if (a.n_predict < 0)
    fail("-n ", a.n_predict, " is invalid: give the number of tokens to generate (>= 0)");

  validate(a.sampling);  // before loading anything: a bad flag is reported at once
  const std::string path = resolve_model_path(a.model);
  const Model model = load_model(path);
  const Tokenizer tok(vocab_from_gguf(*model.file));
  std::unique_ptr<Backend> be = make_backend(model, a.backend);

  Generator gen(*be, tok);
  const std::vector<int> prompt_ids = gen.tokenize_prompt(a.prompt);
  GenerateOptions go;
  go.max_tokens = a.n_predict;
  go.stops = a.stops;
  // Greedy without penalties keeps the plain argmax path (on the GPU for CUDA); anything else
  // samples through the Backend seam with seeded host draws.
  TokenSampler sampler(a.sampling);
  if (!a.sampling.greedy() || a.sampling.has_penalties()) go.token_sampler = &sampler;
  std::function<void(std::string_view)> on_text;
  if (!a.json) {
    on_text = [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    };
  }
  const GenerateResult r = gen.generate(prompt_ids, go, on_text);
  if (!a.json) {
    std::fputc('\n', stdout);
    std::fflush(stdout);  // the stats line on stderr must not land inside the text
  }
  std::fprintf(stderr,
               "smolrt run: %s backend, prefill %zu tokens in %.1f ms (%.1f tok/s), decode %d "
               "tokens in %.1f ms (%.1f tok/s), stop: %s, %s\n",
               be->name().c_str(), r.prompt_ids.size(), r.prefill_s * 1e3, r.prefill_tok_s(),
               r.n_decode_steps, r.decode_s * 1e3, r.decode_tok_s(), stop_reason_name(r.stop),
               a.sampling.greedy() ? "greedy" : cat("seed ", sampler.seed()).c_str());
  if (a.json) {
    nlohmann::json j;
    j["model"] = path;
    j["backend"] = be->name();
    j["prompt_ids"] = r.prompt_ids;
    j["generated_ids"] = r.generated_ids;
    j["text"] = r.text;
    j["stop_reason"] = stop_reason_name(r.stop);
    j["seed"] = sampler.seed();
    j["temp"] = a.sampling.temp;
    j["prefill_ms"] = r.prefill_s * 1e3;
    j["prefill_tok_s"] = r.prefill_tok_s();
    j["decode_steps"] = r.n_decode_steps;
    j["decode_ms"] = r.decode_s * 1e3;
    j["decode_tok_s"] = r.decode_tok_s();
    // Text cut at a token boundary may hold invalid UTF-8: replace it rather than throw.
    const std::string out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", out.c_str());
  }
  return 0;
}

REGISTER_COMMAND(Command{
    "run", "Generate text from a prompt", 10, [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<RunArgs>();
      sub.add_option("-m,--model", a->model, "GGUF model file (default: the cached SmolLM2-135M)");
      sub.add_option("-p,--prompt", a->prompt,
                     "Prompt text; special tokens like <|im_start|> are parsed. Empty: start "
                     "from BOS alone (an error when the vocabulary has no BOS)");
      sub.add_option("-n,--n-predict", a->n_predict, "Tokens to generate at most")
          ->capture_default_str();
      add_backend_flags(sub, a->backend);
      add_sampling_flags(sub, a->sampling, a->stops);
      sub.add_flag("--json", a->json,
                   "Print one JSON object with ids, text and timings at the end");
      return [a] { return run_main(*a); };
    }});

}  // namespace

}  // namespace smolrt::app
