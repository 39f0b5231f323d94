"""The loop at ladder scale: the default ladder → fit → plan --law fit.json → train its config.

Runs the default ladder (``configs/ladder.py:default``, without its own
validation run) unless its fit exists, then for each factor F (default 3 and
10) plans ``--flops F × ladder.c_max --hardware cpu --law <workdir>/fit/fit.json
--write-config``, trains the written config with ``chinchax train`` and compares
the measured final eval loss with the plan's predicted loss (bar: within ±2%,
the ladder's validation-run bar). Prints the plan (its recipe and departures)
and a table; writes ``<workdir>/recipe_loop.json``.

Usage:
  python benchmarks/recipe_loop.py [--workdir runs/recipe-loop] [--factors 3,10]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

from chinchax import config as config_lib

BAR = 0.02


def _cli(*args: str) -> str:
  """Runs ``python -m chinchax.cli ARGS`` and returns its stdout (raises on failure)."""
  out = subprocess.run([sys.executable, "-m", "chinchax.cli", *args], check=True,
                       capture_output=True, text=True)
  return out.stdout


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default="runs/recipe-loop")
  p.add_argument("--factors", default="3,10", help="budgets as multiples of ladder.c_max")
  args = p.parse_args(argv)
  work = pathlib.Path(args.workdir).resolve()
  fit_json = work / "fit" / "fit.json"
  c_max = config_lib.get_ladder_variant("default").ladder.c_max
  t0 = time.time()
  if not fit_json.exists():
    subprocess.run([sys.executable, "-m", "chinchax.cli", "ladder", "--config",
                    "configs/ladder.py:default", f"--config.workdir={work}",
                    "--config.ladder.validate=False"], check=True)
  ladder_s = time.time() - t0
  rows = []
  for f in (float(x) for x in args.factors.split(",")):
    C = f * c_max
    cfg = work / f"planned_{f:g}x.py"
    run_dir = work / f"planned_{f:g}x"
    plan_args = ["plan", "--flops", f"{C:g}", "--hardware", "cpu", "--law", str(fit_json)]
    print(_cli(*plan_args, "--write-config", str(cfg), "--workdir", str(run_dir)), flush=True)
    plan = json.loads(_cli(*plan_args, "--json"))
    t1 = time.time()
    subprocess.run([sys.executable, "-m", "chinchax.cli", "train", "--config", str(cfg),
                    "--config.train.progress=False"], check=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    measured, predicted = summary["final_eval_loss"], plan["predicted_loss"]
    rows.append({"factor": f, "C": C, "N": plan["N"], "D": plan["D"],
                 "seq_len": plan["seq_len"], "peak_lr": plan["peak_lr"],
                 "global_batch_size": plan["global_batch_size"],
                 "departures": plan["recipe"]["departures"] if plan["recipe"] else None,
                 "predicted_loss": predicted, "measured_loss": measured,
                 "final_eval_loss_se": summary.get("final_eval_loss_se"),
                 "rel_error": measured / predicted - 1.0, "train_wall_s": time.time() - t1})
  out = {"ladder_wall_s": ladder_s, "bar": BAR, "runs": rows}
  (work / "recipe_loop.json").write_text(json.dumps(out, indent=2))
  print(f"{'F':>4} {'C':>9} {'N':>8} {'D':>10} {'lr':>7} {'predicted':>9} {'measured':>9} "
        f"{'error':>7}")
  for r in rows:
    print(f"{r['factor']:>4g} {r['C']:>9.3g} {r['N']:>8,} {r['D']:>10,} {r['peak_lr']:>7.4f} "
          f"{r['predicted_loss']:>9.4f} {r['measured_loss']:>9.4f} {r['rel_error']:>+7.2%}")
  return 0 if all(abs(r["rel_error"]) <= BAR for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
