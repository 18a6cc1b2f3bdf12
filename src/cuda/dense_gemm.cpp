#include "cuda/dense_gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "core/error.h"

namespace smolrt::cuda {
namespace {

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt ", what, " failed with status ", static_cast<int>(st));
}

cublasLtHandle_t lt(void* h) {
  return static_cast<cublasLtHandle_t>(h);
}

// Enough for the split-K and stream-K kernels the heuristics pick for short grids.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
// Heuristic candidates timed for a new shape: the first is often not the fastest for the short,
// wide products of served steps.
constexpr int kCandidates = 6;

}  // namespace

// One shape's descriptors and the algorithm the heuristics chose for it.
struct DenseGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

DenseGemm::DenseGemm() {
  cublasLtHandle_t h = nullptr;
  check(cublasLtCreate(&h), "handle creation");
  handle_ = h;
  workspace_bytes_ = kWorkspaceBytes;
  CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

DenseGemm::~DenseGemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(lt(handle_));
}

// Column-major view (cuBLAS's): y^T [rows x t] = W^T' [rows x cols] . x^T [cols x t], with W
// stored as a cols x rows column-major matrix (its rows are contiguous) and transposed: the
// "TN" layout, the tensor cores' native one.
const DenseGemm::Plan& DenseGemm::plan(const Key& k, const uint16_t* w, const uint16_t* x,
                                       const Launch& s) {
  auto& slot = plans_[k];
  if (slot) return *slot;
  const auto [rows, cols, t, ldx, ldy, half, acc] = k;
  auto p = std::make_unique<Plan>();
  check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
        "transa");
  check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
        "transb");
  check(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16F, cols, rows, cols), "layout W");
  check(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16F, cols, t, ldx), "layout x");
  check(cublasLtMatrixLayoutCreate(&p->c, half ? CUDA_R_16F : CUDA_R_32F, rows, t, ldy),
        "layout y");
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes_, sizeof(workspace_bytes_)),
        "workspace preference");
  cublasLtMatmulHeuristicResult_t res[kCandidates] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt(handle_), p->op, p->a, p->b, p->c,
                                                           p->c, pref, kCandidates, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check(st, "heuristic");
  if (found == 0)
    fail("cuBLASLt has no fp16 GEMM for ", rows, " x ", cols, " weights and ", t, " rows",
         acc ? " (accumulating)" : "");
  p->algo = res[0].algo;
  // Several candidates and a stream not being captured: time each (best of two runs after one
  // warm-up) into a scratch output, so the real one (a residual stream) is not touched.
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(s.stream, &cap));
  if (found > 1 && cap == cudaStreamCaptureStatusNone) {
    void* y = nullptr;
    CUDA_CHECK(cudaMalloc(&y, size_t(t) * ldy * (half ? 2 : 4)));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    const float alpha = 1.f, beta = 0.f;
    float best = INFINITY;
    for (int i = 0; i < found; ++i) {
      float ms = INFINITY;
      for (int r = 0; r < 3; ++r) {
        CUDA_CHECK(cudaEventRecord(e0, s.stream));
        const cublasStatus_t rs =
            cublasLtMatmul(lt(handle_), p->op, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c,
                           &res[i].algo, workspace_, workspace_bytes_, s.stream);
        CUDA_CHECK(cudaEventRecord(e1, s.stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (rs != CUBLAS_STATUS_SUCCESS) break;  // a candidate that cannot run here
        float m = 0;
        CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
        if (r > 0) ms = std::min(ms, m);
      }
      if (ms < best) best = ms, p->algo = res[i].algo;
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaFree(y));
  }
  slot = std::move(p);
  return *slot;
}

void DenseGemm::run(const uint16_t* w, int rows, int cols, const uint16_t* x, int ldx, int t,
                    const DenseOut& o, const Launch& s) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (!w || !x || !o.y || rows <= 0 || cols <= 0 || t <= 0)
    fail("dense GEMM: null pointer or empty shape (", rows, " x ", cols, ", ", t, " rows)");
  if (!aligned(w) || !aligned(x) || !aligned(o.y) || cols % 8 || ldx % 8 || ldx < cols)
    fail("dense GEMM: operands must be 16-byte aligned with cols=", cols, " and ldx=", ldx,
         " multiples of 8 (ldx >= cols)");
  if (o.ldy < rows || o.ldy % (o.half ? 8 : 4))
    fail("dense GEMM: ldy=", o.ldy, " must cover ", rows, " rows and be 16-byte aligned");
  if (o.half && o.accumulate) fail("dense GEMM: accumulation needs an fp32 output");
  const Plan& p = plan({rows, cols, t, ldx, o.ldy, o.half, o.accumulate}, w, x, s);
  const float alpha = 1.f, beta = o.accumulate ? 1.f : 0.f;
  check(cublasLtMatmul(lt(handle_), p.op, &alpha, w, p.a, x, p.b, &beta, o.y, p.c, o.y, p.c,
                       &p.algo, workspace_, workspace_bytes_, s.stream),
        "matmul");
}

}  // namespace smolrt::cuda
