#!/usr/bin/env bash
# The pod ladder's smallest budget on one GPU: every run of it (5 shapes, the ladder planned for
# one H100 by its dry run: budgets sized to 24 hours of it, DeepSeek's batch rule, the planner's
# microbatches / remat / loss chunks) trains 60 s of timed steps, each in its own process, on the
# embedded corpus at the ladder's 32,768-token vocabulary (no download); writes measured vs
# predicted step time per run to $OUT/pod_steps.{json,md} (benchmarks/pod_ladder_steps.py).
# About 6-8 minutes (5 runs × (60 s + start-up and compile)); a hard stop at 570 s.
#   OUT=/some/dir HARDWARE=h100 benchmarks/pod_ladder_gpu.sh
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" timeout -s TERM -k 20 570 python3 \
    benchmarks/pod_ladder_steps.py --hardware "${HARDWARE:-h100}" --seconds "${SECONDS_PER_RUN:-60}" \
    --work "$OUT/pod-steps" --out "$OUT/pod_steps.json" "$@" 2>&1 \
    | grep -vE "^(W|I)[0-9]{4}" | tee "$OUT/pod_steps.md"
