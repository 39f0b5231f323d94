#!/usr/bin/env bash
# The IsoTime step-time table on one GPU (issue 25's device check): the `isotime` ladder's
# 27 shapes trained for 2-20 s each on the device (one worker, no validation run), then the
# leave-one-shape-out comparison of the FLOPs, bytes, FLOPs+bytes, FLOPs+bytes+layers and
# roofline predictors from `fit/fit.md`. Runs from the repository root with the repo on
# PYTHONPATH; writes to $OUT (default ./out). About 6-8 minutes; a hard stop at 540 s keeps
# the rows measured so far (rerun `chinchax fit $OUT/ladder/results.jsonl` on them).
#   OUT=/some/dir benchmarks/isotime_gpu.sh
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout -s TERM -k 30 540 python3 -m chinchax.cli ladder --config configs/ladder.py:isotime \
    --config.workdir="$OUT/ladder" --config.ladder.workers=1 --config.ladder.validate=False \
    --config.ladder.t_min=2 --config.ladder.t_max=20 --config.ladder.flops_per_s=2e11 \
    --config.ladder.progress=False "$@" 2>&1 | grep -vE "^(W|I)[0-9]{4}" | tee "$OUT/isotime.log"
sed -n '/## Step-time predictors/,/## Loss from shape/p' "$OUT/ladder/fit/fit.md" 2>/dev/null \
    | tee -a "$OUT/isotime.log"
