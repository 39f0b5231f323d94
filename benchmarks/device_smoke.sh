#!/usr/bin/env bash
# One prepared accelerator check: the default config with bf16 compute, then a ~125M-parameter
# model for a few steps with XLA and cuDNN attention at two batch sizes. Writes logs and
# summaries to $OUT (or ./out). Runs from the repository root with the repo on PYTHONPATH.
#   benchmarks/device_smoke.sh
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,/^[^#]/p' "$0" | sed '/^[^#]/d; s/^# \{0,1\}//'; exit 0; fi
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STORES=/tmp/chinchax-stores
python3 -c "import jax, flax, optax, orbax.checkpoint, grain, tensorstore, ml_collections; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" 2>&1 | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$OUT/env.txt"

run() {  # name, config, then chinchax train overrides
  local name="$1" config="$2"; shift 2
  echo "=== $name"
  timeout 240 python3 -m chinchax.cli train --config="$config" --config.data.store_root=$STORES \
      --config.workdir=/tmp/chinchax-runs/$name --config.train.progress=False "$@" 2>&1 \
      | grep -vE "^(W|I)[0-9]{4}" | tee "$OUT/$name.log" | tail -6
  cp /tmp/chinchax-runs/$name/summary.json "$OUT/$name.summary.json" 2>/dev/null
}

[ -n "${SKIP_DEFAULT:-}" ] || run default_bf16 configs/train.py:default --config.mesh.num_cpu_devices=0
for attn in xla cudnn; do
  for bs in 16 32; do
    run m125_${attn}_b${bs} configs/train.py:125m --config.mesh.num_cpu_devices=0 \
        --config.model.attention=$attn --config.train.global_batch_size=$bs \
        --config.budget.mode=steps --config.budget.steps=60 --config.train.log_every=20 \
        --config.train.eval_every=60 --config.train.eval_batches=1 --config.train.checkpoint_every=1000
  done
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = []
for f in sorted(out.glob("*.summary.json")):
    s = json.loads(f.read_text())
    rows.append(f"{f.name.split('.')[0]:22s} params={s['params_total']:>12,} tokens/s={s['tokens_per_s']:>12,.0f} "
                f"step={1e3*s['step_time_s']:8.1f}ms MFU={100*s['mfu']:6.2f}% eval={s['final_eval_loss']:.3f} wall={s['wall_s']:.0f}s")
(out / "table.txt").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
PY
