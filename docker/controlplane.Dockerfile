# The control plane: one image, three commands (web, Celery worker, Celery beat).
#   docker build -f docker/controlplane.Dockerfile -t mu/controlplane .
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN groupadd --system --gid 10001 app && useradd --system --uid 10001 --gid app --home /app app
WORKDIR /app
COPY pyproject.toml manage.py ./
COPY controlplane controlplane
COPY capacity capacity
COPY dataplane dataplane
COPY engine_model engine_model
COPY templates templates
RUN pip install . && python -c "import controlplane, capacity, dataplane"
USER 10001
EXPOSE 8000
# web: gunicorn with uvicorn workers, all set in controlplane/gunicorn.conf.py (a slow client costs
# a coroutine, not a thread; header and body deadlines). The Celery worker runs
# `celery -A controlplane worker`, beat runs `celery -A controlplane beat`.
CMD ["gunicorn", "--config", "controlplane/gunicorn.conf.py", "--bind", "0.0.0.0:8000"]
