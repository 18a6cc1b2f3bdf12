// gemv_gate_up: the decode step's gate/up matvec pair with the activation product (gemv.h)
// against cpu::gemv and cpu::silu_mul / cpu::gelu_tanh_mul.
// Outputs are poisoned (NaN bytes) before each kernel runs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda/cuda_test_util.h"
#include "cuda/gemv.h"
#include "ops/op_table.h"
#include "quant/formats.h"
#include "test_util.h"

namespace smolrt::test::ops {
namespace {

TEST(KernelGateUp, SiluAndGeluMulMatchCpu) {
  REQUIRE_GPU();
  // The second shape of each type is wider than one pass: column slices over several warps.
  for (int act : {0, 1})
    for (GgmlType t : test::all_formats())
      for (bool wide : {false, true}) {
        const int rows = is_float(t) ? 172 : 1536,
                  cols = is_float(t)
                             ? (wide ? 2080 : 64)
                             : (block_of(t) == 256 ? (wide ? 2048 : 1024) : (wide ? 4608 : 576));
        for (bool norm : {true, false}) {
          SCOPED_TRACE(testing::Message()
                       << type_name(t) << " " << cols << " norm " << norm << " act " << act);
          RandMat wg(t, rows, cols, 21), wu(t, rows, cols, 22);
          std::vector<float> x = test::randn(cols, 23), nw = test::randn(cols, 24), xin = x;
          if (norm) cpu::rmsnorm(xin.data(), x.data(), nw.data(), cols, 1e-5f);
          std::vector<float> g, u, tg, tu, ref(rows);
          ref_gemv(wg.view, xin, g, tg);
          ref_gemv(wu.view, xin, u, tu);
          if (act == 0) {
            cpu::silu_mul(ref.data(), g.data(), u.data(), rows);
          } else {  // GELU, tanh approximation, in double
            for (int r = 0; r < rows; ++r) {
              const double v = g[r];
              ref[r] = (float)(0.5 * v *
                               (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) *
                               u[r]);
            }
          }
          Dev<float> dx(x), dnw(nw), out((size_t)rows);
          cuda::gemv_gate_up(wg.mat, wu.mat, dx.p(), norm ? dnw.p() : nullptr, 1e-5f, out.p(),
                             nullptr, act);
          std::vector<float> got = out.get();
          const float f = norm ? 2.f : 1.f;
          for (int r = 0; r < rows; ++r) {
            // |d(act(g)u)| <= |u|·1.13·dg + |act(g)|·du (silu' <= 1.1, gelu' <= 1.13)
            const float b =
                f * (1.13f * std::fabs(u[r]) * tg[r] + (std::fabs(g[r]) + 1.f) * tu[r]) +
                1e-6f * std::fabs(ref[r]) + 1e-7f;
            ASSERT_NEAR(got[r], ref[r], b) << "row " << r;
          }
        }
      }
}

}  // namespace
}  // namespace smolrt::test::ops
