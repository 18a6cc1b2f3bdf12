// The fast CPU kernels (backend/cpu/kernels.h, fast path) against their oracle twins (ops.h), for
// every weight format, every SIMD level this CPU runs (the scalar fallback included) and odd
// shapes: row lengths not a multiple of the SIMD width (float formats), row counts not a multiple
// of the 16-row panel, input counts not a multiple of the register blocking, 1 and 3 threads.
//
// A fast matmul quantizes each input per 32-block to int8 (q = round(x / d), d = max|x| / 127), so
// it is checked two ways: against the oracle on the dequantized input q * d, which it must match
// to f32 rounding (the integer dot is exact; only the summation order differs), and against the
// oracle on the input itself, within the quantization's error. Results must also be bit-identical
// whatever else shares the call and however many threads run it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "cpu_test_util.h"

namespace smolrt {
namespace {

using cpu::Isa;

// The input as the fast path sees it: each 32-block rounded to multiples of max|x| / 127.
std::vector<float> quantized(const std::vector<float>& x, int64_t cols) {
  std::vector<float> out(x.size());
  for (size_t r = 0; r < x.size() / size_t(cols); ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* xb = x.data() + r * size_t(cols) + size_t(b) * 32;
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      for (int i = 0; i < 32; ++i) {
        const float q = std::clamp(std::nearbyint(xb[i] * id), -127.0f, 127.0f);
        out[r * size_t(cols) + size_t(b) * 32 + size_t(i)] = q * d;
      }
    }
  }
  return out;
}

bool is_float(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

struct Shape {
  int64_t rows, cols;
};

// The shapes each format is checked on: rows around the 16-row panel and the 8-row AVX2 pass;
// cols: whole blocks (a single one, an odd count) or, for the float formats, any length.
std::vector<Shape> shapes_for(GgmlType t) {
  if (is_float(t)) return {{1, 1}, {7, 9}, {17, 33}, {40, 100}, {33, 203}};
  if (t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K)
    return {{1, 256}, {17, 512}, {40, 768}};
  return {{1, 32}, {17, 96}, {40, 160}, {9, 576}};
}

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                           GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

class FastMatmul : public ::testing::TestWithParam<std::tuple<Isa, GgmlType>> {};

TEST_P(FastMatmul, MatchesOracleTwin) {
  const auto [isa, type] = GetParam();
  uint32_t seed = 100;
  for (const Shape& s : shapes_for(type)) {
    const test::OwnedTensor w = [&] {
      test::OwnedTensor t = test::make_tensor("w", s.rows, s.cols, type, seed++, 0.5f);
      t.view.data = t.bytes.data();
      return t;
    }();
    const int n = 11;  // a block of 8 (4 on AVX2: two) and a remainder of 3
    const std::vector<float> x = test::randn(size_t(n * s.cols), seed++);
    const std::vector<float> xq = is_float(type) ? x : quantized(x, s.cols);
    std::vector<float> twin(size_t(n * s.rows)), exact(twin.size());
    cpu::gemm(twin.data(), w.view, xq.data(), n, 1);
    cpu::gemm(exact.data(), w.view, x.data(), n, 1);
    // |w| . |x^|: the scale of each output's rounding error.
    std::vector<float> row(size_t(s.cols));
    std::vector<double> mag(twin.size());
    for (int64_t r = 0; r < s.rows; ++r) {
      cpu::dequantize(w.view, r, row.data());
      for (int j = 0; j < n; ++j) {
        double m = 0;
        for (int64_t k = 0; k < s.cols; ++k) m += std::fabs(row[k] * xq[j * s.cols + k]);
        mag[size_t(j * s.rows + r)] = m;
      }
    }
    const std::string where = std::string(cpu::isa_name(isa)) + " " + type_name(type) + " " +
                              std::to_string(s.rows) + "x" + std::to_string(s.cols);
    std::vector<float> first;
    for (int threads : {1, 3}) {
      auto k = cpu::make_fast_kernels(threads, isa, n, s.cols, 1);
      const cpu::WeightId id = k->add(w.view);
      std::vector<float> got(twin.size(), NAN);
      const cpu::MatTarget t[] = {{id, got.data()}};
      k->matmul(x.data(), n, t);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], twin[i], 2e-6 * mag[i] + 1e-30) << where << " output " << i;
      }
      // Far from the oracle on the unquantized input only by the int8 input rounding.
      EXPECT_LT(rel_l2(got, exact), is_float(type) ? 1e-5 : 2e-2) << where;
      // Each input alone gives the same bits as inside the batch, and so does any thread count.
      for (int j = 0; j < n; ++j) {
        std::vector<float> one(size_t(s.rows), NAN);
        const cpu::MatTarget t1[] = {{id, one.data()}};
        k->matmul(x.data() + j * s.cols, 1, t1);
        for (int64_t r = 0; r < s.rows; ++r)
          ASSERT_EQ(one[size_t(r)], got[size_t(j * s.rows + r)]) << where << " input " << j;
      }
      if (first.empty()) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << where << ": 1 and 3 threads differ";
      }
    }
  }
}

