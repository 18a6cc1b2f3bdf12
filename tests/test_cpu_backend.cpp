// CpuBackend on a tiny random llama (mixed weight types, GQA) against a naive double-precision
// forward pass that recomputes the whole sequence without a KV cache; plus the Backend contract:
// prompt == token loop, rollback, argument errors, debug activations.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "cpu_test_util.h"

namespace smolrt {
namespace {

using Mat = std::vector<std::vector<double>>;

Mat to_double(const TensorView& t) {
  Mat m(t.rows, std::vector<double>(t.cols));
  std::vector<float> row(t.cols);
  for (int64_t r = 0; r < t.rows; ++r) {
    cpu::dequantize(t, r, row.data());  // checked bit-exact against the bytes in test_cpu_ops
    for (int64_t i = 0; i < t.cols; ++i) m[r][i] = row[i];
  }
  return m;
}

std::vector<double> mv(const Mat& w, const std::vector<double>& x) {
  std::vector<double> y(w.size(), 0.0);
  for (size_t r = 0; r < w.size(); ++r) {
    for (size_t i = 0; i < x.size(); ++i) y[r] += w[r][i] * x[i];
  }
  return y;
}

std::vector<double> rmsn(const std::vector<double>& x, const Mat& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[0][i];
  return y;
}

void rope_d(std::vector<double>& v, int n_heads, int head_dim, int rope_dim, int pos, double base) {
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < rope_dim / 2; ++i) {
      const double th = pos * std::pow(base, -2.0 * i / rope_dim);
      double& a = v[h * head_dim + 2 * i];
      double& b = v[h * head_dim + 2 * i + 1];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(th) - b0 * std::sin(th);
      b = a0 * std::sin(th) + b0 * std::cos(th);
    }
  }
}

// Logits of the last token of `tokens`, straight from the formulas in facts.md.
std::vector<double> reference_logits(const Model& m, const std::vector<int>& tokens) {
  const ModelConfig& c = m.config;
  const Weights& w = m.weights;
  const Mat emb = to_double(w.token_embd);
  const int n = static_cast<int>(tokens.size()), hd = c.head_dim;
  std::vector<std::vector<double>> x(n);
  for (int t = 0; t < n; ++t) x[t] = emb[tokens[t]];
  for (const LayerWeights& l : w.layers) {
    const Mat an = to_double(l.attn_norm), fn = to_double(l.ffn_norm);
    const Mat wq = to_double(l.wq), wk = to_double(l.wk), wv = to_double(l.wv),
              wo = to_double(l.wo), wg = to_double(l.w_gate), wu = to_double(l.w_up),
              wd = to_double(l.w_down);
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const auto h = rmsn(x[t], an, c.norm_eps);
      q[t] = mv(wq, h);
      k[t] = mv(wk, h);
      v[t] = mv(wv, h);
      rope_d(q[t], c.n_heads, hd, c.rope_dim, t, c.rope_base);
      rope_d(k[t], c.n_kv_heads, hd, c.rope_dim, t, c.rope_base);
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> att(c.q_dim(), 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / (c.n_heads / c.n_kv_heads);
        std::vector<double> s(t + 1);
        double mx = -1e300, sum = 0;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[u][kvh * hd + i];
          s[u] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[u]);
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int u = 0; u <= t; ++u) {
          for (int i = 0; i < hd; ++i) att[h * hd + i] += s[u] / sum * v[u][kvh * hd + i];
        }
      }
      const auto o = mv(wo, att);
      for (int i = 0; i < c.dim; ++i) x[t][i] += o[i];
      const auto h2 = rmsn(x[t], fn, c.norm_eps);
      auto g = mv(wg, h2);
      const auto u2 = mv(wu, h2);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u2[i];
      const auto d = mv(wd, g);
      for (int i = 0; i < c.dim; ++i) x[t][i] += d[i];
    }
  }
  return mv(to_double(w.output), rmsn(x[n - 1], to_double(w.output_norm), c.norm_eps));
}

std::vector<int> some_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> t(n);
  for (int& x : t) x = static_cast<int>(rng() % vocab);
  return t;
}

class CpuBackendRef : public ::testing::TestWithParam<test::TinySpec> {};

