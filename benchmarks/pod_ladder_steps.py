"""Measured vs predicted step time of the pod ladder's smallest budget on this host's devices.

The ladder ``configs/ladder.py:VARIANT`` is planned for ``--hardware`` as its dry run plans it
(``chinchax.ladder.dryrun``: budgets, shapes, batch rule, the planner's microbatches, remat and
loss chunks); every run of its smallest budget then trains here for ``--seconds`` of timed
steps (``train.stop_after_s``; compilation excluded), each in its own process (``chinchax
train``), on the embedded corpus with the ladder's vocabulary size (``model.vocab_size``: the
step's shapes are the ladder's; no download). Per run: the predicted step time (the dry run's:
roofline, or ``ladder.step_time``'s calibration) beside the measured one, their ratio, MFU.

  python benchmarks/pod_ladder_steps.py --hardware h100 --seconds 60 --out out/pod_steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

from chinchax import config as config_lib
from chinchax.ladder import dryrun
from chinchax.ladder import grid
from chinchax.ladder import pod

REPO = pathlib.Path(__file__).resolve().parent.parent


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--variant", default="pod")
  p.add_argument("--hardware", default="h100", help="the target the ladder is planned for")
  p.add_argument("--budget-hours", type=float, default=24.0)
  p.add_argument("--seconds", type=float, default=60.0, help="timed training per run")
  p.add_argument("--work", default="runs/pod-steps")
  p.add_argument("--out", default="out/pod_steps.json")
  p.add_argument("--set", action="append", default=[], help="extra --config.KNOB=V of the runs")
  args = p.parse_args()
  c = config_lib.get_ladder_variant(args.variant)
  c.ladder.update(hardware=args.hardware, budget_hours=args.budget_hours)
  c.train_config.data.hf_name = c.train_config.data.hf_name or "unused"
  dry = dryrun.plan_dry_run(c)
  smallest = min(x.run.C_budget for x in dry.grid_costs)
  rows = []
  for cost in [x for x in dry.grid_costs if x.run.C_budget == smallest]:
    r = cost.run
    rc = grid.run_config(c.train_config, r, pathlib.Path(args.work))
    pod.apply_layout(rc, cost.layout)
    vocab = r.shape.vocab_size
    rc.data.update(source="stdlib", tokenizer="bytes", hf_name="")
    rc.model.vocab_size = vocab
    rc.train.update(stop_after_s=args.seconds, eval_every_s=0.0, checkpoint_every_s=0.0,
                    eval_points=0, eval_windows=16, curve_eval_windows=0, progress=False)
    rc.mesh.num_cpu_devices = 0 if pod.target(c.ladder).accelerator.kind != "cpu" else 1
    cfg_file = pathlib.Path(args.work) / f"{r.run_id}.json"
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    default = dict(_flat(json.loads(config_lib.base_config().to_json_best_effort())))
    flags = [f"--config.{k}={v}" for k, v in _flat(json.loads(rc.to_json_best_effort()))
             if default.get(k) != v]  # what differs from configs/train.py:default
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "chinchax.cli", "train",
                           f"--config={REPO}/configs/train.py:default", *flags, *args.set],
                          capture_output=True, text=True, env=dict(os.environ))
    summary_path = pathlib.Path(rc.workdir) / "summary.json"
    s = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    row = {"run_id": r.run_id, "shape": [r.shape.d_model, r.shape.n_layers], "N": r.counts.total,
           "global_batch_size": r.hparams.global_batch_size,
           "microbatches": cost.layout.microbatches, "remat": cost.layout.remat,
           "loss_chunk": cost.layout.loss_chunk, "predicted_step_s": cost.step_s,
           "predicted_source": dry.source, "measured_step_s": s.get("step_time_s"),
           "mfu": s.get("mfu"), "steps_timed": s.get("steps"), "wall_s": time.time() - t0,
           "exit": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:] if
           proc.returncode else None}
    if row["measured_step_s"]:
      row["measured_over_predicted"] = row["measured_step_s"] / row["predicted_step_s"]
    rows.append(row)
    print(json.dumps(row), flush=True)
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({"hardware": args.hardware, "variant": args.variant,
                             "budget": smallest, "model": dry.model, "runs": rows}, indent=2))
  print(f"{'run':<24} {'M':>3} {'remat':>5} {'predicted':>10} {'measured':>10} {'ratio':>6}")
  for row in rows:
    ms = row["measured_step_s"]
    print(f"{row['run_id']:<24} {row['microbatches']:>3} {row['remat']:>5} "
          f"{row['predicted_step_s'] * 1e3:>8.1f}ms "
          + (f"{ms * 1e3:>8.1f}ms {ms / row['predicted_step_s']:>6.2f}" if ms else "  failed"))
  return 0 if all(r["exit"] == 0 for r in rows) else 1


def _flat(d: dict, prefix: str = ""):
  """(dotted key, value) of a train config's JSON, for --config.KEY=VALUE flags."""
  for k, v in d.items():
    if isinstance(v, dict):
      yield from _flat(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


if __name__ == "__main__":
  sys.exit(main())
