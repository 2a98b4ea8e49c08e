#!/usr/bin/env bash
# Performance where users train, one GPU: the at-scale rows with their peers, one part (under 9 min) per call.
#   bash bench/at_scale.sh list | <part> | tables | --check [--only GROUP ...]      (see bench/at_scale.py)
set -u
cd "$(dirname "$0")/.." && exec "${PYTHON:-python}" bench/at_scale.py "$@"
