#!/usr/bin/env bash
# K trials per compiled program on one GPU: the default ladder's smallest, middle and largest
# shapes (d_model 8…68, batches of 11–36 sequences of 64 bytes), K = 1, 2, 4, 8, 16 trials stepped
# by vmap or by a loop in one program, against K separate single steps timed in the same script
# (benchmarks/trials_throughput.py; float32). On a CPU neither gains (docs/tuning.md);
# on a GPU these small kernels are launch-bound, which is where vmap should pay.
# Runs from the repository root with the repo on PYTHONPATH; writes $OUT/trials_gpu.{md,json}
# (default ./out). About 2-4 minutes; a hard stop at 400 s.
#   OUT=/some/dir benchmarks/trials_gpu.sh
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" timeout -s TERM -k 30 400 python3 \
    benchmarks/trials_throughput.py --pin -1 --k 1,2,4,8,16 --batching vmap,loop --shapes 3 \
    --steps 50 --repeats 5 --json "$OUT/trials_gpu.json" "$@" 2>&1 \
    | grep -vE "^(W|I)[0-9]{4}" | tee "$OUT/trials_gpu.md"
