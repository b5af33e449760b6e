# A SIMULATED runtime pod (no GPU, no model) for load tests and what-if runs: the simulated engine
# plus the same prober. It says it is simulated in every response.
#   docker build -f docker/runtime-sim.Dockerfile -t mu/runtime-sim .
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN groupadd --system --gid 10001 app && useradd --system --uid 10001 --gid app --home /app app
WORKDIR /app
COPY pyproject.toml ./
COPY controlplane controlplane
COPY capacity capacity
COPY dataplane dataplane
COPY engine_model engine_model
# Of the package's dependencies the pod needs only its HTTP server's (pyproject.toml: uvicorn,
# httptools, uvloop), pinned here as tested; the control plane's (Django, Celery, ...) stay out.
RUN pip install --no-deps . && pip install "uvicorn==0.54.0" "httptools==0.9.0" "uvloop==0.23.0" \
    && python -c "import dataplane.runtime.sim, dataplane.runtime.pod"
USER 10001
EXPOSE 8000 8001
ENTRYPOINT ["python", "-m", "dataplane.runtime.pod", "--engine", "sim", "--host", "0.0.0.0", "--port", "8000", "--probe-port", "8001"]
