// The sampling and stop flags shared by `smolrt run` and `smolrt chat`, named as llama.cpp names
// them. Defaults (llama.cpp's): --temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05
// --repeat-penalty 1.0 (off) --repeat-last-n 64 --presence-penalty 0 --frequency-penalty 0
// --seed -1 (random). --temp 0 is greedy. Values are checked by validate() (runtime/sampler.h).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/sampling.h"

namespace smolrt::app {

// Binds the flags to `p` and `stops` (--stop "str", repeatable).
void add_sampling_flags(CLI::App& sub, SamplingParams& p, std::vector<std::string>& stops);

}  // namespace smolrt::app
