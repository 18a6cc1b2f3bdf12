// `smolrt logits`: a developer command that runs a prompt (token ids or text) through a backend and
// prints the ids and the raw logits, for oracles outside the engine (tests/oracle/f64_reference.py)
// and for comparing backends by hand. With --json one object:
//   {"model", "backend", "vocab_size", "ids": [...], "positions": [...], "logits": [[...], ...]}
// where logits[i] is the vocab_size row of position positions[i]: only the last position unless
// --all-positions. Values are printed so that they parse back to the same float.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "app/backend_flags.h"
#include "app/command.h"
#include "backend/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace smolrt::app {

namespace {

struct LogitsArgs {
  std::string model;
  std::string ids;  // "1,2,3"
  std::string prompt;
  BackendOptions backend;  // --backend, --ctx, --threads
  bool all_positions = false;
  bool json = false;
};

// "1, 2,3" -> {1, 2, 3}. Every id must be a decimal integer in [0, vocab_size).
std::vector<int> parse_ids(const std::string& s, int vocab_size) {
  std::vector<int> ids;
  size_t i = 0;
  size_t index = 0;
  while (i <= s.size()) {
    const size_t comma = std::min(s.find(',', i), s.size());
    std::string item = s.substr(i, comma - i);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) {
      fail("--ids '", s, "': item ", index,
           " is empty; give comma-separated token ids like --ids 1,2,3");
    }
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE || item[0] == '+') {
      fail("--ids '", s, "': '", item,
           "' is not a token id; give comma-separated integers like --ids 1,2,3");
    }
    if (v < 0 || v >= vocab_size) {
      fail("--ids: token id ", v, " is out of range; this model's vocabulary has ", vocab_size,
           " tokens (valid ids 0..", vocab_size - 1, ")");
    }
    ids.push_back(static_cast<int>(v));
    i = comma + 1;
    ++index;
  }
  return ids;
}

std::string fmt_float(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));  // 9 digits: exact round trip
  return buf;
}

int logits_main(LogitsArgs a, bool ids_given, bool prompt_given) {
  if (!ids_given && !prompt_given) {
    fail("give the input as token ids (--ids 1,2,3) or as text (-p \"...\")");
  }
  if (prompt_given && a.prompt.empty()) {
    fail(
        "the prompt given with -p is empty; pass some text, or token ids with --ids (e.g. the "
        "BOS id)");
  }
  if (ids_given && a.ids.find_first_not_of(" \t") == std::string::npos) {
    fail("--ids is empty; give comma-separated token ids like --ids 1,2,3");
  }
  const std::string path = resolve_model_path(a.model);
  const Model model = load_model(path);
  const int vocab = model.config.vocab_size;
  std::vector<int> ids;
  if (ids_given) {
    ids = parse_ids(a.ids, vocab);
  } else {
    const Tokenizer tok(vocab_from_gguf(*model.file));
    ids = tok.encode(a.prompt, /*parse_special=*/true, /*add_bos=*/-1);
    if (ids.empty()) fail("the prompt '", a.prompt, "' tokenizes to no tokens");
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  const int train = model.config.n_ctx_train;
  if (a.backend.n_ctx == 0) {
    if (train > 0 && n > train) {
      fail("the input has ", n, " tokens but the model's training context is ", train,
           " tokens; pass fewer ids or a shorter prompt");
    }
    a.backend.n_ctx = static_cast<int>(n);  // the KV cache holds exactly the input
  }
  // A developer's comparison tool: without a GPU the default is the oracle, not the fast path.
  if (a.backend.kind == "auto" &&
      resolve_backend("auto", BackendKind::CpuRef) == BackendKind::CpuRef)
    a.backend.kind = "cpu-ref";
  std::unique_ptr<Backend> be = make_backend(model, a.backend);

  std::vector<float> rows;
  std::vector<int64_t> positions;
  if (a.all_positions) {
    rows = be->forward_prompt_all(ids);
    for (int64_t p = 0; p < n; ++p) positions.push_back(p);
  } else {
    const std::span<const float> last = be->forward_prompt(ids);
    rows.assign(last.begin(), last.end());
    positions.push_back(n - 1);
  }
  if (rows.size() != positions.size() * static_cast<size_t>(vocab)) {
    fail("the ", be->name(), " backend returned ", rows.size(), " logits for ", positions.size(),
         " positions of ", vocab);
  }

  if (a.json) {
    // Built by hand: a vocab_size row per position can be millions of numbers, and %.9g keeps
    // each one exact and short. NaN and infinities (invalid JSON numbers) are printed as null.
    nlohmann::json head;
    head["model"] = path;
    head["backend"] = be->name();
    head["vocab_size"] = vocab;
    head["ids"] = ids;
    head["positions"] = positions;
    std::string out = head.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out.pop_back();  // the closing brace
    out += ",\"logits\":[";
    for (size_t r = 0; r < positions.size(); ++r) {
      out += r ? ",[" : "[";
      for (int v = 0; v < vocab; ++v) {
        const float x = rows[r * vocab + v];
        if (v) out += ',';
        out += std::isfinite(x) ? fmt_float(x) : "null";
      }
      out += ']';
    }
    out += "]}\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  // Text: the ids, then each position's five largest logits.
  std::printf("ids:");
  for (int id : ids) std::printf(" %d", id);
  std::printf("\n");
  for (size_t r = 0; r < positions.size(); ++r) {
    const float* row = rows.data() + r * vocab;
    std::vector<int> order(vocab);
    for (int v = 0; v < vocab; ++v) order[v] = v;
    const int k = std::min(5, vocab);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int x, int y) {
      return row[x] > row[y] || (row[x] == row[y] && x < y);
    });
    std::printf("position %lld (token %d): top", static_cast<long long>(positions[r]),
                ids[static_cast<size_t>(positions[r])]);
    for (int i = 0; i < k; ++i) std::printf(" %d:%s", order[i], fmt_float(row[order[i]]).c_str());
    std::printf("\n");
  }
  return 0;
}

REGISTER_COMMAND(Command{
    "logits", "Print the logits of a prompt, ids or text (developer tool)", 980,
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<LogitsArgs>();
      sub.add_option("-m,--model", a->model, "GGUF model file (default: the cached SmolLM2-135M)");
      auto* ids = sub.add_option("--ids", a->ids, "Comma-separated token ids, e.g. 1,2,3");
      auto* prompt = sub.add_option("-p,--prompt", a->prompt,
                                    "Text, tokenized as `smolrt run` does (special tokens parsed, "
                                    "BOS as the vocabulary asks)")
                         ->excludes(ids);
      add_backend_flags(sub, a->backend);
      sub.get_option("--backend")
          ->description(
              "cpu | cpu-ref | cuda | auto (cuda when a GPU is present, else cpu-ref: the fp32 "
              "oracle)");
      sub.get_option("--ctx")->description(
          "KV cache size in tokens (0 = exactly the input's length)");
      sub.add_flag("--all-positions", a->all_positions,
                   "Logits for every position, not only the last");
      sub.add_flag("--json", a->json,
                   "Print {\"ids\", \"positions\", \"logits\": [[vocab_size floats], ...], ...}");
      return [a, ids, prompt] { return logits_main(*a, ids->count() > 0, prompt->count() > 0); };
    }});

}  // namespace

}  // namespace smolrt::app
