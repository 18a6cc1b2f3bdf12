// SMOLRT_* environment switches and knobs: one parser and one error shape for all of them (the
// CUDA backend's options, the prefill GEMM's tuning knobs, the paths).
#pragma once

#include <string>

namespace smolrt {

// The variable's value, or "" when unset.
std::string env_string(const char* name);

// Unset or empty: def. "0", "false" or "off": false. Anything else: true.
bool env_flag(const char* name, bool def);

// Unset or empty: def. Otherwise a whole decimal integer in [lo, hi], or an Error naming the
// variable, its value, what the number means (`what`) and the range.
int env_int(const char* name, int def, int lo, int hi, const char* what);

}  // namespace smolrt
