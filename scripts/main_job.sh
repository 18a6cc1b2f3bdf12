#!/usr/bin/env bash
# The main job: describe the default model (or a synth stand-in when offline), then generate.
set -euo pipefail
SMOLRT=${1:-build/smolrt}
"$SMOLRT" info
