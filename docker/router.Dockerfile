# The data-plane router (no Django at run time).
#   docker build -f docker/router.Dockerfile -t mu/router .
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN groupadd --system --gid 10001 app && useradd --system --uid 10001 --gid app --home /app app
WORKDIR /app
COPY pyproject.toml ./
COPY controlplane controlplane
COPY capacity capacity
COPY dataplane dataplane
COPY engine_model engine_model
RUN pip install . && python -c "import dataplane"
USER 10001
# 8080 tenants; 9090 operators (--admin-listen: /metrics), kept off the tenants' Service
EXPOSE 8080 9090
ENTRYPOINT ["python", "-m", "dataplane.router"]
