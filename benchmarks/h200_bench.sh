#!/usr/bin/env bash
# Issue 5 on one H200: `chinchax bench --config configs/bench.py:h200` — a ~110M (d_model 768,
# 12 layers) and a ~342M (d_model 1024, 24 layers) model, vocab 32768, seq_len 1024, bfloat16,
# XLA vs cuDNN attention, batch 32/16 (110M) and 16/8 (342M) sequences; each point in its own
# process. MFU against 989 TFLOP/s (dense bf16 peak, accelerator table entry h200).
# Runs from the repository root with the repo on PYTHONPATH; writes to $OUT (default ./out):
# results.jsonl, results.csv, summary.md, bench.json, 3 plots and bench.log (8 files), then
# prints a table of tokens/s and MFU. Takes about 5-7 minutes; a hard stop at 430 s keeps
# what was measured.
#   OUT=/some/dir benchmarks/h200_bench.sh
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Let each point's process use up to 92% of the 141 GB (the compiled memory check reads this limit).
# The XLA-attention points are the large ones: compiled for CPU, m350 at batch 16 needs 117 GB and
# m125 at batch 32 needs 90 GB (the [B, H, T, T] scores of 24/12 layers); cuDNN needs far less.
# A point over the limit is recorded `oom` without being run; each point runs in its own process.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
LOG="$OUT/bench.log"
{ python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1; } | tee "$LOG"
timeout -s TERM -k 30 430 python3 -m chinchax.cli bench --config configs/bench.py:h200 \
    --config.workdir="$OUT" --config.bench.hardware=h200 "$@" 2>&1 \
    | grep -vE "^(W|I)[0-9]{4}" | tee -a "$LOG"
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$LOG"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines() if l.strip()]
print(f"{'point':42s} {'params':>12s} {'ran':>6s} {'status':>8s} {'ms/step':>9s} {'p10-p90 ms':>15s} "
      f"{'tokens/s':>11s} {'MFU':>7s} {'peak GiB':>9s} {'compile s':>9s}")
for r in rows:
  if r["status"] != "ok":
    print(f"{r['name']:42s} {r.get('params_total') or 0:>12,} {'':>6s} {r['status']:>8s}  {str(r.get('error'))[:90]}")
    continue
  print(f"{r['name']:42s} {r['params_total']:>12,} {r['attention']:>6s} {'ok':>8s} {1e3 * r['step_time_s']:>9.1f} "
        f"{1e3 * r['step_time_p10_s']:>7.1f}-{1e3 * r['step_time_p90_s']:<7.1f} "
        f"{r['tokens_per_s']:>11,.0f} {100 * r['mfu']:>6.1f}% "
        f"{(r['memory_peak_bytes'] or 0) / 2**30:>9.1f} {r['compile_s']:>9.1f}")
PY
