# syntax=docker/dockerfile:1.7
# CPU image: preprocessing (Beam DirectRunner / portable SDK harness), evaluation, flows, Prefect server and
# workers, the MLflow tracking server. Built from the project's own pyproject, every version pinned by
# infra/docker/constraints.txt.
#   docker build -f infra/docker/cpu.Dockerfile -t vtg-cpu:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
    PREFECT_SERVER_ANALYTICS_ENABLED=false TORCH_EXTENSIONS_DIR=/app/.cache/torch_extensions

# git: DVC and lineage (commit ids); libgl/glib: OpenCV's video I/O; curl: health checks by hand.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git libglib2.0-0 libgl1 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Dependencies first (cached across code changes): the pinned set, then the CPU torch wheel.
COPY infra/docker/constraints.txt /tmp/constraints.txt
COPY pyproject.toml README.md ./
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
 && mkdir -p vtg flows beam_jobs training evaluation \
 && touch vtg/__init__.py flows/__init__.py beam_jobs/__init__.py training/__init__.py evaluation/__init__.py \
 && pip install -c /tmp/constraints.txt ".[infra]" \
 && pip install --no-deps -c /tmp/constraints.txt "scenedetect==0.7.2"

# The project itself (editable, so `python -m flows` and prefect.yaml entrypoints resolve under /app).
COPY vtg ./vtg
COPY flows ./flows
COPY beam_jobs ./beam_jobs
COPY training ./training
COPY evaluation ./evaluation
COPY infra ./infra
COPY experiments ./experiments
COPY params.yaml ./
RUN pip install --no-deps -e . \
 && python -c "import cv2, torch, apache_beam, prefect, mlflow, deepspeed, transformers, psycopg2, dvc_s3; print('image ok')"

CMD ["python", "-m", "vtg.config"]
