// The backend flags shared by `smolrt run`, `smolrt chat` and `smolrt bench`: --backend, --ctx,
// --threads, bound straight to the BackendOptions the command passes to make_backend().
#pragma once

#include <CLI/CLI.hpp>

#include "backend/backend.h"

namespace smolrt::app {

// A negative --ctx or --threads is a parse error naming the flag and the fix.
void add_backend_flags(CLI::App& sub, BackendOptions& o);

// --backend alone (cpu | cpu-ref | cuda | auto), for commands with their own options struct.
CLI::Option* add_backend_kind_flag(CLI::App& sub, std::string& kind);

}  // namespace smolrt::app
