# A runtime pod on a GPU: vLLM's OpenAI server plus our prober (python -m dataplane.runtime.pod).
# The base is vLLM's own CUDA image, pinned; our package adds the prober and the launcher, which
# sets OMP_NUM_THREADS from the container's cgroup CPU limit.
#   docker build -f docker/runtime-vllm.Dockerfile -t mu/runtime-vllm .
FROM vllm/vllm-openai:v0.11.0
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/mu
COPY pyproject.toml ./
COPY controlplane controlplane
COPY capacity capacity
COPY dataplane dataplane
COPY engine_model engine_model
RUN pip install --no-deps . && python3 -c "import dataplane.runtime.pod"
RUN groupadd --system --gid 10001 app && useradd --system --uid 10001 --gid app --create-home app
USER 10001
EXPOSE 8000 8001
ENTRYPOINT ["python3", "-m", "dataplane.runtime.pod", "--engine", "vllm", "--host", "0.0.0.0", "--port", "8000", "--probe-port", "8001"]
