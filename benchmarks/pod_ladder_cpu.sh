#!/usr/bin/env bash
# The pod ladder scaled down to CPU (configs/ladder.py:pod_cpu) end to end: 3 budgets × 3 sizes
# and a validation run on one CPU device through the pod ladder's code paths (BPE trained by the
# store builder, an HF-datasets directory of local files, microbatches > 1, a chunked loss,
# evals and checkpoints on the wall clock), then the fit. It is tests/test_pod_ladder.py's slow
# test; this script runs it and prints its wall time, the fit's a and the validation error.
# About 5 minutes on 2 idle cores; much more on busy ones.
#   benchmarks/pod_ladder_cpu.sh
set -euo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
python -m pytest -q -m slow tests/test_pod_ladder.py -k end_to_end -p no:cacheprovider \
  --basetemp="${TMPDIR:-/tmp}/pod_ladder_cpu" "$@"
echo "wall time: $(( $(date +%s) - start )) s"
fit="${TMPDIR:-/tmp}/pod_ladder_cpu/test_pod_cpu_ladder_runs_end_t0/ladder/fit"
python - "$fit" <<'PY'
import json, pathlib, sys
fit = json.loads((pathlib.Path(sys.argv[1]) / "fit.json").read_text())
v = fit.get("validation") or {}
for name in ("approach1", "approach2", "approach3"):
  a = (fit.get(name) or {}).get("a")
  print(f"{name}: a = {a}")
print("validation:", {k: v.get(k) for k in ("run_id", "predicted_loss", "measured_loss",
                                             "rel_error", "law")})
PY
