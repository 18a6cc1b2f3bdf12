// The CUDA engine's entry points: the multi-sequence engine (cuda_batch.cpp) that `serve` drives,
// and one sequence of it behind the Backend interface (backend/single_sequence.h) for `run`,
// `chat` and `bench`. One engine, so one KV geometry, ring rule and set of kernels for both.
#pragma once

#include <cstdint>
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
  // A many-row step whose prompt chunks' rows read at least this many keys in all (each row its
  // position + 1, less the keys it shares with other rows through cascade attention) runs their
  // attention as attention_prefill (64 queries share each key tile) and the other rows' as
  // attention_paged (one row per block), else every row's as attention_paged; a step of chunks
  // alone takes attention_prefill from kChunkAttnRows rows on (cuda_batch.cpp). Tests set 1 (any
  // chunk), INT_MAX (none) or a count between. The default: measured on SmolLM2-135M served with
  // a 1,000-token shared prefix (bench/results/2026-11-29-h200-spans-notes.md): fewer keys are
  // cheaper as attention_paged blocks beside the step's decodes than as a second launch.
  int64_t span_row_keys = 262144;
  // Rows of a many-row step whose sequences hold the same first pages (a cached prompt prefix)
  // take cascade attention (attention_paged's shared pass: the shared keys read once for all)
  // when at least cascade_rows rows share at least cascade_keys keys. Tests set 1 and 32 (any
  // shared tile) or INT_MAX (never).
  int cascade_rows = 8;
  int cascade_keys = 256;
};

// Throws Error when no GPU is present, when the GPU runs out of memory, or when the model has no
// CUDA kernels (naming the tensor and type, or the shape).
std::unique_ptr<BatchBackend> make_cuda_batch_backend_ex(const Model& m, const BatchOptions& opt,
                                                         const CudaOptions& copt);
// One sequence of that engine (opt: single_sequence_options, which tests may change further).
std::unique_ptr<Backend> make_cuda_backend_ex(const Model& m, const BatchOptions& opt,
                                              const CudaOptions& copt);

}  // namespace smolrt
