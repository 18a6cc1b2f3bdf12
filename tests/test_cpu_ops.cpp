// CPU reference ops against naive double-precision implementations on random data.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu_test_util.h"

namespace smolrt {
namespace {

using test::randn;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// --- rmsnorm ---------------------------------------------------------------------------------

TEST(CpuOps, RmsNormMatchesDouble) {
  for (int n : {1, 7, 64, 576, 1000}) {
    const auto x = randn(n, 10 + n, 3.0f);
    const auto w = randn(n, 20 + n);
    std::vector<float> out(n, kNaN);
    cpu::rmsnorm(out.data(), x.data(), w.data(), n, 1e-5f);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double s = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; ++i) {
      // f32 sum of squares over n <= 1000 terms: relative error well under 1e-5.
      EXPECT_NEAR(out[i], x[i] * s * w[i], 1e-5 * std::fabs(x[i] * s * w[i]) + 1e-7)
          << n << " " << i;
    }
    // In place gives the same bits.
    std::vector<float> y = x;
    cpu::rmsnorm(y.data(), y.data(), w.data(), n, 1e-5f);
    EXPECT_EQ(y, out);
  }
}

// --- matvec / dequant for every computable type -------------------------------------------------

struct TypeCase {
  GgmlType type;
  int64_t cols;
};

class CpuMatvec : public ::testing::TestWithParam<TypeCase> {};

TEST_P(CpuMatvec, MatchesDoubleAndThreadsAgree) {
  const auto [type, cols] = GetParam();
  const int64_t rows = 77;
  test::OwnedTensor t = test::make_tensor("w", rows, cols, type, 5, 0.5f);
  t.view.data = t.bytes.data();
  ASSERT_EQ(t.view.row_stride() * rows, t.bytes.size());
  const auto x = randn(cols, 6, 1.0f);

  // dequantize decodes exactly what the bytes say.
  std::vector<float> row(cols, kNaN);
  for (int64_t r : {int64_t{0}, int64_t{13}, rows - 1}) {
    cpu::dequantize(t.view, r, row.data());
    for (int64_t i = 0; i < cols; ++i) {
      ASSERT_EQ(row[i], static_cast<float>(test::unpack_elem(t.bytes, cols, type, r, i)))
          << "row " << r << " col " << i;
    }
  }

  std::vector<float> out(rows, kNaN);
  cpu::gemv_rows(out.data(), t.view, x.data(), 0, rows);
  for (int64_t r = 0; r < rows; ++r) {
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < cols; ++i) {
      const double w = test::unpack_elem(t.bytes, cols, type, r, i);
      ref += w * x[i];
      mag += std::fabs(w * x[i]);
    }
    // f32 accumulation of `cols` products: error bounded by ~cols * 2^-24 * sum|w x|; 1e-5 covers
    // cols <= 1536 with margin (8-way partial sums keep it far below that in practice).
    EXPECT_NEAR(out[r], ref, 1e-5 * mag + 1e-6) << "row " << r;
  }

  // A row range writes only its rows.
  std::vector<float> part(rows, kNaN);
  cpu::gemv_rows(part.data(), t.view, x.data(), 10, 20);
  for (int64_t r = 0; r < rows; ++r) {
    if (r >= 10 && r < 20) {
      EXPECT_EQ(part[r], out[r]);
    } else {
      EXPECT_TRUE(std::isnan(part[r]));
    }
  }

  // Threaded results are bit-identical to the single-threaded ones (rows are independent).
  for (int nt : {1, 2, 3, 7}) {
    std::vector<float> o(rows, kNaN);
    cpu::gemv(o.data(), t.view, x.data(), nt);
    EXPECT_EQ(o, out) << nt << " threads";
  }
}

