// The backend flags shared by `smolrt run`, `smolrt chat` and `smolrt bench`: --backend, --ctx,
// --threads, bound straight to the BackendOptions the command passes to make_backend().
#pragma once

#include <CLI/CLI.hpp>

#include "backend/backend.h"

namespace smolrt::app {

void add_backend_flags(CLI::App& sub, BackendOptions& o);

// Error naming the flag and the fix for a negative --ctx or --threads (call before loading).
void check_backend_flags(const BackendOptions& o);

}  // namespace smolrt::app
