// The CUDA engine's entry points: the multi-sequence engine (cuda_batch.cpp) that `serve` drives,
// and one sequence of it behind the Backend interface (backend/single_sequence.h) for `run`,
// `chat` and `bench`. One engine, so one KV geometry, ring rule and set of kernels for both.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/batch.h"

namespace smolrt {

// Switches of the CUDA engine. The defaults are what users run; the tests turn them to check
// each path against the other.
struct CudaOptions {
  // false: plain launches every step (no CUDA graphs): the tests' reference for graph replay.
  bool use_graph = true;
  // false: no Programmatic Dependent Launch (tests check both orders of launch).
  bool pdl = true;
  // Greedy one-row steps launch the sequence's next step before the host has read the id (the
  // next step reads its token and position from the device slots this step's argmax fills); a
  // step() asking for exactly that adopts it, anything else drops it. Needs use_graph.
  bool speculate = true;
  // false: the residual GEMMs sum each output in one block in a fixed order (bit-reproducible, for
  // the tests that compare bits); on, they split K across blocks and add atomically (faster, the
  // last bits vary from run to run).
  bool split_k = true;
};

// Throws Error when no GPU is present, when the GPU runs out of memory, or when the model has no
// CUDA kernels (naming the tensor and type, or the shape).
std::unique_ptr<BatchBackend> make_cuda_batch_backend_ex(const Model& m, const BatchOptions& opt,
                                                         const CudaOptions& copt);
// One sequence of that engine (opt: single_sequence_options, which tests may change further).
std::unique_ptr<Backend> make_cuda_backend_ex(const Model& m, const BatchOptions& opt,
                                              const CudaOptions& copt);

}  // namespace smolrt