TEST_P(CpuBackendRef, MatchesDoubleForwardAtEveryLength) {
  const auto tm = test::make_tiny_model(GetParam(), 11);
  auto be = make_cpu_backend(tm->model, BackendOptions{"cpu-ref", 0, 2});
  EXPECT_EQ(be->n_ctx(), GetParam().n_ctx_train);
  const std::vector<int> toks = some_tokens(20, GetParam().vocab, 3);
  for (int n = 1; n <= 20; ++n) {
    const std::span<const float> got = be->forward_token(toks[n - 1], n - 1);
    if (n != 1 && n != 2 && n != 9 && n != 20) continue;  // the reference is O(n^2): sample
    const std::vector<double> ref = reference_logits(tm->model, {toks.begin(), toks.begin() + n});
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
      max_ref = std::max(max_ref, std::fabs(ref[i]));
    }
    // Whole-model f32 vs double through 2 layers: relative error ~1e-6; 1e-4 of the logit
    // scale leaves margin while still catching any formula error (those are O(scale)).
    EXPECT_LT(max_err, 1e-4 * max_ref) << "n " << n << " max_ref " << max_ref;
    EXPECT_GT(max_ref, 0.1);  // logits are not degenerate
  }
}

test::TinySpec gqa_spec() {
  return {};
}
test::TinySpec tied_partial_rope_spec() {
  test::TinySpec s;
  s.tied = true;
  s.rope_dim = 4;  // rotate only the first half of each head
  s.n_heads = 4;
  s.n_kv_heads = 4;  // no grouping
  s.dim = 64;        // head_dim 16
  s.rope_base = 100000.f;
  return s;
}
test::TinySpec one_kv_head_spec() {
  test::TinySpec s;
  s.n_heads = 8;
  s.n_kv_heads = 1;
  s.n_layers = 3;
  return s;
}
// Every layer matrix in one of the newer formats: Q5_0 / Q5_1 on the default shape, the
// K-quants on a shape whose row lengths (dim 256, hidden 512) are whole super-blocks.
test::TinySpec uniform_spec(GgmlType layer, GgmlType embd) {
  test::TinySpec s;
  s.layer_type = layer;
  s.embd_type = embd;
  if (type_info(layer)->block_size == 256 || type_info(embd)->block_size == 256) {
    s.dim = 256;
    s.hidden_dim = 512;
    s.n_heads = 4;  // head_dim 64
    s.n_kv_heads = 2;
    s.rope_dim = 64;
  }
  return s;
}
INSTANTIATE_TEST_SUITE_P(Shapes, CpuBackendRef,
                         ::testing::Values(gqa_spec(), tied_partial_rope_spec(), one_kv_head_spec(),
                                           uniform_spec(GgmlType::Q5_0, GgmlType::Q5_1),
                                           uniform_spec(GgmlType::Q5_1, GgmlType::Q5_0),
                                           uniform_spec(GgmlType::Q4_K, GgmlType::Q6_K),
                                           uniform_spec(GgmlType::Q5_K, GgmlType::Q4_K),
                                           uniform_spec(GgmlType::Q6_K, GgmlType::Q5_K)));

TEST(CpuBackend, PromptEqualsTokenLoopAndAll) {
  const auto tm = test::make_tiny_model({}, 5);
  auto a = make_cpu_backend(tm->model, BackendOptions{"cpu-ref", 32, 1});
  auto b = make_cpu_backend(tm->model, BackendOptions{"cpu-ref", 32, 2});
  const std::vector<int> toks = some_tokens(12, 100, 8);
  std::vector<float> loop;
  for (int i = 0; i < 12; ++i) {
    const auto l = a->forward_token(toks[i], i);
    loop.assign(l.begin(), l.end());
  }
  const auto p = b->forward_prompt(toks);
  EXPECT_EQ(std::vector<float>(p.begin(), p.end()), loop);
  EXPECT_EQ(b->position(), 12);

  b->reset();
  EXPECT_EQ(b->position(), 0);
  const std::vector<float> all = b->forward_prompt_all(toks);
  ASSERT_EQ(all.size(), 12u * 100u);
  a->reset();
  for (int i = 0; i < 12; ++i) {
    const auto l = a->forward_token(toks[i], i);
    EXPECT_EQ(std::vector<float>(l.begin(), l.end()),
              std::vector<float>(all.begin() + i * 100, all.begin() + (i + 1) * 100))
        << "position " << i;
  }
  // A continuation prompt starts at position().
  b->reset();
  b->forward_prompt(std::span<const int>(toks).first(5));
  const auto cont = b->forward_prompt(std::span<const int>(toks).subspan(5));
  EXPECT_EQ(std::vector<float>(cont.begin(), cont.end()), loop);
}