// Every format: element formats at a row length of whole 32-element chunks and at one with a
// tail; block formats at one and at several blocks (K-quants), or at the model widths 576 and 1536.
std::vector<TypeCase> matvec_cases() {
  std::vector<TypeCase> v;
  for (GgmlType t : test::all_formats()) {
    const int bs = type_info(t)->block_size;
    if (bs == 1) {
      v.push_back({t, 576});
      v.push_back({t, 45});
    } else if (bs == kQKK) {
      v.push_back({t, 256});
      v.push_back({t, 1536});
    } else {
      v.push_back({t, 576});
      v.push_back({t, 1536});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CpuMatvec, ::testing::ValuesIn(matvec_cases()),
                         [](const ::testing::TestParamInfo<TypeCase>& p) {
                           return std::string(type_name(p.param.type)) + "_" +
                                  std::to_string(p.param.cols);
                         });

TEST(CpuOps, MatvecLargeUsesThreadsAndMatches) {
  // Big enough to take the threaded path (rows * cols >= 2^15).
  test::OwnedTensor t = test::make_tensor("w", 1000, 576, GgmlType::Q4_0, 8, 0.3f);
  t.view.data = t.bytes.data();
  const auto x = randn(576, 9);
  std::vector<float> one(1000, kNaN), many(1000, kNaN);
  cpu::gemv_rows(one.data(), t.view, x.data(), 0, 1000);
  cpu::gemv(many.data(), t.view, x.data(), 4);
  EXPECT_EQ(one, many);
}

TEST(CpuOps, UnsupportedTypeIsAnError) {
  std::vector<uint8_t> bytes(84 * 2);
  TensorView v{"blk.0.attn_q.weight", GgmlType::Q2_K, 2, 256, bytes.data(), bytes.size()};
  std::vector<float> out(256), x(256, 1.0f);
  try {
    cpu::gemv(out.data(), v, x.data(), 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_q.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("q2_k"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu::dequantize(v, 0, out.data()), Error);
  // A K-quant row must be whole super-blocks.
  std::vector<uint8_t> k(144 * 3);
  TensorView bad{"blk.0.ffn_up.weight", GgmlType::Q4_K, 1, 576, k.data(), k.size()};
  try {
    cpu::gemv(out.data(), bad, x.data(), 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("576 columns, not a multiple of the q4_k block size 256"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuOps, EmbedReturnsTheRowForEveryType) {
  for (GgmlType type : test::all_formats()) {
    const int64_t cols = type_info(type)->block_size == 256 ? 512 : 64;
    test::OwnedTensor t = test::make_tensor("token_embd.weight", 50, cols, type, 3, 1.0f);
    t.view.data = t.bytes.data();
    std::vector<float> out(cols, kNaN);
    cpu::embed(out.data(), t.view, 49);
    for (int64_t i = 0; i < cols; ++i) {
      ASSERT_EQ(out[i], static_cast<float>(test::unpack_elem(t.bytes, cols, type, 49, i)))
          << type_name(type) << " col " << i;
    }
    EXPECT_THROW(cpu::embed(out.data(), t.view, 50), Error);
    EXPECT_THROW(cpu::embed(out.data(), t.view, -1), Error);
  }
}

// --- rope ----------------------------------------------------------------------------------------

TEST(CpuOps, RopeMatchesDoubleAtSeveralPositions) {
  struct Shape {
    int n_heads, head_dim, rope_dim;
    float base;
  };
  for (const Shape& s :
       {Shape{9, 64, 64, 100000.f}, Shape{8, 8, 8, 10000.f}, Shape{3, 64, 32, 10000.f}}) {
    for (int pos : {0, 1, 2, 17, 300, 2047, 8191}) {
      const int n = s.n_heads * s.head_dim;
      const auto v0 = randn(n, 100 + pos);
      std::vector<float> v = v0;
      cpu::rope(v.data(), s.n_heads, s.head_dim, s.rope_dim, pos, s.base);
      for (int h = 0; h < s.n_heads; ++h) {
        for (int i = 0; i < s.head_dim / 2; ++i) {
          const int a = h * s.head_dim + 2 * i;
          double ra = v0[a], rb = v0[a + 1];
          if (2 * i < s.rope_dim) {
            const double th = pos * std::pow(double(s.base), -2.0 * i / s.rope_dim);
            ra = v0[a] * std::cos(th) - v0[a + 1] * std::sin(th);
            rb = v0[a] * std::sin(th) + v0[a + 1] * std::cos(th);
          }
          // cos/sin rounded to f32 then two f32 products: a few ulps of |v|.
          EXPECT_NEAR(v[a], ra, 1e-6 * (std::fabs(v0[a]) + std::fabs(v0[a + 1])) + 1e-7)
              << "pos " << pos << " head " << h << " pair " << i;
          EXPECT_NEAR(v[a + 1], rb, 1e-6 * (std::fabs(v0[a]) + std::fabs(v0[a + 1])) + 1e-7);
        }
      }
      if (pos == 0) {
        EXPECT_EQ(v, v0);  // angle 0 is the identity
      }
    }
  }
}

// --- attention -----------------------------------------------------------------------------------

TEST(CpuOps, AttentionGqaMatchesDouble) {
  struct Shape {
    int n_heads, n_kv_heads, head_dim;
  };
  for (const Shape& s : {Shape{9, 3, 64}, Shape{8, 4, 8}, Shape{4, 4, 16}, Shape{6, 1, 32}}) {
    for (int n_pos : {1, 2, 7, 100, 513}) {
      const int kv_dim = s.n_kv_heads * s.head_dim;
      const auto q = randn(s.n_heads * s.head_dim, n_pos, 1.5f);
      const auto k = randn(size_t(n_pos) * kv_dim, n_pos + 1, 1.5f);
      const auto v = randn(size_t(n_pos) * kv_dim, n_pos + 2);
      std::vector<float> out(s.n_heads * s.head_dim, kNaN), scratch(n_pos, kNaN);
      cpu::attention_decode(out.data(), q.data(), k.data(), v.data(), n_pos, s.n_heads,
                            s.n_kv_heads, s.head_dim, scratch.data());
      const int group = s.n_heads / s.n_kv_heads;
      for (int h = 0; h < s.n_heads; ++h) {
        const int kvh = h / group;
        std::vector<double> p(n_pos);
        double mx = -1e300, sum = 0;
        for (int t = 0; t < n_pos; ++t) {
          double d = 0;
          for (int i = 0; i < s.head_dim; ++i) {
            d += double(q[h * s.head_dim + i]) * k[size_t(t) * kv_dim + kvh * s.head_dim + i];
          }
          p[t] = d / std::sqrt(double(s.head_dim));
          mx = std::max(mx, p[t]);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int i = 0; i < s.head_dim; ++i) {
          double ref = 0;
          for (int t = 0; t < n_pos; ++t) {
            ref += p[t] / sum * v[size_t(t) * kv_dim + kvh * s.head_dim + i];
          }
          // Scores of size ~|q||k| ~ 20 lose ~1e-6 relative in f32, amplified by exp: 2e-5 abs
          // on outputs of order 1.
          EXPECT_NEAR(out[h * s.head_dim + i], ref, 2e-5)
              << "heads " << s.n_heads << "/" << s.n_kv_heads << " n_pos " << n_pos << " h " << h;
        }
      }
    }
  }
}

// --- silu_mul ------------------------------------------------------------------------------------

TEST(CpuOps, SiluMulMatchesDouble) {
  auto g = randn(1536, 41, 4.0f);
  const auto u = randn(1536, 42, 2.0f);
  g[0] = 100.f;   // exp(-100) underflows to tiny: silu(x) == x
  g[1] = -100.f;  // exp(100) = 2.7e43 fits f32; silu -> -0
  g[2] = -200.f;  // exp(200) overflows to inf: silu must be -0, not NaN
  std::vector<float> out(g.size(), kNaN);
  cpu::silu_mul(out.data(), g.data(), u.data(), static_cast<int>(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const double ref = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    EXPECT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-7) << i;
    EXPECT_FALSE(std::isnan(out[i])) << i;
  }
}

// --- architecture ops: NeoX / frequency-factor RoPE, per-head norm, windowed attention, GELU ----

TEST(CpuOps, RopeExtNeoxAndFreqFactorsMatchDouble) {
  struct Shape {
    int n_heads, head_dim, rope_dim;
    float base;
    bool neox, factors;
  };
  for (const Shape& s :
       {Shape{4, 256, 256, 1e6f, true, false}, Shape{14, 64, 64, 1e6f, true, false},
        Shape{3, 64, 32, 10000.f, true, false}, Shape{8, 64, 64, 500000.f, false, true},
        Shape{2, 16, 16, 500000.f, true, true}}) {
    std::vector<float> ff(s.rope_dim / 2);
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.f + 31.f * float(i) / float(ff.size());
    for (int pos : {0, 1, 5, 511, 512, 4097, 30000}) {
      const int n = s.n_heads * s.head_dim;
      const auto v0 = randn(n, 200 + pos);
      std::vector<float> v = v0;
      cpu::rope_ext(v.data(), s.n_heads, s.head_dim, s.rope_dim, pos, s.base, s.neox,
                    s.factors ? ff.data() : nullptr);
      std::vector<double> ref(v0.begin(), v0.end());
      const int half = s.rope_dim / 2;
      for (int h = 0; h < s.n_heads; ++h) {
        for (int i = 0; i < half; ++i) {
          const int a = h * s.head_dim + (s.neox ? i : 2 * i);
          const int b = h * s.head_dim + (s.neox ? i + half : 2 * i + 1);
          double th = pos * std::pow(double(s.base), -2.0 * i / s.rope_dim);
          if (s.factors) th /= ff[size_t(i)];
          ref[a] = v0[a] * std::cos(th) - v0[b] * std::sin(th);
          ref[b] = v0[a] * std::sin(th) + v0[b] * std::cos(th);
        }
      }
      for (int i = 0; i < n; ++i) {
        EXPECT_NEAR(v[i], ref[i], 3e-6 * (std::fabs(ref[i]) + 1.0))
            << "neox " << s.neox << " factors " << s.factors << " pos " << pos << " i " << i;
      }
      if (pos == 0) {
        EXPECT_EQ(v, v0);
      }
    }
  }
  // NeoX really pairs (i, i + d/2): on a vector that is nonzero only in element 0 of the head,
  // rotation moves it to element rope_dim/2, not element 1.
  std::vector<float> e(16, 0.f);
  e[0] = 1.f;
  cpu::rope_ext(e.data(), 1, 16, 16, 1, 10000.f, true, nullptr);
  EXPECT_NEAR(e[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(e[8], std::sin(1.0), 1e-6);
  EXPECT_EQ(e[1], 0.f);
  // rope() is rope_ext(normal, no factors), bit for bit.
  auto a = randn(9 * 64, 7), b = a;
  cpu::rope(a.data(), 9, 64, 64, 123, 100000.f);
  cpu::rope_ext(b.data(), 9, 64, 64, 123, 100000.f, false, nullptr);
  EXPECT_EQ(a, b);
  // rope_angles + rope_apply (angles shared by a step's layers) is rope_ext, bit for bit.
  const std::vector<float> ff = {1.f, 1.5f, 4.f, 32.f};
  for (bool neox : {false, true}) {
    for (const float* f : {static_cast<const float*>(nullptr), ff.data()}) {
      auto c = randn(3 * 32, 8), d = c;
      std::vector<float> cs(8);
      cpu::rope_ext(c.data(), 3, 32, 8, 4097, 500000.f, neox, f);
      cpu::rope_angles(cs.data(), 8, 4097, 500000.f, f);
      cpu::rope_apply(d.data(), 3, 32, 8, neox, cs.data());
      EXPECT_EQ(c, d) << "neox " << neox << " factors " << (f != nullptr);
    }
  }
}

TEST(CpuOps, HeadRmsNormMatchesDouble) {
  for (auto [n_heads, hd] : {std::pair{4, 256}, std::pair{1, 256}, std::pair{8, 32}}) {
    const auto x = randn(size_t(n_heads) * hd, 300 + hd, 2.5f);
    auto w = randn(hd, 301);
    for (float& v : w) v += 1.f;
    std::vector<float> y = x;
    cpu::head_rmsnorm(y.data(), n_heads, hd, w.data(), 1e-6f);
    for (int h = 0; h < n_heads; ++h) {
      double ss = 0;
      for (int i = 0; i < hd; ++i) ss += double(x[h * hd + i]) * x[h * hd + i];
      const double s = 1.0 / std::sqrt(ss / hd + 1e-6);
      for (int i = 0; i < hd; ++i) {
        const double r = x[h * hd + i] * s * w[i];
        EXPECT_NEAR(y[h * hd + i], r, 1e-5 * std::fabs(r) + 1e-7) << h << " " << i;
      }
    }
  }
}

// qkv_finish is biases, then the per-head norms, then RoPE, the same arithmetic as those ops one
// by one (rope_ext at the row's position, which rope_angles + rope_apply equal bit for bit):
// qwen2's biases with neox pairs and a partial rope_dim, gemma3's norms, llama3's factors.
TEST(CpuOps, QkvFinishIsBiasThenHeadNormThenRope) {
  struct Case {
    bool bias, norm, neox, factors;
    int rope_dim;
  };
  const int nh = 6, nkv = 2, hd = 16, pos = 37;
  const float base = 10000.f, eps = 1e-6f;
  for (const Case c : {Case{true, false, true, false, 8}, Case{false, true, true, false, 16},
                       Case{false, false, false, true, 16}, Case{true, true, false, false, 16}}) {
    std::vector<float> q = randn(nh * hd, 1), k = randn(nkv * hd, 2), v = randn(nkv * hd, 3);
    const std::vector<float> bq = randn(nh * hd, 4), bk = randn(nkv * hd, 5),
                             bv = randn(nkv * hd, 6), qn = randn(hd, 7), kn = randn(hd, 8);
    std::vector<float> ff = randn(c.rope_dim / 2, 9);
    for (float& f : ff) f = 1.f + std::fabs(f);
    const float* factors = c.factors ? ff.data() : nullptr;
    std::vector<float> eq = q, ek = k, ev = v;
    if (c.bias)
      for (int i = 0; i < nh * hd; ++i) eq[i] += bq[i];
    if (c.bias)
      for (int i = 0; i < nkv * hd; ++i) ek[i] += bk[i], ev[i] += bv[i];
    if (c.norm) {
      cpu::head_rmsnorm(eq.data(), nh, hd, qn.data(), eps);
      cpu::head_rmsnorm(ek.data(), nkv, hd, kn.data(), eps);
    }
    cpu::rope_ext(eq.data(), nh, hd, c.rope_dim, pos, base, c.neox, factors);
    cpu::rope_ext(ek.data(), nkv, hd, c.rope_dim, pos, base, c.neox, factors);
    std::vector<float> cs(c.rope_dim);
    cpu::rope_angles(cs.data(), c.rope_dim, pos, base, factors);
    cpu::QkvFinishShape s;
    s.n_heads = nh, s.n_kv_heads = nkv, s.head_dim = hd, s.rope_dim = c.rope_dim, s.neox = c.neox;
    s.eps = eps;
    cpu::qkv_finish(q.data(), k.data(), v.data(), s, c.bias ? bq.data() : nullptr,
                    c.bias ? bk.data() : nullptr, c.bias ? bv.data() : nullptr,
                    c.norm ? qn.data() : nullptr, c.norm ? kn.data() : nullptr, cs.data());
    EXPECT_EQ(q, eq);
    EXPECT_EQ(k, ek);
    EXPECT_EQ(v, ev);
  }
}

TEST(CpuOps, WindowedAttentionWithScaleMatchesDoubleAndSkipsOldKeys) {
  struct Shape {
    int n_heads, n_kv_heads, head_dim;
  };
  const int page = 16;
  for (const Shape& s : {Shape{4, 1, 256}, Shape{4, 2, 32}, Shape{9, 3, 64}}) {
    for (auto [n_pos, window] : {std::pair{1, 8}, std::pair{8, 8}, std::pair{9, 8},
                                 std::pair{100, 8}, std::pair{100, 33}, std::pair{700, 512}}) {
      const int first = n_pos > window ? n_pos - window : 0;
      const int kv_dim = s.n_kv_heads * s.head_dim;
      const int n_pages = (n_pos + page - 1) / page;
      // Pages in reverse pool order; the pool holds only the pages the window touches plus the
      // last, and the slots before `first` hold NaN: a read of any of them poisons the output.
      std::vector<int> pages(n_pages);
      for (int i = 0; i < n_pages; ++i) pages[i] = n_pages - 1 - i;
      const auto q = randn(s.n_heads * s.head_dim, n_pos, 1.5f);
      auto k = randn(size_t(n_pages) * page * kv_dim, n_pos + 1, 1.5f);
      auto v = randn(size_t(n_pages) * page * kv_dim, n_pos + 2);
      auto row = [&](int t) { return (size_t(pages[t / page]) * page + t % page) * kv_dim; };
      for (int t = 0; t < first; ++t) {
        std::fill_n(&k[row(t)], kv_dim, kNaN);
        std::fill_n(&v[row(t)], kv_dim, kNaN);
      }
      const float scale = 1.f / std::sqrt(float(s.head_dim)) * 0.75f;
      std::vector<float> out(s.n_heads * s.head_dim, kNaN), scratch(n_pos, kNaN);
      cpu::attention_paged(out.data(), q.data(), k.data(), v.data(), pages.data(), page, n_pos,
                           s.n_heads, s.n_kv_heads, s.head_dim, scratch.data(), first, scale);
      const int group = s.n_heads / s.n_kv_heads;
      for (int h = 0; h < s.n_heads; ++h) {
        const int kvh = h / group;
        std::vector<double> p(n_pos, 0.0);
        double mx = -1e300, sum = 0;
        for (int t = first; t < n_pos; ++t) {
          double d = 0;
          for (int i = 0; i < s.head_dim; ++i)
            d += double(q[h * s.head_dim + i]) * k[row(t) + kvh * s.head_dim + i];
          p[t] = d * scale;
          mx = std::max(mx, p[t]);
        }
        for (int t = first; t < n_pos; ++t) sum += (p[t] = std::exp(p[t] - mx));
        for (int i = 0; i < s.head_dim; ++i) {
          double ref = 0;
          for (int t = first; t < n_pos; ++t) ref += p[t] / sum * v[row(t) + kvh * s.head_dim + i];
          EXPECT_NEAR(out[h * s.head_dim + i], ref, 2e-5)
              << "n_pos " << n_pos << " window " << window << " h " << h << " i " << i;
        }
      }
    }
  }
  // first = 0 and the default scale: bit-identical to the plain call.
  const auto q = randn(4 * 16, 1), k = randn(40 * 32, 2), v = randn(40 * 32, 3);
  std::vector<float> a(64), b(64), sc(40);
  cpu::attention_decode(a.data(), q.data(), k.data(), v.data(), 40, 4, 2, 16, sc.data());
  const int whole = 0;
  cpu::attention_paged(b.data(), q.data(), k.data(), v.data(), &whole, 40, 40, 4, 2, 16, sc.data(),
                       0, 0.f);
  EXPECT_EQ(a, b);
}

TEST(CpuOps, GeluTanhMulMatchesDouble) {
  auto g = randn(2048, 51, 3.0f);
  const auto u = randn(2048, 52, 2.0f);
  g[0] = 20.f;   // gelu(x) ~ x
  g[1] = -20.f;  // gelu(x) ~ -0
  g[2] = 0.f;
  g[3] = -200.f;  // exp overflows to inf: -0, not NaN
  std::vector<float> out(g.size(), kNaN);
  cpu::gelu_tanh_mul(out.data(), g.data(), u.data(), static_cast<int>(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const double x = g[i];
    const double ref =
        0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    EXPECT_NEAR(out[i], ref, 2e-6 * std::fabs(ref) + 1e-7) << i << " x " << x;
    EXPECT_FALSE(std::isnan(out[i]));
  }
  // Not the erf form: at x = -3 they differ by 4.2e-4 (-0.003637 vs -0.004050), 10% relative.
  const float x = -3.f, up = 1.f;
  float r = 0;
  cpu::gelu_tanh_mul(&r, &x, &up, 1);
  EXPECT_NEAR(r, -0.0036374, 2e-6);
  EXPECT_GT(std::fabs(r - (-3.0) * 0.5 * (1 + std::erf(-3.0 / std::sqrt(2.0)))), 3e-4);
}

// --- argmax --------------------------------------------------------------------------------------

TEST(CpuOps, ArgmaxEdgeCases) {
  const auto r = randn(49152, 77);
  int ref = 0;
  for (int i = 1; i < 49152; ++i) {
    if (r[i] > r[ref]) ref = i;
  }
  EXPECT_EQ(cpu::argmax(r.data(), 49152), ref);

  auto am = [](std::vector<float> v) { return cpu::argmax(v.data(), static_cast<int>(v.size())); };
  EXPECT_EQ(am({1, 3, 3, 2}), 1);        // ties -> lowest index
  EXPECT_EQ(am({kNaN, 1, 2, kNaN}), 2);  // NaN never wins
  EXPECT_EQ(am({2, kNaN, 1}), 0);
  EXPECT_EQ(am({kNaN, kNaN, kNaN}), 0);   // all NaN -> 0
  EXPECT_EQ(am({1, kInf, 5, kInf}), 1);   // +inf wins, first of ties
  EXPECT_EQ(am({-kInf, -kInf, -5}), 2);   // -inf loses to finite
  EXPECT_EQ(am({-kInf, -kInf}), 0);       // all -inf -> first
  EXPECT_EQ(am({kNaN, -kInf, kNaN}), 1);  // -inf beats NaN
  EXPECT_EQ(am({-0.0f, 0.0f}), 0);        // -0 == +0: a tie
  EXPECT_EQ(am({7}), 0);
}

// --- thread pool ---------------------------------------------------------------------------------

TEST(ThreadPool, RunsEveryTaskOnceAndPropagatesErrors) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> hits(37);
    pool.parallel_for(37, [&](int i) { hits[i].fetch_add(1); });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  EXPECT_THROW(pool.parallel_for(10,
                                 [](int i) {
                                   if (i == 7) fail("task 7");
                                 }),
               Error);
  // Still usable after an error.
  std::atomic<int> n{0};
  pool.parallel_for(5, [&](int) { n++; });
  EXPECT_EQ(n.load(), 5);
  EXPECT_EQ(&shared_thread_pool(2), &shared_thread_pool(2));  // persistent, not per call
}

// Calls back to back (workers still spinning) and calls after a pause (workers and the caller
// asleep on their condition variables): every task runs once either way, and tasks of one call
// really run on several threads.
TEST(ThreadPool, SpinningAndSleepingHandOffs) {
  ThreadPool pool(3);
  for (int round = 0; round < 400; ++round) {
    if (round % 100 == 99) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::vector<std::atomic<int>> hits(9);
    // Task 0 outlasts the spin window on some rounds, so the caller sleeps while it waits.
    pool.parallel_for(9, [&](int i) {
      if (i == 0 && round % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      hits[i].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "round " << round;
  }
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.parallel_for(3, [&](int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // every thread takes one
    std::lock_guard<std::mutex> lk(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 3u);
}

}  // namespace
}  // namespace smolrt