std::vector<std::tuple<Isa, GgmlType>> all_cases() {
  std::vector<std::tuple<Isa, GgmlType>> out;
  for (Isa isa : cpu::supported_isas())
    for (GgmlType t : kTypes) out.emplace_back(isa, t);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Levels, FastMatmul, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<std::tuple<Isa, GgmlType>>& p) {
                           return std::string(cpu::isa_name(std::get<0>(p.param))) + "_" +
                                  type_name(std::get<1>(p.param));
                         });

// Several targets of one call (the fast path quantizes the shared input once) give what each
// gives alone, with formats mixed as in llama.cpp's K-quant mixtures.
TEST(FastKernels, SharedInputTargetsMatchSeparateCalls) {
  for (Isa isa : cpu::supported_isas()) {
    auto k = cpu::make_fast_kernels(2, isa, 3, 256, 1);
    std::vector<test::OwnedTensor> ws;
    const GgmlType types[] = {GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16};
    const int64_t rows[] = {48, 17, 33, 5};
    for (int i = 0; i < 4; ++i)
      ws.push_back(test::make_tensor("w", rows[i], 256, types[i], 7 + i, 1));
    std::vector<cpu::WeightId> ids;
    for (test::OwnedTensor& w : ws) {
      w.view.data = w.bytes.data();
      ids.push_back(k->add(w.view));
    }
    const std::vector<float> x = test::randn(3 * 256, 3);
    std::vector<std::vector<float>> together(4), alone(4);
    std::vector<cpu::MatTarget> t;
    for (int i = 0; i < 4; ++i) {
      together[i].assign(size_t(3 * rows[i]), NAN);
      alone[i].assign(size_t(3 * rows[i]), NAN);
      t.push_back({ids[i], together[i].data()});
    }
    k->matmul(x.data(), 3, t);
    for (int i = 0; i < 4; ++i) {
      const cpu::MatTarget one[] = {{ids[i], alone[i].data()}};
      k->matmul(x.data(), 3, one);
      EXPECT_EQ(together[i], alone[i]) << cpu::isa_name(isa) << " target " << i;
    }
  }
}

TEST(FastKernels, UnsupportedTypeIsAnError) {
  auto k = cpu::make_fast_kernels(1, Isa::Scalar, 1, 256, 1);
  std::vector<uint8_t> bytes(84);
  const TensorView q2k{"blk.0.ffn_down.weight", GgmlType::Q2_K, 1, 256, bytes.data(), 84};
  try {
    k->add(q2k);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.ffn_down.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("q2_k"), std::string::npos) << e.what();
  }
}

