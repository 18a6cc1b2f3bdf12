// bench_prefill: batched-prefill speed on a SmolLM-135M-shaped model with random Q4_0 weights
// (30 layers, dim 576, 9/3 heads, ffn 1536, Q8_0 tied 49152-row lm_head), plus the time of each of
// a layer's five launches.
//
// Timing: CUDA events around CUDA-graph replays of the whole prefill (launch gaps as in a
// graph-driven backend) after warm-up; median, min and max of --reps runs. Output: a table on
// stdout and one JSON object per line in --json FILE.
//
//   bench_prefill [--reps N] [--json FILE] [--tokens 1,7,32,128,512]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/prefill_model.h"
#include "core/cuda_check.h"
#include "cuda/attention_prefill.h"
#include "cuda/gemm.h"
#include "event_timing.h"

using namespace smolrt;
using namespace smolrt::cuda;
using smolrt::bench::time_ms;

namespace {

std::vector<uint8_t> random_blocks(size_t n_blocks, size_t block_bytes, uint32_t seed,
                                   float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  std::vector<uint8_t> out(n_blocks * block_bytes);
  for (size_t b = 0; b < n_blocks; ++b) {
    uint8_t* p = out.data() + b * block_bytes;
    const uint16_t d = f32_to_fp16(ud(rng) * scale * ((rng() & 1) ? 1.f : -1.f));
    std::memcpy(p, &d, 2);
    for (size_t i = 2; i < block_bytes; ++i) p[i] = (uint8_t)(rng() & 0xff);
  }
  return out;
}

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

int main(int argc, char** argv) try {
  int reps = 50;
  std::string json;
  std::vector<int> tokens_list = {1, 7, 8, 16, 32, 64, 100, 128, 256, 512};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      json = argv[++i];
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc)
      tokens_list = parse_list(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_prefill [--reps N] [--json FILE] [--tokens a,b,c]\n");
      return 2;
    }
  }
  FILE* jf = json.empty() ? nullptr : std::fopen(json.c_str(), "w");
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  // --- model ---------------------------------------------------------------------------------
  ModelConfig c;
  c.arch = "llama", c.dim = 576, c.n_layers = 30, c.n_heads = 9, c.n_kv_heads = 3;
  c.head_dim = 64, c.hidden_dim = 1536, c.vocab_size = 49152, c.n_ctx_train = 2048;
  c.rope_dim = 64, c.rope_base = 10000.f, c.tied_output = true;
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(300);
  std::vector<std::vector<float>> norms;
  norms.reserve(100);
  uint32_t seed = 1;
  auto q4 = [&](const char* name, int rows, int cols) {
    keep.push_back(random_blocks((size_t)rows * cols / 32, 18, seed++, 0.05f / 24.f));
    return TensorView{name, GgmlType::Q4_0, rows, cols, keep.back().data(), keep.back().size()};
  };
  auto nrm = [&](const char* name) {
    norms.emplace_back(c.dim, 1.0f);
    return TensorView{name, GgmlType::F32, 1, c.dim, norms.back().data(), (size_t)c.dim * 4};
  };
  Weights w;
  keep.push_back(random_blocks((size_t)c.vocab_size * c.dim / 32, 34, seed++, 0.002f));
  w.token_embd = {"token_embd.weight", GgmlType::Q8_0,    c.vocab_size, c.dim,
                  keep.back().data(),  keep.back().size()};
  w.output = w.token_embd;
  w.output_norm = nrm("output_norm.weight");
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights L;
    L.attn_norm = nrm("attn_norm"), L.ffn_norm = nrm("ffn_norm");
    L.wq = q4("attn_q", 576, 576), L.wk = q4("attn_k", 192, 576), L.wv = q4("attn_v", 192, 576);
    L.wo = q4("attn_output", 576, 576);
    L.w_gate = q4("ffn_gate", 1536, 576), L.w_up = q4("ffn_up", 1536, 576);
    L.w_down = q4("ffn_down", 576, 1536);
    w.layers.push_back(L);
  }
  const int max_t = *std::max_element(tokens_list.begin(), tokens_list.end());
  PrefillModel pm(c, w, std::max(2048, max_t), /*kv_half=*/true);
  StepWorkspace ws;
  ws.reserve(c, max_t, max_t);
  {
    std::vector<int> toks(max_t);
    std::mt19937 rng(5);
    for (int& t : toks) t = (int)(rng() % c.vocab_size);
    CUDA_CHECK(cudaMemcpy(ws.tokens, toks.data(), sizeof(int) * max_t, cudaMemcpyHostToDevice));
  }
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // --- per-kernel breakdown of one layer inside the prefill (layer 0) ----------------
  {
    const StepWeights& pw = pm.weights();
    const StepLayerWeights& L = pw.layers[0];
    std::printf("\n%5s %9s %9s %9s %9s %9s %9s  (us per launch, 20 back-to-back)\n", "T",
                "qkv_rope", "attn", "wo_acc", "gu_silu", "down_acc", "act_f16");
    for (int T : tokens_list) {
      constexpr int kBack = 20;
      GemmArgs a;
      a.t = T, a.eps = 1e-5f;
      a.w0 = L.wq, a.w1 = L.wk, a.w2 = L.wv, a.x = ws.x, a.ldx = 576, a.norm_w = L.attn_norm;
      GemmOut oq;
      oq.y = ws.q, oq.ldy = 576, oq.q_dim = 576, oq.kv_dim = 192, oq.head_dim = 64;
      oq.rope_dim = 64, oq.rope_base = 10000.f, oq.pos0 = 0, oq.k_cache = L.k_cache;
      oq.v_cache = L.v_cache, oq.kv_half = true;
      auto rep = [&](auto&& f) {
        return time_ms(
                   [&] {
                     for (int r = 0; r < kBack; ++r) f();
                   },
                   reps, s)
                   .median *
               1e3 / kBack;
      };
      CUDA_CHECK(cudaMemset(ws.x, 0x3c, sizeof(float) * (size_t)T * 576));
      // Large chunks run the GEMMs on fp16 inputs as step_forward does (act_to_f16 timed apart).
      const bool h = T >= kGemmF16MinTokens;
      double t_cvt = 0;
      if (h) {
        t_cvt = rep([&] { act_to_f16(ws.x, 576, T, 576, L.attn_norm, 1e-5f, ws.xh, ws.ldh(), s); });
        a.xh = ws.xh, a.ldh = ws.ldh(), a.norm_w = nullptr;
      }
      const double t_qkv = rep([&] { gemm(a, GemmEpilogue::QkvRope, oq, s); });
      AttentionPrefillArgs at;
      at.q = ws.q, at.ldq = 576, at.k_cache = L.k_cache, at.v_cache = L.v_cache, at.kv_half = true;
      at.out = ws.att, at.ldo = 576, at.n_tokens = T, at.start = 0, at.n_heads = 9;
      at.n_kv_heads = 3, at.head_dim = 64;
      const double t_att = rep([&] { attention_prefill(at, s); });
      GemmArgs b;
      b.t = T, b.w0 = L.wo, b.x = ws.att, b.ldx = 576;
      if (h) b.xh = ws.xh, b.ldh = ws.ldh();
      GemmOut orr;
      orr.y = ws.x, orr.ldy = 576;
      const double t_wo = rep([&] { gemm(b, GemmEpilogue::Accumulate, orr, s); });
      GemmArgs g = a;
      g.w0 = L.w_gate, g.w1 = L.w_up, g.norm_w = h ? nullptr : L.ffn_norm;
      // fp16 output from kDownF16MinTokens on: the down GEMM's input, as in step_forward
      const bool down_f16 = h || T >= kDownF16MinTokens;
      GemmOut og;
      og.y = ws.ffh, og.ldy = 1536;
      if (down_f16) og.yh = ws.hh, og.ldyh = ws.ldh();
      const double t_gu = rep([&] { gemm(g, GemmEpilogue::GatePair, og, s); });
      GemmArgs d;
      d.t = T, d.w0 = L.w_down, d.x = ws.ffh, d.ldx = 1536;
      if (down_f16) d.xh = ws.hh, d.ldh = ws.ldh();
      const double t_dn = rep([&] { gemm(d, GemmEpilogue::Accumulate, orr, s); });
      std::printf("%5d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", T, t_qkv, t_att, t_wo, t_gu, t_dn,
                  t_cvt);
      if (jf)
        std::fprintf(jf,
                     "{\"bench\":\"layer_kernels\",\"tokens\":%d,\"qkv_us\":%.3f,\"attn_us\":%.3f,"
                     "\"wo_us\":%.3f,\"gate_up_us\":%.3f,\"down_us\":%.3f,\"act_f16_us\":%.3f}\n",
                     T, t_qkv, t_att, t_wo, t_gu, t_dn, t_cvt);
    }
  }

  // --- whole prefill
  // ------------------------------------------------------------------------------
  std::printf("\n%5s %10s %10s %10s %12s %10s %10s\n", "T", "med_ms", "min_ms", "max_ms", "tok/s",
              "nograph_ms", "TF/s");
  const double flop_tok = 2.0 * c.n_layers *
                          ((double)c.dim * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * c.dim +
                           3.0 * c.dim * c.hidden_dim);
  for (int T : tokens_list) {
    // Plain launches.
    const Stat plain = time_ms([&] { step_forward(pm.weights(), ws, T, 0, 1, s); }, reps, s);
    // Graph of the same launches.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    step_forward(pm.weights(), ws, T, 0, 1, s);  // warm statics before capture
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    step_forward(pm.weights(), ws, T, 0, 1, s);
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const Stat g = time_ms([&] { CUDA_CHECK(cudaGraphLaunch(exec, s)); }, reps, s, 5);
    const double med = g.median;
    const double tflops = flop_tok * T / (med * 1e-3) / 1e12;
    std::printf("%5d %10.4f %10.4f %10.4f %12.0f %10.4f %10.2f\n", T, med, g.min, g.max,
                T / (med * 1e-3), plain.median, tflops);
    if (jf)
      std::fprintf(jf,
                   "{\"bench\":\"prefill\",\"device\":\"%s\",\"tokens\":%d,\"median_ms\":%.5f,"
                   "\"min_ms\":%.5f,\"max_ms\":%.5f,\"tok_per_s\":%.0f,\"nograph_median_ms\":%.5f,"
                   "\"layer_tflops\":%.3f,\"reps\":%d}\n",
                   prop.name, T, med, g.min, g.max, T / (med * 1e-3), plain.median, tflops, reps);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
  }
  if (jf) std::fclose(jf);
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_prefill: %s\n", e.what());
  return 1;
}
