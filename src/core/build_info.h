// Build facts stamped at configure time (CMake): the git commit the binary was built from.
#pragma once

namespace smolrt {
const char*
build_commit();  // short hash, "+dirty" when the tree had changes; "unknown" outside git
}  // namespace smolrt
