#!/usr/bin/env bash
# Run a command with the simulator's compiled modules (`make sim-native`, rebuilt first if any
# source changed) ahead of the sources, e.g.
#   scripts/sim-native.sh .venv/bin/python -m capacity.simulate --trace t.csv --policy apa --json
# PYTHONSAFEPATH keeps Python from putting the working directory (the sources) first.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
make -s -C "$ROOT" sim-native >&2
PYTHONSAFEPATH=1 PYTHONPATH="$ROOT/build/sim-native${PYTHONPATH:+:$PYTHONPATH}" exec "$@"
