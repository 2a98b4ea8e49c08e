#!/usr/bin/env bash
# The Python packages the H200 machine lacks, as Python 3.12 wheels in .whl/ (git-ignored): that machine has
# torch 2.11, triton 3.6 and no registry, so every device call carries these (`carry: [".whl"]`, ~8 MB) and starts
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD
# Versions are requirements.lock's (torchao is the float8 reference's, not a project dependency).
#   bash bench/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
P=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl
   --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
lock() { grep -i "^$1==" requirements.lock; }
python3 -m pip download -q "${P[@]}" $(lock hydra-core) $(lock omegaconf) $(lock megatron-core) $(lock torchtitan) \
  $(lock tyro) $(lock docstring_parser) $(lock typeguard) $(lock torchdata) $(lock datasets) $(lock dill) \
  $(lock multiprocess) $(lock tomli) torchao==0.17.0
# antlr4 4.9.3 (hydra's pin) is published as a source archive only: build its pure-Python wheel here
python3 -m pip wheel -q --no-deps -w .whl $(lock antlr4-python3-runtime)
ls .whl
