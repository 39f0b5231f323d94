"""`plan --hours` on this CPU: measured sweep → fitted step-time model → plan → tokens in the budget.

Usage: python benchmarks/plan_step_time_cpu.py OUT_DIR [HOURS] [--train] [--reuse]

1. Asks `chinchax plan --hours HOURS --hardware cpu` (roofline) which global
   batch the budget implies, then times 12 shapes (d_model 32–256, 2–6 layers)
   at ½×, 1× and 2× that batch with `chinchax.bench.measure_point` — the train
   step of `chinchax train`.
2. Scores the FLOPs-only and FLOPs+bytes step-time models on 4 held-out
   shapes (fitted on the other 8), and writes the 8 as a step-time file.
3. Plans twice with that file: from the model alone, and with `--calibrate 3`
   (the best candidates timed on this machine before choosing).
4. For each plan runs the chosen shape's train step back to back for HOURS of
   wall clock — the clock starts before compilation, as a real run's does —
   and compares the tokens done with the plan's D.
5. With --train, also runs `chinchax train` on the calibrated plan's written
   config (data pipeline, evals and checkpoints included) and reports its
   wall time against the budget.
--reuse takes the sweep of an earlier OUT_DIR/result.json instead of timing it again.

Writes OUT_DIR/result.json; prints every figure.
"""

import json
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from chinchax import bench
from chinchax.cost import budget
from chinchax.model import sharding as sharding_lib
from chinchax import train as train_lib
from chinchax.planning import measure as measure_lib
from chinchax.planning import shapes as shapes_lib
from chinchax.cost import step_time as step_time_lib
from chinchax.cost import work as work_lib

SEQ = 128
V = 257
# (d_model, n_layers, batch multiple of the planned batch B): 12 shapes at B/2, B and 2B.
SWEEP = [(32, 2, 1.0), (64, 2, 0.5), (64, 4, 1.0), (96, 3, 2.0), (128, 2, 1.0), (128, 6, 0.5),
         (160, 3, 1.0), (192, 4, 0.5), (48, 3, 1.0), (256, 2, 0.5), (96, 6, 1.0), (224, 3, 1.0)]
HELD_OUT = [2, 5, 8, 11]


def plan(hours: float, *extra: str) -> dict:
  res = subprocess.run([sys.executable, "-m", "chinchax.cli", "plan", "--hours", str(hours),
                        "--hardware", "cpu", "--json", *extra],
                       capture_output=True, text=True, check=True)
  return json.loads(res.stdout)


def run_for(p: dict, seconds: float) -> dict:
  """Train steps of the planned shape back to back for `seconds`, clock started before compile."""
  shape = budget.ModelShape(d_model=p["d_model"], n_layers=p["n_layers"], n_heads=p["n_heads"],
                            d_ff=p["d_ff"], vocab_size=V, seq_len=SEQ)
  c = measure_lib.step_config(shape, p["global_batch_size"], steps=1000)
  t_start = time.perf_counter()
  spec = train_lib.resolve(c, 1)
  mesh = sharding_lib.make_mesh(spec.mesh, jax.devices()[:1])
  program = train_lib.build_program(c, spec, mesh)
  step = program.step
  rng = np.random.default_rng(0)
  batch = program.global_batch(rng.integers(0, V, (spec.global_batch_size, SEQ + 1),
                                            dtype=np.int32))
  state = program.init_state()
  # As `chinchax train` runs: step i+1 is queued before step i is waited for.
  steps, first_done, pending = 0, None, None
  while True:
    state, m = step(state, batch)
    if pending is not None:
      jax.block_until_ready(pending)
      now = time.perf_counter()
      if now - t_start > seconds:
        break
      steps += 1
      if first_done is None:
        first_done = now - t_start
    pending = m["loss"]
  return {"steps": steps, "tokens": steps * spec.tokens_per_step, "startup_s": first_done,
          "mean_step_s": None if first_done is None else (seconds - first_done) / max(steps - 1, 1)}


