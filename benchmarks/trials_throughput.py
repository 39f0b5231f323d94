"""Throughput of K trials in one compiled program against K separate runs, at ladder shapes.

    python benchmarks/trials_throughput.py [--variant default] [--k 1,2,4,8]
        [--batching vmap,loop] [--shapes 3] [--steps 20] [--repeats 5] [--pin 0] [--json OUT]

For a few shapes of a ladder variant's grid (smallest, middle and largest N,
each with its rule's batch and seq_len), it times the single run's jitted train
step and the K-trial step (``chinchax.train.trials``, LR multipliers spread
around ×1) on random token batches, in one process on one CPU device (``--pin``:
that core only, as a pinned ladder worker runs). Each figure is the median of
``--repeats`` blocks of ``--steps`` steps, blocks of all programs alternated so
host noise falls on all alike. It prints, as markdown, per shape and K:
ms per step, ms per trial-step, the ratio of K separate runs' time (K × the
single step, measured in the same script) to the K-trial step's (> 1: the
program is faster), and the useful throughput 6·N·tokens·K / step time (FLOP/s).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax
import numpy as np

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.model import sharding as sharding_lib
from chinchax.ladder import grid
import chinchax.train.spec as spec_lib
import chinchax.train.step as step_lib
import chinchax.train.trials as trials_lib


def multipliers(k: int) -> str:
  """K LR multipliers 2^u, u evenly spaced in [-(K-1)/2, (K-1)/2] (×1 alone for K = 1)."""
  return ",".join(f"{2.0 ** u:g}" for u in np.arange(k) - (k - 1) / 2.0)


def grid_runs(variant: str, n_shapes: int) -> list:
  """``n_shapes`` runs of the variant's grid spread over its N range (bytes tokenizer)."""
  lc = config_lib.get_ladder_variant(variant)
  base = lc.train_config
  runs = sorted(grid.plan_runs(lc.ladder, base.train, 257), key=lambda r: r.counts.total)
  idx = sorted({int(i) for i in np.linspace(0, len(runs) - 1, n_shapes).round()})
  return [runs[i] for i in idx], base


def run_config(base, run, k: int, batching: str):
  c = grid.run_config(base, run, pathlib.Path("/tmp/unused"))
  c.model.vocab_size = 257
  c.model.compute_dtype = "float32"
  c.budget.update(mode="steps", steps=1000)
  c.train.lr_multipliers = multipliers(k)
  c.train.trial_batching = batching
  return c


def time_blocks(programs: dict, batch, steps: int, repeats: int) -> dict:
  """Median seconds per step of each program, blocks alternated (after a compiling step)."""
  states = {}
  for name, prog in programs.items():
    states[name] = prog.init_state()
    states[name], m = prog.step(states[name], batch)
    jax.block_until_ready(m["loss"])
  times = {name: [] for name in programs}
  for _ in range(repeats):
    for name, prog in programs.items():
      t0 = time.perf_counter()
      for _ in range(steps):
        states[name], m = prog.step(states[name], batch)
      jax.block_until_ready(m["loss"])
      times[name].append((time.perf_counter() - t0) / steps)
  return {name: statistics.median(v) for name, v in times.items()}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--variant", default="default")
  ap.add_argument("--k", default="1,2,4,8")
  ap.add_argument("--batching", default="vmap,loop")
  ap.add_argument("--shapes", type=int, default=3)
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--pin", type=int, default=0, help="CPU core to pin to (-1: none)")
  ap.add_argument("--json", default="")
  args = ap.parse_args(argv)
  if args.pin >= 0 and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {args.pin})
  ks = [int(x) for x in args.k.split(",")]
  modes = [m for m in args.batching.split(",") if m]
  runs, base = grid_runs(args.variant, args.shapes)
  device = jax.devices()[:1]
  rows = []
  print(f"| shape (d_model×n_layers, N, B×T) | K | batching | ms/step | ms/trial-step | "
        f"K separate / K-trial | useful FLOP/s |")
  print("|---|---|---|---|---|---|---|")
  for run in runs:
    c1 = run_config(base, run, 1, "vmap")
    spec = spec_lib.resolve(c1, 1)
    mesh = sharding_lib.make_mesh(spec.mesh, device)
    programs = {"single": step_lib.build_program(c1, spec, mesh)}
    for k in ks:
      for mode in modes:
        if k == 1 and mode != modes[0]:
          continue
        ck = run_config(base, run, k, mode)
        trials = trials_lib.parse_trials(ck)
        programs[(k, mode)] = trials_lib.build_trials_program(ck, spec, mesh, trials)[0]
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 257, (spec.global_batch_size, spec.seq_len + 1)).astype(np.int32)
    batch = programs["single"].global_batch(tokens)
    med = time_blocks(programs, batch, args.steps, args.repeats)
    flops = budget.flops_6nd(spec.n_params, spec.tokens_per_step)
    s = run.shape
    label = (f"{s.d_model}×{s.n_layers}, {spec.n_params:,}, "
             f"{spec.global_batch_size}×{spec.seq_len}")
    print(f"| {label} | 1 | single | {med['single'] * 1e3:.2f} | {med['single'] * 1e3:.2f} | "
          f"1.00 | {flops / med['single']:.3g} |")
    for key, t in med.items():
      if key == "single":
        continue
      k, mode = key
      ratio = k * med["single"] / t
      print(f"| {label} | {k} | {mode} | {t * 1e3:.2f} | {t / k * 1e3:.2f} | {ratio:.2f} | "
            f"{k * flops / t:.3g} |")
      rows.append({"d_model": s.d_model, "n_layers": s.n_layers, "N": spec.n_params,
                   "global_batch_size": spec.global_batch_size, "seq_len": spec.seq_len,
                   "K": k, "batching": mode, "step_s": t, "single_step_s": med["single"],
                   "separate_over_trials": ratio, "useful_flops_per_s": k * flops / t})
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
