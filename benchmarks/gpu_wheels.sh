#!/usr/bin/env bash
# Download, here, the wheels the lent GPU machine lacks into .whl/ (git-ignored), for benchmarks/gpu_check.py.
#
# The GPU machine (Python 3.12, torch 2.11+cu130, no network) has torch, numpy, scikit-learn, pandas, matplotlib,
# PyYAML, typer, rich, msgpack, grpcio, hypothesis, pytest and pytest-xdist (per the machine's own list of installed packages), but
# not what vflbench imports beside them: pydantic (with pydantic-core, annotated-types, typing-inspection and a
# typing-extensions new enough for them), cryptography (with cffi and pycparser: the net extra's mTLS), phe and
# gmpy2 (the he extra). Pinned to the versions this project's venv runs; cp312 manylinux x86_64 wheels.
#
#   bash benchmarks/gpu_wheels.sh            # here, once (needs PyPI)
#
# Then every device run starts with (and carries .whl and the MNIST folder, see gpu_check.py):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=$PWD/src:/tmp/site || exit;
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  phe==1.5.0 gmpy2==2.3.2
)
mkdir -p .whl
rm -f .whl/*.whl
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64 \
  --platform any -d .whl "${WHEELS[@]}"
ls -1 .whl
du -sh .whl