TEST(CpuBackend, RollbackThenRedecodeGivesSameLogits) {
  const auto tm = test::make_tiny_model({}, 6);
  auto be = make_cpu_backend(tm->model, BackendOptions{"cpu-ref", 0, 2});
  const std::vector<int> toks = some_tokens(10, 100, 9);
  be->forward_prompt(toks);
  const auto l = be->forward_token(42, 10);
  const std::vector<float> want(l.begin(), l.end());
  // Diverge: different tokens at positions 6..10.
  be->rollback(6);
  EXPECT_EQ(be->position(), 6);
  be->forward_prompt(std::vector<int>{1, 2, 3, 4, 5});
  // Back to 6 and replay the original suffix.
  be->rollback(6);
  be->forward_prompt(std::span<const int>(toks).subspan(6));
  const auto again = be->forward_token(42, 10);
  EXPECT_EQ(std::vector<float>(again.begin(), again.end()), want);
  // Writing at an earlier position directly (no rollback) also truncates.
  be->forward_token(toks[3], 3);
  EXPECT_EQ(be->position(), 4);
  EXPECT_THROW(be->rollback(5), Error);
  EXPECT_THROW(be->rollback(-1), Error);
  be->rollback(0);
  EXPECT_EQ(be->position(), 0);
}

TEST(CpuBackend, OutOfRangeTokenAndPositionThrow) {
  const auto tm = test::make_tiny_model({}, 7);
  auto be = make_cpu_backend(tm->model, BackendOptions{"cpu-ref", 8, 1});
  EXPECT_THROW(be->forward_token(100, 0), Error);  // vocab is 100
  EXPECT_THROW(be->forward_token(-1, 0), Error);
  EXPECT_THROW(be->forward_token(1, 1), Error);  // past position()
  EXPECT_THROW(be->forward_token(1, -1), Error);
  EXPECT_EQ(be->position(), 0);  // failed calls change nothing
  EXPECT_THROW(be->forward_prompt(std::vector<int>{1, 2, 100}), Error);
  EXPECT_EQ(be->position(), 0);  // the prompt is validated before any token runs
  EXPECT_THROW(be->forward_prompt(std::vector<int>(9, 1)), Error);  // longer than n_ctx 8
  EXPECT_THROW(be->forward_prompt(std::vector<int>{}), Error);
  be->forward_prompt(std::vector<int>(8, 1));
  try {
    be->forward_token(1, 8);  // the context is full
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ctx"), std::string::npos) << e.what();
  }
  EXPECT_EQ(be->forward_token_greedy(1, 7), cpu::argmax(be->forward_token(1, 7).data(), 100));
}

TEST(CpuBackend, BadOptionsThrow) {
  const auto tm = test::make_tiny_model({}, 7);
  EXPECT_THROW(make_cpu_backend(tm->model, BackendOptions{"cpu-ref", -1, 1}), Error);
  // A context past the 64 positions the tiny model was trained for.
  EXPECT_THROW(make_cpu_backend(tm->model, BackendOptions{"cpu-ref", 65, 1}), Error);
  EXPECT_THROW(make_cpu_backend(tm->model, BackendOptions{"cpu-ref", 0, -2}), Error);
  EXPECT_THROW(make_backend(tm->model, BackendOptions{"tpu", 0, 1}), Error);
  EXPECT_EQ(make_backend(tm->model, BackendOptions{"cpu-ref", 16, 1})->n_ctx(), 16);
}

TEST(CpuBackend, DebugActivationsAreNamedAndConsistent) {
  const auto tm = test::make_tiny_model({}, 8);
  auto be = make_cpu_backend(tm->model, BackendOptions{"cpu-ref", 0, 1});
  be->forward_token(3, 0);
  EXPECT_TRUE(be->activations().empty());  // off by default
  be->set_debug(true);
  be->forward_token(4, 1);
  const auto l = be->forward_token(5, 2);
  const std::vector<Activation> acts = be->activations();
  std::vector<std::string> names;
  for (const Activation& a : acts) names.push_back(a.name);
  std::vector<std::string> want = {"embed"};
  for (int i = 0; i < 2; ++i) {
    for (const char* s : {"attn_norm", "attn_out", "ffn_norm", "ffn_out"}) {
      want.push_back("blk." + std::to_string(i) + "." + s);
    }
  }
  want.push_back("output_norm");
  want.push_back("logits");
  EXPECT_EQ(names, want);
  EXPECT_EQ(acts.back().values, std::vector<float>(l.begin(), l.end()));
  EXPECT_EQ(acts.front().values.size(), 64u);
  // The embedding activation is the token's row.
  std::vector<float> row(64);
  cpu::embed(row.data(), tm->model.weights.token_embd, 5);
  EXPECT_EQ(acts.front().values, row);
}

}  // namespace
}  // namespace smolrt
