// The backend flags shared by `smolrt run`, `smolrt chat` and `smolrt bench`: --backend, --ctx,
// --threads, --kv-type, --no-f16-weights, bound straight to the BackendOptions the command passes
// to make_backend().
#pragma once

#include <CLI/CLI.hpp>

#include "backend/backend.h"

namespace smolrt::app {

// A negative --ctx or --threads is a parse error naming the flag and the fix.
void add_backend_flags(CLI::App& sub, BackendOptions& o);
// --kv-type f16 | f32 (BackendOptions / BatchOptions::kv_half).
void add_kv_type_flag(CLI::App& sub, bool& kv_half);
// --no-f16-weights (BackendOptions / BatchOptions::f16_weights), for commands without the rest.
void add_f16_weights_flag(CLI::App& sub, bool& f16_weights);

// --backend alone (cpu | cpu-ref | cuda | auto), for commands with their own options struct.
CLI::Option* add_backend_kind_flag(CLI::App& sub, std::string& kind);

}  // namespace smolrt::app
