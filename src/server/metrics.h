// The server's Prometheus metrics (prometheus-cpp core), rendered in the text exposition format
// by GET /metrics. Every method is thread-safe (prometheus-cpp's metrics are).
#pragma once

#include <memory>
#include <string>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace smolrt::server {

class Metrics {
 public:
  Metrics();
  ~Metrics();

  // One finished HTTP request: endpoint ("/v1/completions", ...) and status code.
  void request(const std::string& endpoint, int status);
  void prompt_tokens(int n);
  // Prefix cache: prompt tokens whose K/V were found cached; the pool's hit ratio so far (cached
  // over looked-up prompt tokens).
  void cached_tokens(int n);
  void prefix_hit_ratio(double r);
  void generated_tokens(int n);
  void preemption();
  void graph_captures(int n);  // step graphs recorded (BatchBackend::graph_captures)
  void steps_ahead(int n);  // steps the backend launched ahead and used (BatchBackend::steps_ahead)
  void shared_prefix_rows(int n);  // BatchBackend::shared_prefix_rows
  // One backend step: sequences and tokens it carried, and its wall time.
  void step(int n_seqs, int n_tokens, double seconds);
  void time_to_first_token(double seconds);
  // A request's time to first token in two: from arrival to its first step's start (waiting for a
  // sequence, the step in flight and the step budget), then to its first token (vLLM's queue and
  // prefill times).
  void queue_time(double seconds);
  void prefill_time(double seconds);
  void inter_token_latency(double seconds);
  void request_duration(double seconds);
  void queue(int running, int waiting);
  void kv_pages(int used, int total);
  // HTTP connections: open now; refused past --max-connections; closed by a deadline, by phase
  // ("header", "body": the request did not arrive in time; "write": a reader stalled).
  void connections(int open);
  void connection_rejected();
  void http_timeout(const std::string& phase);

  std::string serialize() const;  // text format 0.0.4

 private:
  std::shared_ptr<prometheus::Registry> reg_;
  prometheus::Family<prometheus::Counter>*requests_, *timeouts_;
  prometheus::Counter *prompt_tokens_, *generated_tokens_, *preemptions_, *steps_, *rejected_,
      *cached_tokens_, *steps_ahead_, *shared_prefix_rows_, *graph_captures_;
  prometheus::Gauge *running_, *waiting_, *kv_used_, *kv_total_, *kv_usage_, *connections_,
      *prefix_hit_;
  prometheus::Histogram *batch_seqs_, *batch_tokens_, *step_seconds_, *ttft_, *itl_, *e2e_, *queue_,
      *prefill_;
};

}  // namespace smolrt::server
