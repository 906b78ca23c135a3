# syntax=docker/dockerfile:1.7
# GPU image: training (CUDA PyTorch, DeepSpeed, optional flash-attn) and GPU evaluation. Same pinned set as
# the CPU image (infra/docker/constraints.txt) with the CUDA build of the same torch version.
#   docker build -f infra/docker/gpu.Dockerfile -t vtg-gpu:0.1.0 .
#   docker build -f infra/docker/gpu.Dockerfile --build-arg WITH_FLASH_ATTN=1 -t vtg-gpu:0.1.0-fa .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04
FROM ${CUDA_IMAGE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
# 1 = build flash-attn (needs nvcc from the -devel base; ~30+ min), 0 = sdpa attention.
ARG WITH_FLASH_ATTN=0
# Precompile DeepSpeed's fused ops for these architectures instead of JIT at the first step.
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"

ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false PREFECT_SERVER_ANALYTICS_ENABLED=false \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} TORCH_EXTENSIONS_DIR=/app/.cache/torch_extensions \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH

# Python 3.11 (the project's version), pdsh + openssh for `deepspeed --hostfile` multi-node launches,
# git for DVC/lineage, libgl/glib for OpenCV.
RUN apt-get update \
 && apt-get install -y --no-install-recommends software-properties-common \
 && add-apt-repository -y universe \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
      git pdsh openssh-client openssh-server libglib2.0-0 libgl1 curl ca-certificates build-essential ninja-build \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv

WORKDIR /app
COPY infra/docker/constraints.txt /tmp/constraints.txt
COPY pyproject.toml README.md ./
RUN pip install --index-url ${TORCH_INDEX} "torch==2.13.0" \
 && mkdir -p vtg flows beam_jobs training evaluation \
 && touch vtg/__init__.py flows/__init__.py beam_jobs/__init__.py training/__init__.py evaluation/__init__.py \
 && pip install -c /tmp/constraints.txt ".[infra]" "nvidia-ml-py>=12" \
 && pip install --no-deps -c /tmp/constraints.txt "scenedetect==0.7.2" \
 && if [ "$WITH_FLASH_ATTN" = "1" ]; then pip install --no-build-isolation "flash-attn>=2.7"; fi

COPY vtg ./vtg
COPY flows ./flows
COPY beam_jobs ./beam_jobs
COPY training ./training
COPY evaluation ./evaluation
COPY infra ./infra
COPY experiments ./experiments
COPY params.yaml ./
# The multi-node launcher reads /job/hostfile by default (mount the rendered infra/deepspeed hostfile there).
RUN pip install --no-deps -e . \
 && mkdir -p /job \
 && python -c "import torch, deepspeed, transformers, cv2; print('image ok: torch', torch.__version__, 'cuda', torch.version.cuda)"

CMD ["python", "-m", "vtg.config"]
