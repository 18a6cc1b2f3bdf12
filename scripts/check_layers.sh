#!/usr/bin/env bash
# The tree's layering, checked in CI: the kernel folder (src/cuda) knows pointers, shapes, DevMat
# and the Launch context; it includes nothing from the engine and above, and reads no environment.
# Lower layers never include higher ones. Prints each offending line; exit 1 when there is any.
set -uo pipefail
cd "$(dirname "$0")/.."
bad=0
check() {  # DIR PATTERN WHY
  local hits
  hits=$(grep -rnE "$2" "$1" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
  if [ -n "$hits" ]; then
    echo "layering: $3"
    echo "$hits"
    bad=1
  fi
}
check src/cuda '#include "(backend|model|runtime|server|app|tokenizer|gguf|grammar)/' \
  "src/cuda (kernels) includes the engine or a layer above it"
check src/cuda 'getenv|env_flag|env_int|#include "core/env.h"' "src/cuda reads the environment"
check src/quant '#include "(backend|model|runtime|server|app|tokenizer|cuda)/' \
  "src/quant includes a layer above it"
check src/core '#include "(backend|model|runtime|server|app|tokenizer|cuda|quant|gguf)/' \
  "src/core includes a layer above it"
check src/backend '#include "(runtime|server|app)/' "src/backend includes a layer above it"
check src/model '#include "(backend|runtime|server|app|cuda)/' "src/model includes a layer above it"
[ $bad -eq 0 ] && echo "layering: ok"
exit $bad
