#!/usr/bin/env bash
# Multi-slice meshes (mesh.dcn_data) end to end, without a TPU:
#   1. the slow tests of tests/test_multislice.py: two CPU processes as two slices (gloo)
#      train like one process (prints the largest relative loss difference), and fsdp over
#      two v5e-16 slices sends parameter gathers over the data-center network;
#   2. chinchax compile of the 125m config for two v5e-16 slices with mesh.dcn_data=2: the
#      collectives line shows what crosses slices, the roofline what it costs (DCN time).
# Needs libtpu for the compiles (pip install -e ".[test]"). About 5-10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
"$PYTHON" -m pytest -q -s -m slow tests/test_multislice.py
"$PYTHON" -m chinchax.cli compile --slices 2 --topology v5e-16 --config=configs/train.py:125m \
  --config.mesh.dcn_data=2 --config.mesh.data=2 --config.mesh.fsdp=-1 \
  --config.train.global_batch_size=64 --no-eval
