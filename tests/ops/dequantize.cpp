// dequantize: cuda::dequantize (a weight matrix to the fp16 copy the dense GEMMs read,
// dequantize.h) against cpu::dequantize row by row: every weight is the CPU value rounded to fp16
// (relative 2^-11, and subnormal-exact below fp16's normal range); the pitch's padding untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/dequantize.h"
#include "ops/op_table.h"
#include "test_util.h"

namespace smolrt::test::ops {
namespace {

std::vector<Shape> shapes(GgmlType) {
  return {{40, 512}};
}

void check(const Case& c) {
  const int rows = c.shape.rows, cols = c.shape.cols;
  RandMat m(c.type, rows, cols, c.seed);
  const int ldo = cols + 8;
  Dev<uint16_t> out((size_t)rows * ldo);
  cuda::dequantize(m.mat, out.p(), ldo, nullptr);
  const std::vector<uint16_t> got = out.get();
  std::vector<float> ref(cols);
  for (int r = 0; r < rows; ++r) {
    cpu::dequantize(m.view, r, ref.data());
    for (int col = 0; col < cols; ++col) {
      const float g = fp16_to_f32(got[(size_t)r * ldo + col]);
      ASSERT_LE(std::fabs(g - ref[col]), std::fabs(ref[col]) * 4.9e-4f + 6e-8f)
          << "row " << r << " col " << col;
    }
    for (int col = cols; col < ldo; ++col) ASSERT_EQ(got[(size_t)r * ldo + col], 0xffff);
  }
}

}  // namespace

Op dequantize_op() {
  return {"dequantize", [](GgmlType) { return true; }, shapes, check};
}

}  // namespace smolrt::test::ops
