#!/usr/bin/env bash
# Quick start: runs the main job against the sample project on the embedded SQLite default.
# The `run plan` driver is not built yet; until it lands this prints the version and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
./bin/tfstackplan version
echo "quick start: 'tfstackplan run plan' on examples/ is coming with the CLI issue"
