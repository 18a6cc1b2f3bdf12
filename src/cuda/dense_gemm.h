// Dense fp16 GEMMs on tensor cores through cuBLASLt, for the batches large enough to be bound by
// arithmetic (prompt chunks and served steps of many rows):
//   y[t][n] (=|+=) sum_k W[n][k] * x[t][k]
// W is an fp16 copy of a quantized matrix (dequantize, row-major [rows][cols]), x fp16
// activations [t][ldx], y fp32 or fp16 [t][ldy]; fp32 accumulation. With accumulate, y (fp32)
// is read and added to (the residual stream), in place.
//
// The kernel for a shape is chosen at its first call: cuBLASLt's heuristic candidates are timed
// on the call's operands and the fastest kept (the first candidate when the stream is being
// captured: a shape should first run outside a graph), so later calls of the shape run the same
// kernel and give the same bits within a process. No allocation per call after that: the
// workspace is allocated once. Calls may be captured in CUDA graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "cuda/launch.h"

namespace smolrt::cuda {

// fp16 copies of a layer's matrices for the dense GEMMs, row-major; nullptr when the engine keeps
// none. qkv stacks [Wq; Wk; Wv], gate_up [W_gate; W_up].
struct DenseLayer {
  const uint16_t* qkv = nullptr;      // [q_dim + 2 kv_dim][dim]
  const uint16_t* o = nullptr;        // [dim][q_dim]
  const uint16_t* gate_up = nullptr;  // [2 hidden_dim][dim]
  const uint16_t* down = nullptr;     // [dim][hidden_dim]
};

struct DenseOut {
  void* y = nullptr;
  int ldy = 0;
  bool half = false;        // fp16 output, else fp32
  bool accumulate = false;  // y += product (fp32 only)
};

class DenseGemm {
 public:
  DenseGemm();  // creates the cuBLASLt handle and the workspace; Error on failure
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // w: device fp16 [rows][cols] (16-byte aligned, cols a multiple of 8); x: device fp16 [t][ldx]
  // (ldx a multiple of 8, >= cols); out as DenseOut says (ldy a multiple of 8 for fp16, of 4 for
  // fp32, >= rows). Throws Error naming the bad argument.
  void run(const uint16_t* w, int rows, int cols, const uint16_t* x, int ldx, int t,
           const DenseOut& out, const Launch& stream);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int, int, bool, bool>;
  const Plan& plan(const Key& k, const uint16_t* w, const uint16_t* x, const Launch& s);
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace smolrt::cuda
