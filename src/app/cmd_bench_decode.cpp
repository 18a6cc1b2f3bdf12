// `smolrt bench-decode` (hidden): batch-1 CUDA decode speed of one model under each switch of the
// CUDA engine (graph, PDL, speculation), with the load time and the device's measured copy
// bandwidth. One JSON line per configuration (--json), a table on stdout.
#if defined(SMOLRT_HAVE_CUDA)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/command.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/single_sequence.h"
#include "core/build_info.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/bench.h"

namespace smolrt::app {
namespace {

struct Opts {
  std::string model;
  std::string json;
  int tokens = 128;
  int reps = 5;
  int ctx = 1024;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int run(const Opts& o) {
  const auto t0 = std::chrono::steady_clock::now();
  Model m = load_model(resolve_model_path(o.model));
  const double load_ms = ms_since(t0);
  BackendOptions bo;
  bo.kind = "cuda";
  bo.n_ctx = std::min(o.ctx, m.config.n_ctx_train > 0 ? m.config.n_ctx_train : o.ctx);
  if (o.tokens + 2 > bo.n_ctx) fail("--tokens ", o.tokens, " does not fit --ctx ", bo.n_ctx);
  const size_t wbytes = decode_weight_bytes(m);
  struct Cfg {
    const char* name;
    CudaOptions opt;  // each names only what differs from the defaults
  };
  const Cfg cfgs[] = {
      {"graph+pdl (default)", CudaOptions{}},
      {"graph+pdl no-speculate", CudaOptions{.speculate = false}},
      {"graph", CudaOptions{.pdl = false}},
      {"plain", CudaOptions{.use_graph = false, .pdl = false}},
  };

  std::ofstream js;
  if (!o.json.empty()) js.open(o.json, std::ios::app);
  std::printf("%-27s %10s %10s %10s %12s %9s\n", "config", "tok/s", "min", "max", "us/token",
              "GB/s");
  double copy_gbs = 0;
  for (const Cfg& c : cfgs) {
    auto b = make_cuda_backend_ex(m, single_sequence_options(bo), c.opt);
    if (copy_gbs == 0) {
      copy_gbs = b->copy_bandwidth_gbs();
      std::printf("device %s, copy bandwidth %.0f GB/s; load %.1f ms (%.2f MiB read per token)\n",
                  b->device_name().c_str(), copy_gbs, load_ms, wbytes / 1048576.0);
    }
    std::vector<double> tps;
    int first = 0;
    for (int r = 0; r <= o.reps; ++r) {  // r == 0: warm-up (graph capture)
      b->reset();
      int tok = b->forward_token_greedy(1, 0);
      first = tok;
      const auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.tokens; ++i) tok = b->forward_token_greedy(tok, b->position());
      const double s = ms_since(t1) / 1000.0;
      if (r > 0) tps.push_back(o.tokens / s);
    }
    const Stat s = stat_of(tps);
    const double us = 1e6 / s.median;
    const double gbs = wbytes / (us * 1e-6) / 1e9;
    std::printf("%-27s %10.1f %10.1f %10.1f %12.2f %9.0f\n", c.name, s.median, s.min, s.max, us,
                gbs);
    if (js) {
      nlohmann::json j = {{"bench", "decode"},
                          {"config", c.name},
                          {"device", b->device_name()},
                          {"commit", build_commit()},
                          {"date", utc_now()},
                          {"model", o.model},
                          {"tokens", o.tokens},
                          {"reps", o.reps},
                          {"tok_s", s.median},
                          {"tok_s_min", s.min},
                          {"tok_s_max", s.max},
                          {"us_per_token", us},
                          {"weight_bytes_per_token", wbytes},
                          {"weight_gb_s", gbs},
                          {"copy_gb_s", copy_gbs},
                          {"pct_of_copy_bw", 100.0 * gbs / copy_gbs},
                          {"load_ms", load_ms},
                          {"first_token", first}};
      js << j.dump() << "\n";
    }
  }
  return 0;
}

REGISTER_COMMAND(Command{"bench-decode", "CUDA batch-1 decode benchmark (developer tool)", 990,
                         [](CLI::App& sub) -> std::function<int()> {
                           auto o = std::make_shared<Opts>();
                           sub.group("");  // hidden from --help
                           sub.add_option("-m,--model", o->model, "GGUF model");
                           sub.add_option("-n,--tokens", o->tokens, "decoded tokens per rep");
                           sub.add_option("--reps", o->reps, "timed repetitions");
                           sub.add_option("--ctx", o->ctx, "KV capacity");
                           sub.add_option("--json", o->json, "append JSON lines here");
                           return [o] { return run(*o); };
                         }});

}  // namespace
}  // namespace smolrt::app
#endif
