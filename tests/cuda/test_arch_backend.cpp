// Every architecture family end to end on the GPU against the CPU backend (the fp32 oracle):
// seconds-fast synth models of each family (`tiny-gemma3`: QK norm, post norms, GELU, embedding
// scale, NeoX RoPE, sliding-window and global layers with their own bases, head_dim != dim /
// n_heads; `tiny-qwen2`: Q/K/V biases, NeoX; `tiny-llama3`: frequency factors) in several weight
// types, through the three CUDA paths: the decode step (token by token), the batched prefill,
// and the multi-sequence backend. Prompts run past the tiny models' windows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/batch.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/single_sequence.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "model/model.h"
#include "model/synth.h"

namespace smolrt {
namespace {

struct ArchCase {
  const char* preset;
  const char* type;
};

Model synth(const ArchCase& c) {
  SynthOptions o;
  o.preset = c.preset;
  o.type = parse_quant_target(c.type);
  o.seed = 7;
  SynthModel s = synth_model(o);
  Model m;
  m.file = gguf::File::parse(s.writer.to_bytes(), std::string(c.preset) + "-" + c.type);
  m.config = load_config(*m.file);
  m.weights = load_weights(*m.file, m.config);
  return m;
}

double rel_l2(std::span<const float> a, std::span<const float> ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// max |a - ref| / max |ref|: the decode bound's measure.
double max_rel(std::span<const float> a, std::span<const float> ref) {
  if (a.size() != ref.size()) return INFINITY;
  double md = 0, mc = 0;
  for (size_t j = 0; j < ref.size(); ++j) {
    md = std::max(md, std::fabs((double)a[j] - ref[j]));
    mc = std::max(mc, std::fabs((double)ref[j]));
  }
  return md / mc;
}

std::vector<int> prompt_of(int n, int vocab, unsigned seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = (int)((i * 7919u + seed * 104729u + 13u) % (unsigned)vocab);
  return t;
}

std::unique_ptr<Backend> backend(const Model& m, const char* kind) {
  BackendOptions o;
  o.kind = kind;
  o.n_ctx = 128;
  o.kv_half = false;  // the exact mode the CPU comparisons use
  return make_backend(m, o);
}

// The CPU backend's logits at every position of toks.
std::vector<std::vector<float>> cpu_logits(const Model& m, const std::vector<int>& toks) {
  auto cpu = backend(m, "cpu-ref");
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < toks.size(); ++i) {
    std::span<const float> l = cpu->forward_token(toks[i], (int)i);
    out.emplace_back(l.begin(), l.end());
  }
  return out;
}

const ArchCase kCases[] = {
    {"tiny-gemma3", "f32"},  {"tiny-gemma3", "q8_0"}, {"tiny-gemma3", "q4_k"},
    {"tiny-qwen2", "q8_0"},  {"tiny-qwen2", "q5_0"},  {"tiny-llama3", "q8_0"},
    {"tiny-llama3", "q6_k"},
};

class ArchBackend : public ::testing::TestWithParam<ArchCase> {};

// Decode path: fp32 activations and the same dequantized weights on both sides, so only the
// summation order differs: the decode bound of test_cuda_backend.cpp, 5e-4 relative (max norm).
TEST_P(ArchBackend, DecodeStepMatchesCpu) {
  REQUIRE_GPU();
  const Model m = synth(GetParam());
  const std::vector<int> toks = prompt_of(40, m.config.vocab_size, 1);
  const auto ref = cpu_logits(m, toks);
  auto gpu = backend(m, "cuda");
  double worst = 0;
  for (size_t i = 0; i < toks.size(); ++i) {
    const double e = max_rel(gpu->forward_token(toks[i], (int)i), ref[i]);
    worst = std::max(worst, e);
    ASSERT_LE(e, 5e-4) << "position " << i;
  }
  std::cout << "[ measure ] " << GetParam().preset << " " << GetParam().type
            << " decode vs CPU: worst rel err " << worst << "\n";
}

// Batched prefill (tensor-core GEMMs on fp16 activations): the prefill bound, 2e-2 relative L2
// per logits row (test_cuda_prefill.cpp), on every row of the prompt.
TEST_P(ArchBackend, PrefillMatchesCpu) {
  REQUIRE_GPU();
  const Model m = synth(GetParam());
  const std::vector<int> toks = prompt_of(37, m.config.vocab_size, 2);
  const auto ref = cpu_logits(m, toks);
  auto gpu = backend(m, "cuda");
  const std::vector<float> all = gpu->forward_prompt_all(toks);
  const size_t V = m.config.vocab_size;
  ASSERT_EQ(all.size(), toks.size() * V);
  double worst = 0;
  for (size_t i = 0; i < toks.size(); ++i) {
    const double e = rel_l2(std::span<const float>(all.data() + i * V, V), ref[i]);
    worst = std::max(worst, e);
    ASSERT_LT(e, 2e-2) << "row " << i;
  }
  // The decode step continues from the prefilled cache.
  const int next = 5 % m.config.vocab_size;
  std::span<const float> g = gpu->forward_token(next, (int)toks.size());
  std::vector<int> longer = toks;
  longer.push_back(next);
  const auto ref2 = cpu_logits(m, longer);
  EXPECT_LT(rel_l2(g, ref2.back()), 2e-2);
  std::cout << "[ measure ] " << GetParam().preset << " " << GetParam().type
            << " prefill vs CPU: worst rel L2 " << worst << "\n";
}

// The multi-sequence backend: three sequences of different lengths prefilled together, then
// decoded together (multi-row GEMM steps) and one alone (the one-row GEMV step), fp32 and fp16
// pools: every returned logits row within the prefill bound of the CPU's.
TEST_P(ArchBackend, MultiSequenceMatchesCpu) {
  REQUIRE_GPU();
  const Model m = synth(GetParam());
  const int V = m.config.vocab_size;
  if (std::string(GetParam().type) == "f32") {
    // The many-row GEMMs take every format but F32: such a model runs one row per step (its
    // decode steps are checked against the CPU above), and a step of more is a clear Error.
    BatchOptions bo;
    bo.kind = "cuda";
    auto b = make_batch_backend(m, bo);
    EXPECT_EQ(b->max_step_tokens(), 1);
    const std::vector<int> two = prompt_of(2, V, 3);
    SeqStep s;
    s.seq = b->add_sequence(), s.tokens = two;
    EXPECT_THROW(b->step(std::span<const SeqStep>(&s, 1)), Error);
    s.tokens = std::span<const int>(two).first(1);
    EXPECT_EQ(b->step(std::span<const SeqStep>(&s, 1)).size(), 1u);
    return;
  }
  for (bool half : {false, true}) {
    SCOPED_TRACE(half ? "fp16 pool" : "fp32 pool");
    BatchOptions bo;
    bo.kind = "cuda";
    bo.max_seqs = 4;
    bo.seq_ctx = 128;
    bo.kv_half = half;
    auto b = make_batch_backend(m, bo);
    std::vector<std::vector<int>> seqs = {prompt_of(9, V, 3), prompt_of(30, V, 4),
                                          prompt_of(17, V, 5)};
    std::vector<int> ids;
    std::vector<SeqStep> st;
    for (auto& p : seqs) {
      ids.push_back(b->add_sequence());
      SeqStep s;
      s.seq = ids.back(), s.tokens = p, s.sample = true, s.logits = 1;
      st.push_back(s);
    }
    std::vector<SeqResult> r = b->step(st);
    double worst = 0;
    // Checks every returned row against the CPU on the sequence so far, then appends the token.
    auto check = [&](const std::vector<size_t>& which, const char* what, int it) {
      for (size_t j = 0; j < which.size(); ++j) {
        const size_t k = which[j];
        const double e = rel_l2(r[j].logits, cpu_logits(m, seqs[k]).back());
        worst = std::max(worst, e);
        ASSERT_LT(e, 2e-2) << what << ": sequence " << k << " step " << it;
        seqs[k].push_back(r[j].token);
      }
    };
    auto decode = [&](const std::vector<size_t>& which) {
      std::vector<SeqStep> d(which.size());
      for (size_t j = 0; j < which.size(); ++j) {
        d[j].seq = ids[which[j]], d[j].tokens = std::span<const int>(&seqs[which[j]].back(), 1);
        d[j].sample = true, d[j].logits = 1;
      }
      r = b->step(d);
    };
    const std::vector<size_t> all = {0, 1, 2}, one = {1};
    for (int it = 0; it < 8; ++it) {  // together: the multi-row GEMM step
      check(all, "together", it);
      if (HasFatalFailure()) return;
      decode(all);
    }
    check(all, "together", 8);
    b->free_sequence(ids[0]);
    b->free_sequence(ids[2]);
    for (int it = 0; it < 6; ++it) {  // alone: the one-row GEMV step
      decode(one);
      check(one, "alone", it);
      if (HasFatalFailure()) return;
    }
    std::cout << "[ measure ] " << GetParam().preset << " " << GetParam().type
              << (half ? " fp16" : " fp32") << " pool, multi-sequence vs CPU: worst rel L2 "
              << worst << "\n";
  }
}

// The sliding-window layers' KV caches as rings of window + step - 1 rows: tiny-gemma3 (window 8)
// with 5-token steps keeps 12 rows (three 4-token pages) in its local layers, so a 37-token prompt
// and the decode after it wrap them several times. The prompt (steps of 5) and the decode that
// continues it within the prefill bound of the CPU; decode alone within the decode bound; going
// back further than the rings keep (a step's rows, one less where greedy steps are speculated)
// is a clear error, as far as that is fine.
TEST(ArchRingCache, LocalLayersKeepWindowPlusChunkRows) {
  REQUIRE_GPU();
  const Model m = synth({"tiny-gemma3", "q8_0"});
  ASSERT_EQ(m.config.sliding_window, 8);
  BackendOptions o;
  o.kind = "cuda";
  o.n_ctx = 128;
  o.kv_half = false;
  BatchOptions bo = single_sequence_options(o);
  bo.max_step_tokens = 5;
  bo.page_size = 4;
  auto gpu = make_cuda_backend_ex(m, bo, CudaOptions{});
  auto dec = make_cuda_backend_ex(m, bo, CudaOptions{});
  const std::vector<int> toks = prompt_of(60, m.config.vocab_size, 3);
  const auto ref = cpu_logits(m, toks);
  const size_t V = m.config.vocab_size;
  const std::vector<int> prompt(toks.begin(), toks.begin() + 37);
  const std::vector<float> all = gpu->forward_prompt_all(prompt);
  ASSERT_EQ(all.size(), prompt.size() * V);
  for (size_t i = 0; i < prompt.size(); ++i) {
    ASSERT_LT(rel_l2(std::span<const float>(all.data() + i * V, V), ref[i]), 2e-2) << "row " << i;
  }
  for (size_t i = prompt.size(); i < toks.size(); ++i) {
    ASSERT_LT(rel_l2(gpu->forward_token(toks[i], (int)i), ref[i]), 2e-2) << "position " << i;
  }
  for (size_t i = 0; i < toks.size(); ++i) {
    ASSERT_LE(max_rel(dec->forward_token(toks[i], (int)i), ref[i]), 5e-4) << "position " << i;
  }
  try {
    dec->rollback(60 - 5);
    FAIL() << "no error for a rollback past the ring";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(at most 4)"), std::string::npos) << e.what();
  }
  dec->rollback(60 - 4);  // within the ring: the window of position 56 is still there
  EXPECT_LT(rel_l2(dec->forward_token(toks[56], 56), ref[56]), 5e-4);
}

// The ring tests' engine: tiny-gemma3's window of 8 and steps of at most 12 tokens make rings of
// 8 + 11 rows, in two 16-token pages (32 rows).
BatchOptions ring_options(int max_seqs, bool half) {
  BatchOptions bo;
  bo.kind = "cuda";
  bo.max_seqs = max_seqs;
  bo.seq_ctx = 128;
  bo.max_step_tokens = 12;
  bo.kv_half = half;
  return bo;
}

// The multi-sequence backend's sliding-window layers as rings per sequence: tiny-gemma3 (window 8)
// with steps of at most 12 tokens keeps rings of 8 + 11 rows, in two 16-token pages (32 rows),
// outside the pool. Two prompts fed in chunks that share steps, then decoded together (multi-row
// steps) and one alone (the one-row step) to position 70: the rings wrap twice, every returned
// logits row within the prefill bound of the CPU's, both pool types. A rollback past what the
// ring keeps is a clear error. The chunks' attention both ways: attention_paged (the default at
// these sizes) and attention_prefill through the rings' tables (CudaOptions::span_row_keys 1).
TEST(ArchRingCache, MultiSequenceLocalLayersUseRings) {
  REQUIRE_GPU();
  const Model m = synth({"tiny-gemma3", "q8_0"});
  ASSERT_EQ(m.config.sliding_window, 8);
  const int V = m.config.vocab_size;
  for (int variant = 0; variant < 3; ++variant) {
    const bool half = variant != 0, spans = variant == 2;
    SCOPED_TRACE(
        cat(half ? "fp16 pool" : "fp32 pool", spans ? ", chunks by attention_prefill" : ""));
    CudaOptions co;
    if (spans) co.span_row_keys = 1;
    auto b = make_cuda_batch_backend_ex(m, ring_options(3, half), co);
    ASSERT_EQ(b->kv_ring_rows(), 32);
    EXPECT_EQ(b->kv_tokens(), 3 * 128);  // the pool as without rings: the global layer's
    std::vector<std::vector<int>> seqs = {prompt_of(30, V, 6), prompt_of(20, V, 7)};
    const std::vector<int> ids = {b->add_sequence(), b->add_sequence()};
    std::vector<size_t> fed = {0, 0};
    double worst = 0;
    // Prompt chunks of 7 and 5 tokens per step until both prompts are in.
    while (fed[0] < seqs[0].size() || fed[1] < seqs[1].size()) {
      std::vector<SeqStep> st;
      std::vector<size_t> which;
      for (size_t k = 0; k < 2; ++k) {
        const size_t len = std::min<size_t>(k == 0 ? 7 : 5, seqs[k].size() - fed[k]);
        if (len == 0) continue;
        SeqStep s;
        s.seq = ids[k], s.tokens = std::span<const int>(seqs[k].data() + fed[k], len);
        s.sample = false, s.logits = 2;
        st.push_back(s);
        which.push_back(k);
      }
      const std::vector<SeqResult> r = b->step(st);
      for (size_t j = 0; j < which.size(); ++j) {
        const size_t k = which[j], len = st[j].tokens.size();
        const auto ref = cpu_logits(
            m, std::vector<int>(seqs[k].begin(), seqs[k].begin() + (long)(fed[k] + len)));
        ASSERT_EQ(r[j].logits.size(), len * (size_t)V);
        for (size_t i = 0; i < len; ++i) {
          const double e =
              rel_l2(std::span<const float>(r[j].logits.data() + i * V, V), ref[fed[k] + i]);
          worst = std::max(worst, e);
          ASSERT_LT(e, 2e-2) << "sequence " << k << " position " << fed[k] + i;
        }
        fed[k] += len;
      }
    }
    // Decode: both together to position 50 of the longer one, then sequence 1 alone to 70.
    auto decode = [&](const std::vector<size_t>& which) {
      std::vector<SeqStep> d(which.size());
      std::vector<int> next(which.size());
      for (size_t j = 0; j < which.size(); ++j) {
        next[j] = (int)((seqs[which[j]].size() * 31u + 5u) % (unsigned)V);
        d[j].seq = ids[which[j]], d[j].tokens = std::span<const int>(&next[j], 1);
        d[j].sample = false, d[j].logits = 1;
      }
      const std::vector<SeqResult> r = b->step(d);
      for (size_t j = 0; j < which.size(); ++j) {
        seqs[which[j]].push_back(next[j]);
        const double e = rel_l2(r[j].logits, cpu_logits(m, seqs[which[j]]).back());
        worst = std::max(worst, e);
        ASSERT_LT(e, 2e-2) << "sequence " << which[j] << " position " << seqs[which[j]].size() - 1;
      }
    };
    while (seqs[0].size() < 50) {
      decode({0, 1});
      if (HasFatalFailure()) return;
    }
    b->free_sequence(ids[0]);
    while (seqs[1].size() < 70) {
      decode({1});
      if (HasFatalFailure()) return;
    }
    // The rings keep 32 - 8 + 1 = 25 positions of slack, one less with speculated decode steps
    // (the default; a dropped one wrote the ring row past the position): 25 back is refused,
    // nothing changed.
    EXPECT_THROW(b->rollback(ids[1], 70 - 25), Error);
    EXPECT_EQ(b->position(ids[1]), 70);
    b->rollback(ids[1], 70 - 24);  // the most the rings allow: position 46 reads 39..46
    seqs[1].resize(70 - 24);
    decode({1});
    std::cout << "[ measure ] tiny-gemma3 q8_0" << (half ? " fp16" : " fp32")
              << " pool, rings of 32 rows" << (spans ? ", chunks by attention_prefill" : "")
              << ", multi-sequence vs CPU: worst rel L2 " << worst << "\n";
  }
}

// Speculated one-row steps with rings (tiny-gemma3, rings of 32 rows): the hand-off advances the
// ring slot with the pool slot, so greedy decoding past two ring wraps, a dropped speculation
// followed by the deepest rollback the rings allow, and decoding on give the tokens of plain
// steps.
TEST(ArchRingCache, SpeculatedStepsMatchPlainOnes) {
  REQUIRE_GPU();
  const Model m = synth({"tiny-gemma3", "q8_0"});
  const int V = m.config.vocab_size;
  auto run = [&](bool speculate) {
    CudaOptions co = CudaOptions{};
    co.use_graph = true, co.speculate = speculate, co.split_k = false;
    auto b = make_cuda_batch_backend_ex(m, ring_options(2, true), co);
    EXPECT_EQ(b->kv_ring_rows(), 32);
    std::vector<int> out;
    auto one = [&](int seq, std::span<const int> toks) {
      SeqStep s;
      s.seq = seq, s.tokens = toks, s.params.temp = 0.f;
      out.push_back(b->step(std::vector<SeqStep>{s})[0].token);
      return out.back();
    };
    auto chain = [&](int seq, int t, int n) {
      for (int i = 0; i < n; ++i) t = one(seq, std::span<const int>(&t, 1));
      return t;
    };
    const std::vector<int> prompt = prompt_of(10, V, 41);
    const int a = b->add_sequence();
    int t = chain(a, one(a, prompt), 60);  // to position 71: the rings wrap twice
    const int x = (t + 1) % V;             // not the chosen id: the pending step is dropped
    t = chain(a, one(a, std::span<const int>(&x, 1)), 3);
    b->rollback(a, b->position(a) - 24);  // with one pending: the deepest the rings allow
    chain(a, one(a, std::span<const int>(&x, 1)), 20);
    return out;
  };
  const std::vector<int> plain = run(false), spec = run(true);
  ASSERT_EQ(spec.size(), plain.size());
  EXPECT_EQ(spec, plain);
}

INSTANTIATE_TEST_SUITE_P(Families, ArchBackend, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<ArchCase>& i) {
                           std::string s = std::string(i.param.preset) + "_" + i.param.type;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace smolrt
