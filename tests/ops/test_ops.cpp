// Runs the op table (op_table.h): one case per (op, format, shape), named
// <op>_<format>_<rows>x<cols>[_t<t>], e.g. Table/Ops.MatchesCpuTwin/gemv_q4_k_576x1536.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "ops/op_table.h"
#include "test_util.h"

namespace smolrt::test::ops {
namespace {

// The ops, in the order their cases run.
const std::vector<Op>& table() {
  static const std::vector<Op> ops = {gemv_op(), gemm_op(), embed_op(), dequantize_op()};
  return ops;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const Op& op : table()) {
    uint32_t seed = 100;
    for (GgmlType t : test::all_formats()) {
      if (!op.takes(t)) continue;
      for (const Shape& s : op.shapes(t)) cases.push_back({op.name, t, s, seed++});
    }
  }
  return cases;
}

class Ops : public ::testing::TestWithParam<Case> {};

TEST_P(Ops, MatchesCpuTwin) {
  REQUIRE_GPU();
  const Case& c = GetParam();
  SCOPED_TRACE(testing::Message() << c.op << " " << type_name(c.type) << " " << c.shape.rows << "x"
                                  << c.shape.cols << " t=" << c.shape.t);
  const auto op = std::find_if(table().begin(), table().end(),
                               [&](const Op& o) { return std::string(c.op) == o.name; });
  ASSERT_NE(op, table().end()) << "no op " << c.op;
  op->check(c);
}

INSTANTIATE_TEST_SUITE_P(Table, Ops, ::testing::ValuesIn(all_cases()), [](const auto& i) {
  const Case& c = i.param;
  std::string n = std::string(c.op) + "_" + type_name(c.type) + "_" + std::to_string(c.shape.rows) +
                  "x" + std::to_string(c.shape.cols);
  if (c.shape.t != 1) n += "_t" + std::to_string(c.shape.t);
  return n;
});

}  // namespace
}  // namespace smolrt::test::ops
