// bench_prefill: batched-prefill speed on a SmolLM-135M-shaped model with random Q4_0 weights
// (30 layers, dim 576, 9/3 heads, ffn 1536, Q8_0 tied 49152-row lm_head), plus per-GEMM timings of
// both GEMM paths (Small SIMT vs TensorCore) to place the Auto crossover.
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

#include "core/cuda_check.h"
#include "cuda/attention_prefill.h"
#include "cuda/gemm_quant.h"
#include "cuda/prefill_model.h"

using namespace smolrt;
using namespace smolrt::cuda;

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

struct Stats {
  double med, min, max;
};

template <class F>
Stats time_ms(F&& body, int reps, cudaStream_t st) {
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) body();  // warm-up
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(e0, st));
    body();
    CUDA_CHECK(cudaEventRecord(e1, st));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float m = 0;
    CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
    ms.push_back(m);
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
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
  LlamaConfig c;
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
  PrefillWorkspace ws;
  ws.reserve(c, max_t, max_t);
  {
    std::vector<int> toks(max_t);
    std::mt19937 rng(5);
    for (int& t : toks) t = (int)(rng() % c.vocab_size);
    CUDA_CHECK(cudaMemcpy(ws.tokens, toks.data(), sizeof(int) * max_t, cudaMemcpyHostToDevice));
  }
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // --- per-GEMM paths ---------------------------------------------------------------------------
  struct G {
    const char* name;
    int n, k;
    GgmlType t;
  };
  const G gemms[] = {{"qkv", 960, 576, GgmlType::Q4_0},
                     {"wo", 576, 576, GgmlType::Q4_0},
                     {"gate_up", 3072, 576, GgmlType::Q4_0},
                     {"down", 576, 1536, GgmlType::Q4_0},
                     {"lm_head", 49152, 576, GgmlType::Q8_0}};
  std::printf("\n%-8s %5s %12s %12s %10s %10s\n", "gemm", "T", "small_us", "tc_us", "small_TF/s",
              "tc_TF/s");
  float* y = nullptr;
  CUDA_CHECK(cudaMalloc(&y, sizeof(float) * (size_t)max_t * 49152));
  for (const G& g : gemms) {
    const void* wp = g.t == GgmlType::Q8_0 ? pm.weights().output : nullptr;
    void* tmpw = nullptr;
    if (!wp) {
      const auto raw = random_blocks((size_t)g.n * g.k / 32, 18, seed++, 0.002f);
      CUDA_CHECK(cudaMalloc(&tmpw, raw.size()));
      CUDA_CHECK(cudaMemcpy(tmpw, raw.data(), raw.size(), cudaMemcpyHostToDevice));
      wp = tmpw;
    }
    for (int T : tokens_list) {
      if (g.t == GgmlType::Q8_0 && T > 128 && T != max_t) continue;
      GemmArgs a;
      a.w = wp, a.wtype = g.t, a.n = g.n, a.k = g.k, a.x = ws.ffh, a.ldx = g.k, a.t = T;
      GemmOut o;
      o.y = y, o.ldy = g.n;
      CUDA_CHECK(cudaMemset(ws.ffh, 0x3c, sizeof(float) * (size_t)T * g.k));  // 0.0115 each
      // 20 back-to-back launches per timed sample: kernel time, not host launch latency.
      constexpr int kBack = 20;
      Stats ss = time_ms(
          [&] {
            for (int r = 0; r < kBack; ++r)
              gemm_quant(a, GemmEpilogue::Store, o, s, GemmPath::Small);
          },
          reps, s);
      Stats st = time_ms(
          [&] {
            for (int r = 0; r < kBack; ++r)
              gemm_quant(a, GemmEpilogue::Store, o, s, GemmPath::TensorCore);
          },
          reps, s);
      ss.med /= kBack, st.med /= kBack;
      const double flop = 2.0 * g.n * g.k * T;
      std::printf("%-8s %5d %12.2f %12.2f %10.2f %10.2f\n", g.name, T, ss.med * 1e3, st.med * 1e3,
                  flop / ss.med / 1e9, flop / st.med / 1e9);
      if (jf)
        std::fprintf(jf,
                     "{\"bench\":\"gemm\",\"gemm\":\"%s\",\"n\":%d,\"k\":%d,\"tokens\":%d,"
                     "\"small_us\":%.3f,\"tc_us\":%.3f,\"small_tflops\":%.3f,\"tc_tflops\":%.3f}\n",
                     g.name, g.n, g.k, T, ss.med * 1e3, st.med * 1e3, flop / ss.med / 1e9,
                     flop / st.med / 1e9);
    }
    if (tmpw) CUDA_CHECK(cudaFree(tmpw));
  }
  CUDA_CHECK(cudaFree(y));

  // --- per-kernel breakdown of one layer inside the prefill (Auto paths, layer 0) ----------------
  {
    const PrefillWeights& pw = pm.weights();
    const PrefillLayerWeights& L = pw.layers[0];
    std::printf("\n%5s %9s %9s %9s %9s %9s  (us per launch, 20 back-to-back)\n", "T", "qkv_rope",
                "attn", "wo_acc", "gu_silu", "down_acc");
    for (int T : tokens_list) {
      constexpr int kBack = 20;
      GemmArgs a;
      a.t = T, a.eps = 1e-5f;
      a.w = L.w_qkv, a.n = 960, a.k = 576, a.x = ws.x, a.ldx = 576, a.norm_w = L.attn_norm;
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
                   .med *
               1e3 / kBack;
      };
      CUDA_CHECK(cudaMemset(ws.x, 0x3c, sizeof(float) * (size_t)T * 576));
      const double t_qkv = rep([&] { gemm_quant(a, GemmEpilogue::QkvRope, oq, s); });
      AttentionPrefillArgs at;
      at.q = ws.q, at.ldq = 576, at.k_cache = L.k_cache, at.v_cache = L.v_cache, at.kv_half = true;
      at.out = ws.att, at.ldo = 576, at.n_tokens = T, at.start = 0, at.n_heads = 9;
      at.n_kv_heads = 3, at.head_dim = 64;
      const double t_att = rep([&] { attention_prefill(at, s); });
      GemmArgs b = a;
      b.w = L.w_o, b.n = 576, b.k = 576, b.x = ws.att, b.norm_w = nullptr;
      GemmOut orr;
      orr.y = ws.x, orr.ldy = 576;
      const double t_wo = rep([&] { gemm_quant(b, GemmEpilogue::Accumulate, orr, s); });
      GemmArgs g = a;
      g.w = L.w_gate_up, g.n = 3072, g.norm_w = L.ffn_norm;
      GemmOut og;
      og.y = ws.ffh, og.ldy = 1536;
      const double t_gu = rep([&] { gemm_quant(g, GemmEpilogue::SiluPair, og, s); });
      GemmArgs d = b;
      d.w = L.w_down, d.k = 1536, d.x = ws.ffh, d.ldx = 1536;
      const double t_dn = rep([&] { gemm_quant(d, GemmEpilogue::Accumulate, orr, s); });
      std::printf("%5d %9.2f %9.2f %9.2f %9.2f %9.2f\n", T, t_qkv, t_att, t_wo, t_gu, t_dn);
      if (jf)
        std::fprintf(jf,
                     "{\"bench\":\"layer_kernels\",\"tokens\":%d,\"qkv_us\":%.3f,\"attn_us\":%.3f,"
                     "\"wo_us\":%.3f,\"gate_up_us\":%.3f,\"down_us\":%.3f}\n",
                     T, t_qkv, t_att, t_wo, t_gu, t_dn);
    }
  }

  // --- whole prefill
  // ------------------------------------------------------------------------------
  std::printf("\n%5s %6s %10s %10s %10s %12s %10s %10s\n", "T", "smax", "med_ms", "min_ms",
              "max_ms", "tok/s", "nograph_ms", "TF/s");
  const double flop_tok = 2.0 * c.n_layers *
                          ((double)c.dim * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * c.dim +
                           3.0 * c.dim * c.hidden_dim);
  std::vector<int> smax_list = {gemm_small_max_tokens()};
  if (gemm_small_max_tokens() != 8) smax_list.push_back(8);
  for (int T : tokens_list)
    for (int smax : smax_list) {
      if (smax != smax_list[0] && (T <= smax_list[0] || T > smax)) continue;  // same kernels
      set_gemm_small_max_tokens(smax);
      // Plain launches.
      const Stats plain = time_ms([&] { prefill_forward(pm.weights(), ws, T, 0, 1, s); }, reps, s);
      // Graph of the same launches.
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      prefill_forward(pm.weights(), ws, T, 0, 1, s);  // warm statics before capture
      CUDA_CHECK(cudaStreamSynchronize(s));
      CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      prefill_forward(pm.weights(), ws, T, 0, 1, s);
      CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      cudaEvent_t e0, e1;
      CUDA_CHECK(cudaEventCreate(&e0));
      CUDA_CHECK(cudaEventCreate(&e1));
      for (int i = 0; i < 5; ++i) CUDA_CHECK(cudaGraphLaunch(exec, s));
      std::vector<double> ms;
      for (int i = 0; i < reps; ++i) {
        CUDA_CHECK(cudaEventRecord(e0, s));
        CUDA_CHECK(cudaGraphLaunch(exec, s));
        CUDA_CHECK(cudaEventRecord(e1, s));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float m = 0;
        CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
        ms.push_back(m);
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      const double tflops = flop_tok * T / (med * 1e-3) / 1e12;
      std::printf("%5d %6d %10.4f %10.4f %10.4f %12.0f %10.4f %10.2f\n", T, smax, med, ms.front(),
                  ms.back(), T / (med * 1e-3), plain.med, tflops);
      if (jf)
        std::fprintf(
            jf,
            "{\"bench\":\"prefill\",\"device\":\"%s\",\"tokens\":%d,\"median_ms\":%.5f,"
            "\"min_ms\":%.5f,\"max_ms\":%.5f,\"tok_per_s\":%.0f,\"nograph_median_ms\":%.5f,"
            "\"layer_tflops\":%.3f,\"reps\":%d,\"small_max\":%d}\n",
            prop.name, T, med, ms.front(), ms.back(), T / (med * 1e-3), plain.med, tflops, reps,
            smax);
      CUDA_CHECK(cudaEventDestroy(e0));
      CUDA_CHECK(cudaEventDestroy(e1));
      CUDA_CHECK(cudaGraphExecDestroy(exec));
      CUDA_CHECK(cudaGraphDestroy(graph));
    }
  set_gemm_small_max_tokens(-1);
  if (jf) std::fclose(jf);
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_prefill: %s\n", e.what());
  return 1;
}
