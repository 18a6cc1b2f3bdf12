// The table-driven op test: every kernel that takes a weight format (cuda::X) against its CPU twin
// (cpu::X), for every format it takes and each of its shapes (as llama.cpp's test-backend-ops runs
// op x type x shape). tests/ops/X.cpp holds op X's shapes and check; test_ops.cpp runs the table,
// one GoogleTest case per (op, format, shape): Table/Ops.MatchesCpuTwin/<op>_<format>_<shape>.
#pragma once

#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda/gemv.h"
#include "quant/formats.h"

namespace smolrt::test::ops {

// rows x cols weights; t: activation rows (gemm), tokens (embed), 1 otherwise.
struct Shape {
  int rows = 0, cols = 0, t = 1;
};

struct Case {
  const char* op = "";
  GgmlType type = GgmlType::F32;
  Shape shape;
  uint32_t seed = 0;  // of the random weights and inputs
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.op << " " << type_name(c.type) << " " << c.shape.rows << "x" << c.shape.cols
      << " t=" << c.shape.t << " seed " << c.seed;
}

struct Op {
  const char* name;
  bool (*takes)(GgmlType);                 // the formats the kernel takes
  std::vector<Shape> (*shapes)(GgmlType);  // per format (block size)
  void (*check)(const Case&);              // gtest assertions
};

// One per file of tests/ops.
Op gemv_op();
Op gemm_op();
Op embed_op();
Op dequantize_op();

inline bool is_float(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}
inline int block_of(GgmlType t) {
  return type_info(t)->block_size;
}

// Formats with a per-block minimum (w = d*q + m): the kernels factor it out of the sum
// (d*sum(q*x) + m*sum(x)), and those two terms can each be several times sum|w*x| (with the
// tests' scales the offset is ~8 quant steps against a spread of 15-31), so the reordering error
// is bounded relative to that larger magnitude: a factor 8 on the bound.
inline float affine_factor(GgmlType t) {
  const bool affine =
      t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K;
  return affine ? 8.f : 1.f;
}

// The most x quantized to two int8 levels (qformat.h XQ: each element within max|x| / 64516 of
// its 32-column unit) can move row r of W·x: sum over units of sum|w| * that, +1% for the float
// rounding of the quantization itself.
inline double int8_x_bound(const float* row, const std::vector<float>& x, int64_t cols) {
  double qb = 0;
  for (int64_t b = 0; b < cols / 32; ++b) {
    double am = 0, aw = 0;
    for (int64_t c = 32 * b; c < 32 * b + 32; ++c) {
      am = std::max(am, (double)std::fabs(x[c]));
      aw += std::fabs((double)row[c]);
    }
    qb += 1.01 * aw * am / 64516.0;
  }
  return qb;
}

// Reference W·x (cpu::gemv_rows) plus a per-row error bound. The GPU sums in a different order
// than the CPU; fp32 reordering error is bounded by ~n·eps·Σ|w_j·x_j| and is
// ~sqrt(n)·eps·Σ|w_j·x_j| in practice, so 2e-5·Σ|w_j·x_j| (eps=6e-8, n<=8192: sqrt(n)·eps = 5.4e-6)
// is tight but never flaky; times affine_factor for formats with a minimum; plus int8_x_bound for
// the formats whose gemv quantizes x (cuda::gemv_int8_x).
inline void ref_gemv(const TensorView& w, const std::vector<float>& x, std::vector<float>& out,
                     std::vector<float>& tol) {
  out.assign(w.rows, 0.f);
  tol.assign(w.rows, 0.f);
  cpu::gemv_rows(out.data(), w, x.data(), 0, w.rows);
  std::vector<float> row(w.cols);
  const bool i8 = cuda::gemv_int8_x(w.type);
  for (int64_t r = 0; r < w.rows; ++r) {
    cpu::dequantize(w, r, row.data());
    double a = 0;
    for (int64_t c = 0; c < w.cols; ++c) a += std::fabs((double)row[c] * x[c]);
    tol[r] = (float)(2e-5 * affine_factor(w.type) * a + 1e-7 +
                     (i8 ? int8_x_bound(row.data(), x, w.cols) : 0.0));
  }
}

// y[t][r] = sum_k W[r][k] x[t][k] in double over cpu::dequantize's rows of W.
inline std::vector<double> ref_gemm(const TensorView& w, const std::vector<float>& x, int t) {
  const int n = (int)w.rows, k = (int)w.cols;
  std::vector<float> row(k);
  std::vector<double> y((size_t)t * n);
  for (int r = 0; r < n; ++r) {
    cpu::dequantize(w, r, row.data());
    for (int i = 0; i < t; ++i) {
      double s = 0;
      for (int j = 0; j < k; ++j) s += (double)row[j] * x[(size_t)i * k + j];
      y[(size_t)i * n + r] = s;
    }
  }
  return y;
}

}  // namespace smolrt::test::ops
