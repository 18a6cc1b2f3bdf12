// Structured-output cost on the host, one thread, the real SmolLM2 vocabulary (49,152 tokens):
// a 10-field JSON schema (strings, bounded integer, number, boolean, enum, array, nullable
// string, date). Validates first (every walk's text is JSON and ends complete), then reports:
//   - vocabulary trie build and schema compile time,
//   - cold masks: the first mask of each automaton configuration (a trie walk), mean and max,
//     and the worst case alone (inside a string: almost every token allowed),
//   - warm steps: replaying the recorded walks, accept_token + mask_id per token (every
//     configuration cached: a key and a hash lookup), and the random walk's tokens/s,
//   - a 256-sequence engine step: every sequence accepts its token and gets its mask id.
//
//   build/bench_grammar [--walks N] [--tokenizer tokenizer.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/paths.h"
#include "grammar/json_schema.h"
#include "grammar_walk.h"

namespace fs = std::filesystem;
using namespace smolrt;

namespace {

double cpu_now() {  // this thread's CPU seconds: other processes on the machine do not count
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
  "email": {"type": "string"}, "city": {"type": "string"},
  "country": {"type": "string", "enum": ["US", "UK", "FR", "DE", "JP", "other"]},
  "score": {"type": "number"}, "verified": {"type": "boolean"},
  "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
  "manager": {"type": ["string", "null"]}, "joined": {"type": "string", "format": "date"}},
  "required": ["name", "age", "email", "city", "country", "score", "verified", "tags", "manager",
               "joined"], "additionalProperties": false})";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int walks = 64;
  fs::path tok_path = fixtures_dir() / "tokenizers/smollm2-135m/tokenizer.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--walks") {
      walks = std::max(1, std::atoi(argv[i + 1]));
    } else if (a == "--tokenizer") {
      tok_path = argv[i + 1];
    } else {
      std::fprintf(stderr, "bench_grammar: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (!fs::exists(tok_path)) {
    std::fprintf(stderr, "bench_grammar: skipped: %s not found; set SMOLRT_FIXTURES\n",
                 tok_path.c_str());
    return 0;
  }
  try {
    const Tokenizer tok(vocab_from_hf_json(tok_path.string()));
    double t = cpu_now();
    const auto vocab = std::make_shared<const grammar::TokenVocab>(tok);
    const double vocab_ms = 1e3 * (cpu_now() - t);
    const auto schema = grammar::parse_schema_text(kSchema);
    std::vector<double> compile_ms;
    std::shared_ptr<const grammar::CompiledGrammar> g;
    for (int i = 0; i < 10; ++i) {
      t = cpu_now();
      g = grammar::compile(grammar::json_schema_grammar(schema), vocab);
      compile_ms.push_back(1e3 * (cpu_now() - t));
    }

    // Cold: the walks on a fresh grammar, timing the masks that are computed (cache misses).
    std::vector<std::vector<int>> seqs(static_cast<size_t>(walks));
    std::vector<double> cold_us;
    size_t tokens = 0;
    for (int w = 0; w < walks; ++w) {
      std::mt19937 rng(static_cast<unsigned>(w));
      grammar::GrammarMatcher m(g);
      for (int step = 0; !m.is_done(); ++step) {
        const size_t before = g->cached_configs();
        t = cpu_now();
        m.mask_id();
        const double us = 1e6 * (cpu_now() - t);
        if (g->cached_configs() > before) cold_us.push_back(us);
        const int id = test::walk_token(m, tok, rng, step < 40);
        if (!m.accept_token(id)) throw Error("bench_grammar: a walk token was rejected");
        seqs[static_cast<size_t>(w)].push_back(id);
        if (vocab->is_eog(id)) break;
      }
      if (!m.is_done()) throw Error("bench_grammar: a walk did not finish");
      std::string text;
      for (int id : seqs[static_cast<size_t>(w)])
        if (!vocab->is_eog(id)) text += vocab->token_bytes(id);
      if (!nlohmann::json::accept(text))
        throw Error("bench_grammar: a walk's text is not JSON: " + text);
      tokens += seqs[static_cast<size_t>(w)].size();
    }
    // The worst cold case on its own: inside a string, in a grammar with an empty cache.
    std::vector<double> string_us;
    for (int i = 0; i < 10; ++i) {
      const auto fresh = grammar::compile(grammar::json_schema_grammar(schema), vocab);
      grammar::GrammarMatcher m(fresh);
      if (!m.accept_text("{\"name\": \"Ada")) throw Error("bench_grammar: prefix rejected");
      t = cpu_now();
      m.mask_id();
      string_us.push_back(1e6 * (cpu_now() - t));
    }

    // json_object mode (a recursive grammar: the stack holds the nesting), inside a string.
    std::vector<double> object_us;
    for (int i = 0; i < 10; ++i) {
      const auto fresh = grammar::compile(grammar::json_object_grammar(), vocab);
      grammar::GrammarMatcher m(fresh);
      if (!m.accept_text("{\"a\": [{\"b\": \"x")) throw Error("bench_grammar: prefix rejected");
      t = cpu_now();
      m.mask_id();
      object_us.push_back(1e6 * (cpu_now() - t));
    }

    // Warm: replay the recorded walks (every configuration cached).
    std::vector<double> warm_us;
    for (int rep = 0; rep < 7; ++rep) {
      t = cpu_now();
      for (const auto& seq : seqs) {
        grammar::GrammarMatcher m(g);
        for (int id : seq) {
          if (m.mask_id() < 0 || !m.accept_token(id)) throw Error("bench_grammar: replay failed");
        }
      }
      warm_us.push_back(1e6 * (cpu_now() - t) / static_cast<double>(tokens));
    }

    // A 256-sequence engine step: each sequence accepts its next token and gets its mask id.
    constexpr int kBatch = 256;
    std::vector<grammar::GrammarMatcher> batch(kBatch, grammar::GrammarMatcher(g));
    std::vector<size_t> pos(kBatch, 0);
    size_t longest = 0;
    for (const auto& s : seqs) longest = std::max(longest, s.size());
    t = cpu_now();
    int steps = 0;
    for (size_t step = 0; step < longest; ++step, ++steps) {
      for (int b = 0; b < kBatch; ++b) {
        const auto& seq = seqs[static_cast<size_t>(b % walks)];
        if (pos[b] >= seq.size()) continue;
        batch[b].mask_id();
        batch[b].accept_token(seq[pos[b]++]);
      }
    }
    const double batch_us = 1e6 * (cpu_now() - t) / steps;

    std::printf(
        "grammar bench, SmolLM2 vocab (%d tokens, %zu trie nodes), 10-field schema, 1 thread (CPU "
        "time)\n",
        vocab->n_vocab(), vocab->trie().n_nodes());
    std::printf(
        "  vocab trie build: %.1f ms; schema compile: median %.2f ms (%d automaton states)\n",
        vocab_ms, median(compile_ms), g->n_states());
    std::printf("  %d walks, %zu tokens: %zu configurations, %d distinct masks\n", walks, tokens,
                g->cached_configs(), vocab->n_masks());
    std::printf(
        "  cold mask (first time per configuration): mean %.0f us, median %.0f us, max %.0f us "
        "(%zu)\n",
        [&] {
          double s = 0;
          for (double x : cold_us) s += x;
          return s / static_cast<double>(cold_us.size());
        }(),
        median(cold_us), *std::max_element(cold_us.begin(), cold_us.end()), cold_us.size());
    std::printf(
        "  cold mask inside a string (worst case): median %.0f us; json_object mode, nested 3 "
        "deep: %.0f us\n",
        median(string_us), median(object_us));
    std::printf(
        "  warm step (accept_token + mask_id): median %.2f us/token over 7 replays (%.2f M "
        "tokens/s)\n",
        median(warm_us), 1.0 / median(warm_us));
    std::printf("  256-sequence engine step, warm: %.1f us (%.2f us per sequence)\n", batch_us,
                batch_us / kBatch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_grammar: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
