// The serving scheduler's host cost per step, without a GPU: server::Scheduler (with its
// Prometheus metrics) over a backend whose step costs nothing, driven by C client threads that
// each submit requests (~100 prompt tokens, 128 generated, ignore_eos, greedy) and drain their
// Job as an HTTP handler does. What it prints is the time the scheduler thread spends per step
// and per generated token outside the backend: on the GPU that time is a bubble between steps,
// and a small model's decode step is short enough for it to matter.
//
//   build/bench_scheduler [--clients 1,8,64,256] [--requests 4] [--gen 128] [--step-us 1000]
// --step-us: how long each fake step sleeps (the GPU's share; excluded from the host time).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend/batch.h"
#include "backend/kv_pages.h"
#include "model/synth.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace {

using namespace smolrt;
using Clock = std::chrono::steady_clock;

// Every step returns token 3 + (position % 200): no arithmetic, no logits.
class NullBatch : public BatchBackend {
 public:
  NullBatch(int n_vocab, int max_seqs, int kv_tokens, int seq_ctx) {
    kv_ = std::make_unique<KvPages>(kv_tokens / 16, 16, max_seqs, seq_ctx);
    cfg_.vocab_size = n_vocab;
  }
  std::string name() const override { return "null"; }
  std::string device_name() const override { return "none"; }
  const ModelConfig& config() const override { return cfg_; }
  int max_step_tokens() const override { return 512; }
  std::vector<SeqResult> step(std::span<const SeqStep> batch) override {
    const auto t0 = Clock::now();
    if (step_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_us));
    std::vector<SeqResult> out(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      std::vector<PageCopy> copies;
      kv_->grow(batch[i].seq, batch[i].tokens, copies);
      out[i].token = 3 + kv_->position(batch[i].seq) % 200;
    }
    ++steps;
    in_step += std::chrono::duration<double>(Clock::now() - t0).count();
    return out;
  }
  int step_us = 0;  // what a step pretends to take (the GPU's time), so batches fill as they would
  long steps = 0;
  double in_step = 0;  // seconds inside step() (bookkeeping of the fake itself)

 private:
  ModelConfig cfg_;
};

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> clients = {1, 8, 64, 256};
  int requests = 4, gen = 128, step_us = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--clients")) {
      clients = parse_list(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--requests")) {
      requests = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--step-us")) {
      step_us = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--gen")) {
      gen = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--clients 1,8,64,256] [--requests N] [--gen N] [--step-us N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (clients.empty() || requests < 1 || gen < 1 || step_us < 0) {
    std::fprintf(stderr, "bench_scheduler: --clients, --requests and --gen must be positive\n");
    return 2;
  }
  const Tokenizer tok{builtin_byte_vocab()};
  std::printf("%8s %10s %12s %14s %14s %10s\n", "clients", "steps", "seqs/step", "host us/step",
              "host us/token", "tok/s");
  for (int c : clients) {
    if (c < 1) return 2;
    NullBatch be(tok.n_vocab(), c, c * 512, 512);
    be.step_us = step_us;
    server::Metrics metrics;
    long generated = 0;
    double wall = 0;
    {
      server::Scheduler sched(be, tok, &metrics);
      std::vector<std::thread> threads;
      std::atomic<long> n_gen{0};
      const auto t0 = Clock::now();
      for (int t = 0; t < c; ++t) {
        threads.emplace_back([&, t] {
          for (int r = 0; r < requests; ++r) {
            server::GenRequest req;
            for (int i = 0; i < 100; ++i) req.prompt.push_back(3 + (i * 7 + t * 13 + r) % 250);
            req.max_tokens = gen;
            req.ignore_eos = true;
            req.sampling.temp = 0;
            std::shared_ptr<server::Job> job;
            while (!(job = sched.submit(req)))
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            server::Delta d;
            while (!d.finished) job->take(d, std::chrono::milliseconds(100));
            n_gen += d.n_generated;
          }
        });
      }
      for (auto& th : threads) th.join();
      wall = std::chrono::duration<double>(Clock::now() - t0).count();
      generated = n_gen.load();
    }
    const double host = wall - be.in_step;
    std::printf("%8d %10ld %12.1f %14.1f %14.2f %10.0f\n", c, be.steps,
                double(generated) / be.steps, 1e6 * host / be.steps, 1e6 * host / generated,
                generated / wall);
  }
  return 0;
}
