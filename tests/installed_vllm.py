"""The installed vLLM (`.venv-vllm`, `make vllm-venv`), for the router's tests that check their
reading of a request (images, content parts) against vLLM's own code in a subprocess.

`make test` runs while CI is still making `.venv-vllm`, so there they skip its check where it is
not made yet; `make test-vllm` runs them again with REQUIRE_VLLM=1, where a missing venv fails."""

import os
from pathlib import Path

import pytest

VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


def vllm_python(what: str) -> str | None:
    """The venv's python, or None (a failure under REQUIRE_VLLM=1) where it is not made."""
    if VLLM_PYTHON.exists():
        return str(VLLM_PYTHON)
    if os.environ.get("REQUIRE_VLLM"):
        pytest.fail(f"REQUIRE_VLLM=1 and no {VLLM_PYTHON}: {what} not checked")
    return None


def vllm_python_or_skip(what: str) -> str:
    """The venv's python; the test skips (after what it asserted already) where it is not made."""
    python = vllm_python(what)
    if python is None:
        pytest.skip(f"no .venv-vllm: {what} not checked")
    return python
