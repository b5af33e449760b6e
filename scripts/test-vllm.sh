#!/usr/bin/env bash
# Real-vLLM tests (tests/runtime/test_vllm_real.py, test_sim_matches_vllm.py) in their own virtual
# environment (scripts/vllm-venv.sh makes or updates it), then `pytest -m vllm tests/runtime`.
#   scripts/test-vllm.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
bash scripts/vllm-venv.sh
PLUGINS=()
if ! "$VENV/bin/python" -c "import controlplane" 2>/dev/null; then
    PLUGINS=(-p no:django -W ignore::pytest.PytestConfigWarning)  # no Django project here
fi
exec "$VENV/bin/pytest" "${PLUGINS[@]}" -m vllm tests/runtime "$@"
