#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace smolrt::server {

namespace {

prometheus::Counter& counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}
prometheus::Gauge& gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Histogram& histogram(prometheus::Registry& r, const std::string& name,
                                 const std::string& help,
                                 prometheus::Histogram::BucketBoundaries b) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(b));
}

// Latency buckets in seconds, 100 us to 60 s (a small model's step takes a fraction of a ms).
prometheus::Histogram::BucketBoundaries latency_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}
prometheus::Histogram::BucketBoundaries size_buckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
}

}  // namespace

Metrics::Metrics() : reg_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *reg_;
  requests_ = &prometheus::BuildCounter()
                   .Name("smolrt_requests_total")
                   .Help("HTTP requests by endpoint and status code")
                   .Register(r);
  timeouts_ = &prometheus::BuildCounter()
                   .Name("smolrt_http_timeouts_total")
                   .Help("HTTP connections closed by a deadline, by phase (header, body, write)")
                   .Register(r);
  connections_ = &gauge(r, "smolrt_http_connections", "Open HTTP connections");
  rejected_ = &counter(r, "smolrt_http_connections_rejected_total",
                       "HTTP connections refused past --max-connections");
  prompt_tokens_ = &counter(r, "smolrt_prompt_tokens_total", "Prompt tokens of admitted requests");
  cached_tokens_ = &counter(r, "smolrt_prompt_cached_tokens_total",
                            "Prompt tokens whose KV pages came from the prefix cache");
  prefix_hit_ = &gauge(r, "smolrt_prefix_cache_hit_ratio",
                       "Prompt tokens found in the prefix cache over those looked up, 0..1");
  generated_tokens_ = &counter(r, "smolrt_generation_tokens_total", "Generated tokens");
  preemptions_ =
      &counter(r, "smolrt_preemptions_total", "Sequences preempted (freed, recomputed later)");
  steps_ = &counter(r, "smolrt_steps_total", "Backend steps");
  steps_ahead_ = &counter(r, "smolrt_steps_ahead_total",
                          "Decode steps the backend launched before the previous step's token was "
                          "read (speculated), then used");
  graph_captures_ = &counter(r, "smolrt_step_graph_captures_total",
                             "Step graphs the backend recorded (one per new step shape; the step "
                             "that records one takes milliseconds longer)");
  shared_prefix_rows_ =
      &counter(r, "smolrt_shared_prefix_rows_total",
               "Step rows whose attention read a prefix their sequences share once "
               "for all of them (cascade attention)");
  running_ = &gauge(r, "smolrt_requests_running", "Requests holding a sequence");
  waiting_ = &gauge(r, "smolrt_requests_waiting", "Requests waiting for a sequence");
  kv_used_ = &gauge(r, "smolrt_kv_pages_used", "KV pool pages in use");
  kv_total_ = &gauge(r, "smolrt_kv_pages_total", "KV pool pages");
  kv_usage_ = &gauge(r, "smolrt_kv_usage_ratio", "KV pool use, 0..1");
  batch_seqs_ =
      &histogram(r, "smolrt_batch_sequences", "Sequences per backend step", size_buckets());
  batch_tokens_ = &histogram(r, "smolrt_batch_tokens", "Tokens per backend step", size_buckets());
  step_seconds_ = &histogram(r, "smolrt_step_seconds", "Backend step time", latency_buckets());
  ttft_ = &histogram(r, "smolrt_time_to_first_token_seconds",
                     "From arrival to the first generated token", latency_buckets());
  queue_ = &histogram(r, "smolrt_request_queue_seconds",
                      "From arrival to the request's first backend step", latency_buckets());
  prefill_ = &histogram(r, "smolrt_request_prefill_seconds",
                        "From the request's first backend step to its first generated token",
                        latency_buckets());
  itl_ = &histogram(r, "smolrt_inter_token_latency_seconds",
                    "Between consecutive generated tokens of a request", latency_buckets());
  e2e_ = &histogram(r, "smolrt_request_duration_seconds", "From arrival to the last token",
                    latency_buckets());
}

Metrics::~Metrics() = default;

void Metrics::request(const std::string& endpoint, int status) {
  requests_->Add({{"endpoint", endpoint}, {"status", std::to_string(status)}}).Increment();
}
void Metrics::prompt_tokens(int n) {
  prompt_tokens_->Increment(n);
}
void Metrics::generated_tokens(int n) {
  generated_tokens_->Increment(n);
}
void Metrics::preemption() {
  preemptions_->Increment();
}
void Metrics::step(int n_seqs, int n_tokens, double seconds) {
  steps_->Increment();
  batch_seqs_->Observe(n_seqs);
  batch_tokens_->Observe(n_tokens);
  step_seconds_->Observe(seconds);
}
void Metrics::time_to_first_token(double seconds) {
  ttft_->Observe(seconds);
}
void Metrics::queue_time(double seconds) {
  queue_->Observe(seconds);
}
void Metrics::prefill_time(double seconds) {
  prefill_->Observe(seconds);
}
void Metrics::inter_token_latency(double seconds) {
  itl_->Observe(seconds);
}
void Metrics::request_duration(double seconds) {
  e2e_->Observe(seconds);
}
void Metrics::queue(int running, int waiting) {
  running_->Set(running);
  waiting_->Set(waiting);
}
void Metrics::graph_captures(int n) {
  graph_captures_->Increment(n);
}
void Metrics::steps_ahead(int n) {
  steps_ahead_->Increment(n);
}
void Metrics::shared_prefix_rows(int n) {
  shared_prefix_rows_->Increment(n);
}
void Metrics::cached_tokens(int n) {
  cached_tokens_->Increment(n);
}

void Metrics::prefix_hit_ratio(double r) {
  prefix_hit_->Set(r);
}

void Metrics::kv_pages(int used, int total) {
  kv_used_->Set(used);
  kv_total_->Set(total);
  kv_usage_->Set(total > 0 ? static_cast<double>(used) / total : 0.0);
}

void Metrics::connections(int open) {
  connections_->Set(open);
}
void Metrics::connection_rejected() {
  rejected_->Increment();
}
void Metrics::http_timeout(const std::string& phase) {
  timeouts_->Add({{"phase", phase}}).Increment();
}

std::string Metrics::serialize() const {
  return prometheus::TextSerializer().Serialize(reg_->Collect());
}

}  // namespace smolrt::server
