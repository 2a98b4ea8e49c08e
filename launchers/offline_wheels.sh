#!/usr/bin/env bash
# Offline wheelhouse for an air-gapped GPU machine: downloads, on a machine with registry access, the Python 3.12
# wheels that a GPU machine with its own torch / triton (and no registry) needs to run this project, into .whl/
# (git-ignored). Copy the checkout with .whl/ to the GPU machine, then `. launchers/offline_env.sh` there.
# Versions are requirements.lock's (torchao is the float8 reference's in bench/reference.py, not a project
# dependency). torch and triton are not downloaded: the GPU machine's own builds are used.
#   bash launchers/offline_wheels.sh
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
