// One sequence of a multi-sequence engine (batch.h) behind the single-sequence Backend interface:
// how `run`, `chat` and `bench` drive the CUDA engine that `serve` drives, so both run the same
// kernels, KV pool and step policies (graph replay, speculation of greedy steps).
//
// forward_token at an earlier position rolls the sequence back first; prompts go in steps of the
// engine's max_step_tokens(), every id checked before the first step runs (a bad prompt changes
// nothing).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/batch.h"

namespace smolrt {

// BatchOptions for an engine that serves one sequence of BackendOptions' context: one sequence,
// no prefix cache (a single sequence has nobody to share with; rollback keeps what it needs),
// pages of kSinglePageTokens.
BatchOptions single_sequence_options(const BackendOptions& opt);

// Greedy steps of one sequence are launched ahead (speculated) only while the next position stays
// in the current page, so a single sequence takes large pages: it crosses one every 256 tokens.
constexpr int kSinglePageTokens = 256;

// engine must be empty (no sequence added).
std::unique_ptr<Backend> make_single_sequence(std::unique_ptr<BatchBackend> engine);

}  // namespace smolrt