def main():
  args = [a for a in sys.argv[1:] if not a.startswith("--")]
  out = pathlib.Path(args[0])
  hours = float(args[1]) if len(args) > 1 else 0.03
  out.mkdir(parents=True, exist_ok=True)
  seconds = hours * 3600
  B = plan(hours)["global_batch_size"]
  print(f"budget {hours} h = {seconds:.0f} s; the planned batch is {B} sequences", flush=True)

  rows = []
  previous = out / "result.json"
  if "--reuse" in sys.argv and previous.exists():
    rows = json.loads(previous.read_text())["rows"]
    B = json.loads(previous.read_text())["planned_batch"]
    print(f"reusing the {len(rows)} measured shapes of {previous}", flush=True)
  for d, L, mult in SWEEP[len(rows):]:
    s = shapes_lib.shape_for(d, L, vocab_size=V, seq_len=SEQ, accelerator=False)
    gbs = max(1, int(B * mult))
    r = bench.measure_point(measure_lib.step_config(s, gbs, steps=1000), warmup_steps=3,
                            timed_steps=12,
                            devices=jax.devices()[:1])
    if r["status"] != "ok":
      raise SystemExit(f"sweep point {d}×{L} b{gbs} failed: {r.get('error')}")
    rows.append({"d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads,
                 "d_ff": s.d_ff, "vocab_size": V, "seq_len": SEQ, "global_batch_size": gbs,
                 "tie_embeddings": True, "step_time_s": r["step_time_s"],
                 "startup_s": r["startup_s"], "step_time_spread": r["step_time_spread"]})
    print(json.dumps(rows[-1]), flush=True)
  prof = work_lib.ExecutionProfile.for_kind("cpu")
  errs = step_time_lib.heldout_errors(rows, HELD_OUT, profile=prof)
  for k, v in errs.items():
    print(f"held-out {k}: mean |error| {v['mean_abs_error']:.1%}, errors "
          f"{[f'{e:+.1%}' for e in v['errors']]}  ({v['model']})", flush=True)
  fit_rows = [r for i, r in enumerate(rows) if i not in HELD_OUT]
  path = out / "cpu_step_time.json"
  step_time_lib.write_step_time_file(path, fit_rows, hardware="cpu")

  result = {"hours": hours, "planned_batch": B, "rows": rows, "heldout": errs, "plans": {}}
  for name, extra in (("model", ()), ("calibrated", ("--calibrate", "3", "--write-config",
                                                     str(out / "planned.py"), "--workdir",
                                                     str(out / "run")))):
    t0 = time.perf_counter()
    p = plan(hours, "--step-time-model", str(path), "--candidates", "8", *extra)
    plan_s = time.perf_counter() - t0
    got = run_for(p, seconds)
    pred = p["D"]
    print(f"[{name}] plan ({plan_s:.0f} s): d_model {p['d_model']} × {p['n_layers']} layers, "
          f"batch {p['global_batch_size']}, predicted {p['step_time_s']:.4g} s/step, start-up "
          f"{p['startup_s']:.3g} s, D {pred:,}; measured {got['tokens']:,} tokens in "
          f"{seconds:.0f} s (start-up {got['startup_s']:.3g} s, then {got['mean_step_s']:.4g} s/step)"
          f" → {got['tokens'] / pred - 1:+.1%}",
          flush=True)
    if p.get("calibration"):
      for c in p["calibration"]:
        print(f"    calibration d_model {c['d_model']} × {c['n_layers']}: model "
              f"{c['model_step_time_s']:.4g} s vs measured {c['measured_step_time_s']:.4g} s "
              f"({c['model_error']:+.1%})", flush=True)
    result["plans"][name] = {"plan": p, "plan_seconds": plan_s, "measured": got,
                             "relative_error": got["tokens"] / pred - 1}

  if "--train" in sys.argv:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "chinchax.cli", "train", "--config",
                    str(out / "planned.py")], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    result["train_wall_s"] = wall
    print(f"chinchax train of the written config: {wall:.0f} s wall for D = "
          f"{result['plans']['calibrated']['plan']['D']:,} tokens vs the {seconds:.0f} s budget "
          f"({wall / seconds - 1:+.1%}; includes process start, data, evals and checkpoints)",
          flush=True)
  (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
