# syntax=docker/dockerfile:1
# ccrk-search, CPU image. One image runs the search service (the default command, `ccrk serve`) and the
# indexer (`ccrk index ...`, `ccrk data synth`), both through the ONNX Runtime encoder: no torch inside.
#
#   docker build -t ccrk-search:cpu .
#   docker run --rm -p 127.0.0.1:8000:8000 -v ccrk-indexes:/var/lib/ccrk/indexes ccrk-search:cpu
#
# The GPU variant is Dockerfile.gpu. Settings: deploy/CONFIGURATION.md (every CCRK_ variable).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- build: a virtual environment with the runtime dependencies and the project installed ---------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/ccrk
ENV PATH=/opt/ccrk/bin:$PATH
WORKDIR /src
# Dependencies before sources: this layer is rebuilt only when the requirement lists change.
COPY constraints.txt ./
COPY deploy/requirements/ deploy/requirements/
RUN pip install -c constraints.txt -r deploy/requirements/cpu.txt
COPY pyproject.toml README.md ./
COPY ccrk_cli/ ccrk_cli/
COPY ccrk_settings/ ccrk_settings/
COPY indexer/ indexer/
COPY monitoring/ monitoring/
COPY model/ model/
COPY service/ service/
COPY store/ store/
COPY synthetic/ synthetic/
# --no-deps: pyproject.toml also lists the training stack (torch), which this image leaves out.
RUN pip install --no-deps . \
    && python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)" \
    && ccrk --help > /dev/null

# -- runtime: the environment, the default model, a non-root user ---------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# No system packages needed: the faiss-cpu, numpy and Pillow wheels bundle their native libraries (OpenMP,
# OpenBLAS), and apt's own libstdc++ serves ONNX Runtime.
RUN groupadd --system --gid 10001 ccrk \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/ccrk --shell /usr/sbin/nologin ccrk \
    && mkdir -p /var/lib/ccrk/models /var/lib/ccrk/indexes /var/lib/ccrk/data /var/lib/ccrk/state \
    && chown -R 10001:10001 /var/lib/ccrk
COPY --from=build /opt/ccrk /opt/ccrk
# The embedded default model, where CCRK_MODEL_DIR points; mount your own models over this folder.
COPY --from=build --chown=10001:10001 /src/model/pretrained/ccrk-demo /var/lib/ccrk/models/ccrk-demo
ENV PATH=/opt/ccrk/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    CCRK_HOST=0.0.0.0 \
    CCRK_PORT=8000 \
    CCRK_MODEL_DIR=/var/lib/ccrk/models/ccrk-demo \
    CCRK_INDEX_ROOT=/var/lib/ccrk/indexes \
    CCRK_HISTORY_DB=/var/lib/ccrk/state/monitoring.sqlite
WORKDIR /var/lib/ccrk
USER 10001:10001
# models: model directories; indexes: INDEX_ROOT (versions + CURRENT); data: catalogue images (their
# absolute paths are stored in the index, so indexer and service mount this at the same place);
# state: probe history when no Redis is configured.
VOLUME ["/var/lib/ccrk/models", "/var/lib/ccrk/indexes", "/var/lib/ccrk/data", "/var/lib/ccrk/state"]
EXPOSE 8000
# Healthy = ready: the model and an index version are loaded (/readyz answers 200, 503 before).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('CCRK_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["ccrk"]
CMD ["serve"]
