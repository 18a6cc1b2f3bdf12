// `smolrt bench-gemm` (hidden): where the dense fp16 path (cuBLASLt on fp16 weight copies,
// cuda/dense_gemm.h) beats the quantized GEMM (cuda/gemm.h), on a real model file's shapes and
// formats.
//
// For each row count T: the whole layer stack of step_forward (logit_rows 0) on the quantized
// GEMM and on the dense path, as CUDA-graph replays (median of --reps), and each dense GEMM of
// layer 0 plus the lm_head alone with its achieved TFLOPS. Output: a table on stdout, one JSON
// object per line in --json FILE.
//
//   smolrt bench-gemm -m model.gguf [--rows 8,16,32,64,128,256,512] [--reps N] [--json FILE]
#if defined(SMOLRT_HAVE_CUDA)
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "app/command.h"
#include "backend/cuda/prefill_model.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/dense_gemm.h"
#include "model/model.h"

namespace smolrt::app {
namespace {

using namespace smolrt::cuda;

struct Opts {
  std::string model, json;
  std::vector<int> rows = {8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024};
  int reps = 20;
};

// Median of reps timed runs of f (after warm-up), CUDA events, ms.
template <class F>
double median_ms(F&& f, int reps, cudaStream_t s) {
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms(reps);
  for (float& m : ms) {
    CUDA_CHECK(cudaEventRecord(e0, s));
    f();
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Median ms of graph replays of f's launches on s.
template <class F>
double graph_ms(F&& f, int reps, cudaStream_t s) {
  f();  // first-use setup (cuBLASLt plans, kernel attributes) outside the capture
  CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t e;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  f();
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  const double ms = median_ms([&] { CUDA_CHECK(cudaGraphLaunch(e, s)); }, reps, s);
  CUDA_CHECK(cudaGraphExecDestroy(e));
  CUDA_CHECK(cudaGraphDestroy(g));
  return ms;
}

int run(const Opts& o) {
  const int reps = std::max(1, o.reps);
  const std::string model = resolve_model_path(o.model);
  const std::vector<int>& rows_list = o.rows;
  if (rows_list.empty()) fail("--rows: give at least one row count");
  for (int r : rows_list)
    if (r < 1 || r > 8192) fail("--rows ", r, " is out of range: give 1..8192");
  const std::string& json = o.json;
  FILE* jf = json.empty() ? nullptr : std::fopen(json.c_str(), "a");
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const Model m = load_model(model);
  const ModelConfig& c = m.config;
  const int max_t = *std::max_element(rows_list.begin(), rows_list.end());
  PrefillModel pm(c, m.weights, max_t + 8, /*kv_half=*/true, /*dense=*/true);
  StepWorkspace ws;
  ws.reserve_dense(c, max_t, max_t);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::string name = model.substr(model.find_last_of('/') + 1);
  const int measured = measure_dense_rows(pm.weights(), ws, max_t, s);
  std::printf("device: %s; model %s (%s, dim %d, hidden %d, %d layers); measured threshold %d\n",
              prop.name, name.c_str(), type_name(m.weights.layers[0].w_gate.type), c.dim,
              c.hidden_dim, c.n_layers, measured);
  const double qd = c.q_dim(), kv = c.kv_dim(), dim = c.dim, hid = c.hidden_dim;
  const double layer_flop_row = 2.0 * (dim * (qd + 2 * kv) + qd * dim + 3.0 * dim * hid);
  std::printf("%6s %10s %10s %8s | dense GEMM TFLOPS: %7s %7s %7s %7s %7s\n", "rows", "quant_ms",
              "dense_ms", "speedup", "qkv", "o", "gate_up", "down", "lm_head");
  for (int T : rows_list) {
    StepWeights wq = pm.weights(), wd = pm.weights();
    wq.dense_rows = INT_MAX;  // always the quantized GEMM
    wd.dense_rows = 1;        // always the dense path
    // Embedding skipped (token_embd set: step_forward would embed; the rows of ws.x are reused).
    wq.token_embd = wd.token_embd = DevMat{};
    // Activations of realistic magnitude, not zeros (they would time faster than real data).
    CUDA_CHECK(cudaMemset(ws.x, 0x3c, sizeof(float) * (size_t)T * c.dim));
    const double tq = graph_ms([&] { step_forward(wq, ws, T, 0, 0, s); }, reps, s);
    const double td = graph_ms([&] { step_forward(wd, ws, T, 0, 0, s); }, reps, s);
    const DenseLayer& D = pm.weights().layers[0].dense;
    auto tflops = [&](const uint16_t* w, int rows, int cols) {
      const double ms = graph_ms(
          [&] {
            ws.dense().run(w, rows, cols, ws.xd, ws.ldd(), T, {ws.qkv, rows, false, false}, s);
          },
          reps, s);
      return 2.0 * rows * cols * T / (ms * 1e-3) / 1e12;
    };
    // ws.qkv has room for q_dim + 2 kv_dim columns per row: the lm_head's output goes to logits.
    const double f_qkv = tflops(D.qkv, c.q_dim() + 2 * c.kv_dim(), c.dim);
    const double f_o = tflops(D.o, c.dim, c.q_dim());
    const double f_down = tflops(D.down, c.dim, c.hidden_dim);
    const double ms_gu = graph_ms(
        [&] {
          ws.dense().run(D.gate_up, 2 * c.hidden_dim, c.dim, ws.xd, ws.ldd(), T,
                         {ws.gu, 2 * c.hidden_dim, true, false}, s);
        },
        reps, s);
    const double f_gu = 2.0 * 2 * c.hidden_dim * c.dim * T / (ms_gu * 1e-3) / 1e12;
    double f_head = 0;
    if (c.vocab_size % 4 == 0) {
      const double ms_h = graph_ms(
          [&] {
            ws.dense().run(pm.weights().dense_output, c.vocab_size, c.dim, ws.xd, ws.ldd(), T,
                           {ws.logits, c.vocab_size, false, false}, s);
          },
          reps, s);
      f_head = 2.0 * c.vocab_size * c.dim * T / (ms_h * 1e-3) / 1e12;
    }
    std::printf("%6d %10.4f %10.4f %8.2f | %25.1f %7.1f %7.1f %7.1f %7.1f\n", T, tq, td, tq / td,
                f_qkv, f_o, f_gu, f_down, f_head);
    if (jf)
      std::fprintf(jf,
                   "{\"bench\":\"gemm_paths\",\"device\":\"%s\",\"model\":\"%s\",\"rows\":%d,"
                   "\"quant_ms\":%.5f,\"dense_ms\":%.5f,\"layers_tflops_dense\":%.2f,"
                   "\"tflops\":{\"qkv\":%.1f,\"o\":%.1f,\"gate_up\":%.1f,\"down\":%.1f,"
                   "\"lm_head\":%.1f},\"reps\":%d}\n",
                   prop.name, name.c_str(), T, tq, td, layer_flop_row * c.n_layers * T / (td * 1e9),
                   f_qkv, f_o, f_gu, f_down, f_head, reps);
  }
  if (jf) std::fclose(jf);
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}

REGISTER_COMMAND(Command{
    "bench-gemm", "dense vs quantized GEMM crossover (developer tool)", 992,
    [](CLI::App& sub) -> std::function<int()> {
      auto o = std::make_shared<Opts>();
      sub.group("");  // hidden from --help
      sub.add_option("-m,--model", o->model, "GGUF model");
      sub.add_option("--rows", o->rows, "row counts, comma-separated")->delimiter(',');
      sub.add_option("--reps", o->reps, "timed repetitions");
      sub.add_option("--json", o->json, "append JSON lines here");
      return [o] { return run(*o); };
    }});

}  // namespace
}  // namespace smolrt::app
#endif