// Attention over a scrambled paged pool (the rest NaN), with sliding windows starting inside a page
// and head sizes below, at and above the SIMD width, against the oracle's attention_paged.
TEST(FastKernels, AttentionMatchesOracle) {
  const int page = 5, n_pages = 12, max_pos = 40;
  const std::vector<int> pages = {7, 2, 11, 0, 5, 9, 3, 10};
  for (Isa isa : cpu::supported_isas()) {
    for (int hd : {8, 20, 64, 256}) {
      const int n_heads = 6, n_kv = 2, kv_dim = n_kv * hd, q_dim = n_heads * hd;
      const std::vector<float> k = test::randn(size_t(max_pos * kv_dim), 2),
                               v = test::randn(size_t(max_pos * kv_dim), 3);
      std::vector<float> kp(size_t(n_pages) * page * kv_dim, NAN), vp = kp;
      for (int t = 0; t < max_pos; ++t) {
        const size_t slot = size_t(pages[t / page]) * page + t % page;
        std::copy_n(k.begin() + t * kv_dim, kv_dim, kp.begin() + slot * kv_dim);
        std::copy_n(v.begin() + t * kv_dim, kv_dim, vp.begin() + slot * kv_dim);
      }
      // Four query rows: a short causal prefix, windows starting mid-page, the whole pool.
      const std::vector<cpu::AttnRow> rows = {{pages.data(), 0, 3},
                                              {pages.data(), 7, 23},
                                              {pages.data(), 12, 13},
                                              {pages.data(), 0, 40}};
      const std::vector<float> q = test::randn(rows.size() * q_dim, 1, 0.5f);
      const cpu::AttnShape shape{n_heads, n_kv, hd, page, 0.f};
      std::vector<float> want(q.size(), NAN), got(q.size(), NAN);
      cpu::make_ref_kernels(1, max_pos)
          ->attention(want.data(), q.data(), kp.data(), vp.data(), rows, shape);
      for (int threads : {1, 3}) {
        auto fast = cpu::make_fast_kernels(threads, isa, 4, 64, max_pos);
        fast->attention(got.data(), q.data(), kp.data(), vp.data(), rows, shape);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-5f)
              << cpu::isa_name(isa) << " head_dim " << hd << " " << i;
      }
    }
  }
}

TEST(FastKernels, GatedActivationsMatchOracle) {
  for (Isa isa : cpu::supported_isas()) {
    for (int64_t n : {1, 15, 100, 5000}) {
      std::vector<float> gate = test::randn(size_t(n), 4, 4.0f), up = test::randn(size_t(n), 5);
      gate[0] = -100.f;  // exp overflows in silu / underflows in gelu: no NaN
      for (FfnAct act : {FfnAct::Silu, FfnAct::GeluTanh}) {
        std::vector<float> want = gate, got = gate;
        cpu::make_ref_kernels(1, 1)->gated_act(act, want.data(), up.data(), n);
        cpu::make_fast_kernels(2, isa, 1, 32, 1)->gated_act(act, got.data(), up.data(), n);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_NEAR(got[i], want[i], 2e-6f * (1 + std::fabs(want[i])))
              << cpu::isa_name(isa) << " n " << n << " at " << i;
      }
    }
  }
}

TEST(FastKernels, IsaLevelsAndTheirOverride) {
  const std::vector<Isa> s = cpu::supported_isas();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.front(), Isa::Scalar);
#if defined(SMOLRT_HAVE_X86_KERNELS)
  __builtin_cpu_init();
  EXPECT_EQ(cpu::isa_supported(Isa::Avx2),
            __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2"));
  EXPECT_EQ(cpu::isa_supported(Isa::Avx512Vnni),
            cpu::isa_supported(Isa::Avx512) && __builtin_cpu_supports("avx512vnni"));
#else
  EXPECT_EQ(s.size(), 1u);  // the portable level only
#endif
  EXPECT_EQ(cpu::choose_isa(), s.back());
  ::setenv("SMOLRT_CPU_ISA", "scalar", 1);
  EXPECT_EQ(cpu::choose_isa(), Isa::Scalar);
  ::setenv("SMOLRT_CPU_ISA", "sse9", 1);
  try {
    cpu::choose_isa();
    ADD_FAILURE() << "no error for SMOLRT_CPU_ISA=sse9";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SMOLRT_CPU_ISA"), std::string::npos) << e.what();
  }
  ::unsetenv("SMOLRT_CPU_ISA");
}

}  // namespace
}  // namespace smolrt
