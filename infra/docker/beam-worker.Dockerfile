# syntax=docker/dockerfile:1.7
# Beam SDK harness image for distributed runners: Dataflow (`--sdk_container_image`), Flink and Spark
# (`--environment_type=DOCKER --environment_config=<this image>`). The runner's workers start Beam's boot
# entrypoint from the official SDK image; the project's DoFns and their pinned dependencies are added on top.
#   docker build -f infra/docker/beam-worker.Dockerfile -t <registry>/vtg-beam-worker:0.1.0 .
ARG BEAM_SDK_IMAGE=apache/beam_python3.11_sdk:2.77.0
FROM ${BEAM_SDK_IMAGE}

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 OMP_NUM_THREADS=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends libglib2.0-0 libgl1 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/vtg
COPY infra/docker/constraints.txt /tmp/constraints.txt
COPY pyproject.toml README.md ./
COPY vtg ./vtg
COPY beam_jobs ./beam_jobs
COPY flows ./flows
COPY training ./training
COPY evaluation ./evaluation
# The DoFns need the project, not torch: install it without the training stack (no CUDA, no DeepSpeed).
RUN pip install -c /tmp/constraints.txt --no-deps . \
 && pip install -c /tmp/constraints.txt "apache-beam==2.77.0" "pydantic>=2.7" pyyaml "numpy>=2,<2.5" pillow \
      "opencv-python-headless>=4.10" "datasketch==2.0.0" "webdataset==1.0.2" tqdm rich matplotlib "dvc-s3==3.3.0" \
      "distributed==2026.8.0" \
 && pip install --no-deps -c /tmp/constraints.txt "scenedetect==0.7.2" \
 && python -c "import apache_beam, cv2, datasketch, distributed, beam_jobs, vtg; print('beam worker ok')"
# ENTRYPOINT stays the SDK image's /opt/apache/beam/boot.
