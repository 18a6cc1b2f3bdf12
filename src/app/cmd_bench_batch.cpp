// `smolrt bench-batch` (hidden): the multi-sequence engine alone, without HTTP. For each batch
// size C: C sequences with distinct ~100-token prompts are prefilled in shared steps (at most
// max-step tokens each, a prompt cut where a step is full), then decode together for --gen tokens
// (greedy). Reports the decode steps' generated tok/s in total and per step, and the prefill tok/s;
// the serving benchmark (scripts/bench_serve.py) measures the same engine behind the server.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "app/backend_flags.h"
#include "app/command.h"
#include "backend/batch.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/mix64.h"
#include "model/model.h"
#include "runtime/bench.h"

namespace smolrt::app {
namespace {

struct Opts {
  std::string model;
  std::string backend = "auto";
  std::string json;
  std::string sizes = "1,8,64,256";
  int prompt = 100;
  int gen = 128;
  bool kv_half = true;
  bool f16_weights = true;
  int max_step_tokens = BatchOptions{}.max_step_tokens;
  int dense_rows = 0;
  int page_size = BatchOptions{}.page_size;
  int ctx = 0;
  int kv_size = 0;
  bool prefix_cache = true;
  bool match = false;
  int shared_prefix = 0;
  int chunks = 0;
};

double secs(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(const Opts& o) {
  std::vector<int> sizes;
  {
    std::stringstream ss(o.sizes);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      int c = 0;
      try {
        c = std::stoi(tok);
      } catch (const std::exception&) {
      }
      if (c <= 0) fail("--sizes '", o.sizes, "' must be a comma list of positive counts");
      sizes.push_back(c);
    }
  }
  if (o.prompt <= 0 || o.gen <= 0) fail("--prompt and --gen must be positive");
  if (o.shared_prefix >= o.prompt)
    fail("--shared-prefix ", o.shared_prefix, " must be below --prompt ", o.prompt);
  if (o.chunks > 0 && o.shared_prefix == 0) fail("--chunks needs --shared-prefix");
  Model m = load_model(resolve_model_path(o.model));
  BatchOptions bo;
  bo.kind = o.backend;
  bo.max_seqs = *std::max_element(sizes.begin(), sizes.end()) + o.chunks;
  bo.seq_ctx = o.ctx > 0 ? o.ctx : o.prompt + o.gen + 1;
  if (bo.seq_ctx < o.prompt + o.gen + 1) fail("--ctx ", o.ctx, " is below --prompt + --gen + 1");
  bo.kv_tokens = o.kv_size > 0 ? o.kv_size : bo.max_seqs * (o.prompt + o.gen + 1 + o.page_size);
  bo.page_size = o.page_size;
  bo.prefix_cache = o.prefix_cache;
  bo.kv_half = o.kv_half;
  bo.f16_weights = o.f16_weights;
  bo.max_step_tokens = o.max_step_tokens;
  bo.dense_rows = o.dense_rows;
  auto b = make_batch_backend(m, bo);
  std::ofstream js;
  if (!o.json.empty()) js.open(o.json, std::ios::app);
  std::printf("%s on %s, prompt %d, gen %d%s, fp16 dense GEMMs from %d rows (0: none)\n",
              b->name().c_str(), b->device_name().c_str(), o.prompt, o.gen,
              o.kv_half ? ", fp16 KV" : ", fp32 KV", b->dense_rows());
  std::printf("%6s %14s %12s %16s\n", "C", "decode tok/s", "ms/step", "prefill tok/s");
  const int V = m.config.vocab_size;
  // Prompt k: the shared prefix, then tokens of its own, each a hash of (k, position): prompts of
  // different k share no whole KV page past the prefix, whatever the vocabulary's size.
  auto prompt_of = [&](int64_t k) {
    std::vector<int> p(size_t(o.prompt));
    for (int i = 0; i < o.prompt; ++i) {
      const uint64_t key = i < o.shared_prefix ? ~uint64_t(0) : uint64_t(k);
      p[i] = 1 + static_cast<int>(mix64(mix64(key) ^ uint64_t(i)) % uint64_t(V - 1));
    }
    return p;
  };
  // Warm-up rounds, then the measured one: three rounds of the measured round's shapes (the CUDA
  // engine records a step shape's graph at its third step), after, with a shared prefix, a first
  // round that computes it (the later ones find it in the cache).
  const int reps = o.shared_prefix > 0 ? 5 : 4;
  for (int rep = 0; rep < reps; ++rep) {
    for (int C : sizes) {
      std::vector<int> ids(C);
      std::vector<std::vector<int>> prompts(C);
      for (int s = 0; s < C; ++s) {
        ids[s] = b->add_sequence();
        // With a shared prefix the rest differs between the rounds too: the measured round finds
        // the prefix in the cache, not its own tokens.
        prompts[s] = prompt_of(o.shared_prefix > 0 ? s + rep * C : s);
      }
      // What the prefix cache holds of each prompt (the warm-up's pages), as the server looks up.
      std::vector<int> done(C, 0);
      if (o.match || o.shared_prefix > 0)
        for (int s = 0; s < C; ++s) done[s] = b->match_prefix(ids[s], prompts[s]);
      std::vector<int> last(C);
      const auto t0 = std::chrono::steady_clock::now();
      // The prompts in steps of at most max_step_tokens, a prompt cut where a step is full (as
      // the server's scheduler chunks them); a sequence samples when its last chunk runs.
      std::vector<int> at(done);
      for (int s0 = 0; s0 < C;) {
        std::vector<SeqStep> st;
        std::vector<int> who;
        for (int s = s0, used = 0; s < C && used < b->max_step_tokens(); ++s) {
          const int n = std::min(o.prompt - at[s], b->max_step_tokens() - used);
          SeqStep x;
          x.seq = ids[s], x.params.temp = 0.f;
          x.tokens = std::span<const int>(prompts[s]).subspan(size_t(at[s]), size_t(n));
          x.sample = at[s] + n == o.prompt;
          st.push_back(x);
          who.push_back(s);
          used += n;
        }
        const auto r = b->step(st);
        for (size_t i = 0; i < st.size(); ++i) {
          at[who[i]] += (int)st[i].tokens.size();
          if (st[i].sample) last[who[i]] = r[i].token;
        }
        while (s0 < C && at[s0] == o.prompt) ++s0;
      }
      const double pre_s = secs(t0);
      const auto t1 = std::chrono::steady_clock::now();
      // Prompt numbers of --chunks arrivals: new each round, past every sequence's.
      int64_t fresh = (int64_t(1) << 40) + (int64_t(rep) << 32);
      int64_t arr_hits = 0;  // their tokens the prefix cache held
      for (int g = 1; g < o.gen; ++g) {
        std::vector<SeqStep> st(C);
        for (int s = 0; s < C; ++s) {
          st[s].seq = ids[s], st[s].tokens = std::span<const int>(&last[s], 1);
          st[s].params.temp = 0.f;
        }
        // --chunks: arrivals whose prompts hit the cached prefix, their rest in this step (as
        // a served step carries new requests beside the decodes), then ended.
        std::vector<std::vector<int>> arr(size_t(o.chunks));
        std::vector<int> arr_ids;
        for (auto& p : arr) {
          p = prompt_of(fresh++);
          const int id = b->add_sequence();
          const int hit = b->match_prefix(id, p);
          arr_hits += hit;
          arr_ids.push_back(id);
          SeqStep x;
          x.seq = id, x.params.temp = 0.f;
          x.tokens = std::span<const int>(p).subspan(size_t(hit));
          st.push_back(x);
        }
        const auto r = b->step(st);
        for (int s = 0; s < C; ++s) last[s] = r[s].token;
        for (int id : arr_ids) b->free_sequence(id);
      }
      const double dec_s = secs(t1);
      for (int id : ids) b->free_sequence(id);
      if (rep < reps - 1) continue;
      const double tps = double(C) * (o.gen - 1) / dec_s;
      const double ms = 1e3 * dec_s / (o.gen - 1);
      // Prompt tokens computed (those found in the prefix cache were not).
      int64_t computed = 0;
      for (int d : done) computed += o.prompt - d;
      const double pps = double(computed) / pre_s;
      std::printf("%6d %14.0f %12.3f %16.0f\n", C, tps, ms, pps);
      if (js)
        js << nlohmann::json{{"bench", "batch"},
                             {"device", b->device_name()},
                             {"backend", b->name()},
                             {"commit", build_commit()},
                             {"date", utc_now()},
                             {"model", o.model},
                             {"C", C},
                             {"prompt", o.prompt},
                             {"gen", o.gen},
                             {"page_size", o.page_size},
                             {"seq_ctx", b->seq_ctx()},
                             {"kv_tokens", b->kv_tokens()},
                             {"prefix_cache", b->prefix_cache()},
                             {"match", o.match},
                             {"shared_prefix", o.shared_prefix},
                             {"chunks", o.chunks},
                             {"chunk_cached_tokens",
                              o.chunks > 0 ? double(arr_hits) / (double(o.chunks) * (o.gen - 1))
                                           : 0.0},
                             {"dense_rows", b->dense_rows()},
                             {"kv_half", o.kv_half},
                             {"f16_weights", o.f16_weights},
                             {"max_step_tokens", b->max_step_tokens()},
                             {"decode_tok_s", tps},
                             {"ms_per_step", ms},
                             {"prefill_tok_s", pps}}
                  .dump()
           << "\n";
    }
  }
  return 0;
}

REGISTER_COMMAND(Command{
    "bench-batch", "multi-sequence engine benchmark (developer tool)", 991,
    [](CLI::App& sub) -> std::function<int()> {
      auto o = std::make_shared<Opts>();
      sub.group("");  // hidden from --help
      sub.add_option("-m,--model", o->model, "GGUF model");
      add_backend_kind_flag(sub, o->backend);
      sub.add_option("--sizes", o->sizes, "batch sizes, comma-separated");
      sub.add_option("--prompt", o->prompt, "prompt tokens per sequence");
      sub.add_option("--gen", o->gen, "generated tokens per sequence");
      add_kv_type_flag(sub, o->kv_half);
      sub.add_option("--max-step-tokens", o->max_step_tokens,
                     "tokens one step carries at most; 0 = the backend's default (CPU " +
                         std::to_string(kCpuStepTokens) + ", CUDA " +
                         std::to_string(kCudaStepTokens) + ")")
          ->check(CLI::NonNegativeNumber);
      add_f16_weights_flag(sub, o->f16_weights);
      sub.add_option("--dense-rows", o->dense_rows,
                     "steps of this many rows or more take the fp16 dense GEMMs (0: measured)")
          ->check(CLI::NonNegativeNumber);
      sub.add_option("--page-size", o->page_size, "tokens per KV page")->capture_default_str();
      sub.add_option("--ctx", o->ctx, "positions per sequence (0: prompt + gen + 1)")
          ->check(CLI::NonNegativeNumber);
      sub.add_option("--kv-size", o->kv_size, "KV pool tokens (0: what the sequences need)")
          ->check(CLI::NonNegativeNumber);
      sub.add_flag("!--no-prefix-cache", o->prefix_cache, "keep no pages of freed sequences");
      sub.add_flag("--match", o->match,
                   "look each prompt up in the prefix cache first (the measured round then finds "
                   "the warm-up's pages)");
      sub.add_option("--shared-prefix", o->shared_prefix,
                     "every prompt starts with the same N tokens, looked up in the prefix cache "
                     "(the rest differs per sequence and round): a shared system prompt")
          ->check(CLI::NonNegativeNumber);
      sub.add_option("--chunks", o->chunks,
                     "with --shared-prefix: each decode step also carries this many new prompts "
                     "(the cached prefix, then their own tokens), ended after it: the steps a "
                     "server runs as requests arrive")
          ->check(CLI::NonNegativeNumber);
      sub.add_option("--json", o->json, "append JSON lines here");
      return [o] { return run(*o); };
    }});

}  // namespace
}  // namespace smolrt::app
