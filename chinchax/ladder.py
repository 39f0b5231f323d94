"""A miniature Chinchilla ladder: IsoFLOP grid → runs → one results table → fit.

For each FLOP budget C of a geometric grid, ``sizes_per_budget`` model sizes N
are spread log-uniformly around the predicted optimum N_opt(C) (the optimum
in the middle of the spread). Each (C, N) becomes a concrete shape by the
shape rule's ``"ladder"`` preset (``chinchax.planning.shapes``) and trains on
D = C / (6N) tokens with its own cosine schedule spanning exactly its own
steps (``budget.mode = "flops"``). Every run has its own workdir and appends
one row to ``results.jsonl``; a rerun skips finished runs and resumes
unfinished ones from their checkpoints; a failed run is recorded as failed and
the ladder goes on. ``chinchax ladder`` then has the analysis package fit
Approaches 1–3 (Hoffmann et al. 2022, Sec. 3) to the table.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import time
import traceback

import jax
import numpy as np

from chinchax import budget
from chinchax import config as config_lib
from chinchax import console
from chinchax import train as train_lib
from chinchax.planning import shapes as shapes_lib


@dataclasses.dataclass(frozen=True)
class LadderRun:
  """One point of the IsoFLOP grid.

  Attributes:
    run_id: stable id, e.g. ``C1.00e+11_N31936``.
    C_budget: the IsoFLOP budget (FLOPs, C = 6·N·D).
    N_target: the size asked for by the grid (parameters).
    shape: the concrete shape (exact N from ``budget.param_counts``).
  """

  run_id: str
  C_budget: float
  N_target: float
  shape: budget.ModelShape

  @property
  def counts(self) -> budget.ParamCounts:
    return budget.param_counts(self.shape)

  @property
  def D(self) -> float:
    """Tokens for this run: C / (6 N) with N the total parameter count."""
    return self.C_budget / (6.0 * self.counts.total)


def plan_runs(lc, vocab_size: int, seq_len: int) -> list[LadderRun]:
  """The ladder's runs, budget by budget, smallest N first.

  N_opt(C) = sqrt(C / (6 · tokens_per_param)) (C = 6·N·D with D = ratio·N), and
  sizes N_opt · spread^u for ``sizes_per_budget`` values of u evenly in [-1, 1],
  each made a shape by the shape rule's ``"ladder"`` preset
  (:data:`chinchax.planning.shapes.PRESETS`). A size whose nearest shape is
  already taken in its budget moves to the nearest free one, so every budget
  has exactly ``sizes_per_budget`` sizes.
  """
  budgets = np.geomspace(lc.c_min, lc.c_max, lc.n_budgets)
  runs = []
  for C in budgets:
    n_opt = math.sqrt(C / (6.0 * lc.tokens_per_param))
    seen: set[int] = set()
    for u in np.linspace(-1.0, 1.0, lc.sizes_per_budget):
      shape = shapes_lib.propose_shapes(
          n_opt * lc.spread ** u, vocab_size=vocab_size, seq_len=seq_len,
          rule=shapes_lib.PRESETS["ladder"], k=1, exclude=frozenset(seen))[0].shape
      n = budget.param_counts(shape).total
      seen.add(n)
      runs.append(LadderRun(run_id=f"C{C:.2e}_N{n}", C_budget=float(C),
                            N_target=float(n_opt * lc.spread ** u), shape=shape))
  return runs


def validate_ladder(lc) -> None:
  """Checks the ladder section; raises ConfigError naming the bad value."""
  E = config_lib.ConfigError
  for k in ("c_min", "c_max", "tokens_per_param", "spread"):
    if not isinstance(lc[k], (int, float)) or not math.isfinite(lc[k]) or lc[k] <= 0:
      raise E(f"ladder.{k}={lc[k]!r} must be a positive number")
  if lc.c_max < lc.c_min:
    raise E(f"ladder.c_max={lc.c_max:g} is below ladder.c_min={lc.c_min:g}")
  if lc.spread <= 1:
    raise E(f"ladder.spread={lc.spread!r} must be > 1 (the N range is N_opt/spread … N_opt·spread)")
  if not isinstance(lc.n_budgets, int) or lc.n_budgets < 1:
    raise E(f"ladder.n_budgets={lc.n_budgets!r} must be a positive integer")
  if not isinstance(lc.sizes_per_budget, int) or lc.sizes_per_budget < 3:
    raise E(f"ladder.sizes_per_budget={lc.sizes_per_budget!r} must be an integer >= 3 "
            f"(a parabola needs three points)")
  if lc.min_steps < 1:
    raise E(f"ladder.min_steps={lc.min_steps!r} must be >= 1")


def run_config(base, run: LadderRun, workdir: pathlib.Path):
  """The training config of one ladder run: the base config with its shape and budget."""
  c = base.copy_and_resolve_references()
  s = run.shape
  c.model.update(d_model=s.d_model, n_layers=s.n_layers, n_heads=s.n_heads, d_ff=s.d_ff)
  c.budget.update(mode="flops", flops=run.C_budget, n_kind="total")
  c.workdir = str(workdir / "runs" / run.run_id)
  return c


class ResultsTable:
  """``results.jsonl`` with exactly one row per run id (rewritten atomically on each update)."""

  def __init__(self, path: pathlib.Path):
    self.path = pathlib.Path(path)
    self.rows: dict[str, dict] = {}
    if self.path.exists():
      for line in self.path.read_text().splitlines():
        if line.strip():
          row = json.loads(line)
          self.rows[row["run_id"]] = row

  def done(self, run_id: str) -> bool:
    return self.rows.get(run_id, {}).get("status") == "done"

  def upsert(self, row: dict) -> None:
    self.rows[row["run_id"]] = row
    tmp = self.path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in self.rows.values()))
    tmp.replace(self.path)


def _eval_curve(workdir: pathlib.Path, n_params: int, tokens_per_step: int) -> list[list[float]]:
  """[[FLOPs seen (6·N·tokens), eval loss], ...] from a run's metrics.jsonl."""
  curve = []
  path = workdir / "metrics.jsonl"
  if path.exists():
    for line in path.read_text().splitlines():
      row = json.loads(line)
      if "eval_loss" in row:
        curve.append([6.0 * n_params * row["step"] * tokens_per_step, row["eval_loss"]])
  return curve


def run_ladder(config, devices=None) -> pathlib.Path:
  """Runs (or resumes) the ladder of ``config``; returns the results-table path.

  The fit of the table is the caller's (``chinchax ladder`` runs it when
  ``ladder.fit`` is set).

  Raises:
    ConfigError: invalid ladder or training config, a budget whose runs are
      shorter than ``ladder.min_steps``, before any run starts.
    DataError: the corpus cannot feed the largest D without repetition.
  """
  lc = config.ladder
  validate_ladder(lc)
  base = config.train_config
  config_lib.validate(base)
  devices = list(jax.devices() if devices is None else devices)
  workdir = pathlib.Path(os.path.expanduser(config.workdir)).resolve()
  spec0 = train_lib.resolve(base, len(devices))
  vocab = spec0.model.vocab_size
  runs = plan_runs(lc, vocab, base.train.seq_len)
  per_step = base.train.global_batch_size * base.train.seq_len
  short = [r for r in runs if r.D / per_step < lc.min_steps]
  if short:
    r = short[0]
    raise config_lib.ConfigError(
        f"budget C={r.C_budget:.3g} gives run {r.run_id} only {r.D / per_step:.1f} steps of "
        f"{per_step} tokens (ladder.min_steps={lc.min_steps}); raise ladder.c_min or shrink the batch")
  # Data check up front: the smallest N of each budget reads the most tokens.
  one_step = dataclasses.replace(spec0, steps=1, tokens=per_step)
  train_split = train_lib.prepare_data(run_config(base, runs[0], workdir), one_step).train_split
  n_windows = (train_split.n_tokens - 1) // base.train.seq_len
  for r in runs:
    need = math.ceil(r.D / per_step) * base.train.global_batch_size
    if need > n_windows and not base.data.allow_repeat:
      raise config_lib.ConfigError(
          f"run {r.run_id} (budget C={r.C_budget:.3g}, N={r.counts.total:,}) needs D={r.D:,.0f} "
          f"tokens = {need / n_windows:.2f} epochs of the {train_split.n_tokens:,}-token training "
          f"split; lower ladder.c_max or set train_config.data.allow_repeat=True")

  workdir.mkdir(parents=True, exist_ok=True)
  table = ResultsTable(workdir / "results.jsonl")
  todo = [r for r in runs if not table.done(r.run_id)]
  total_c = sum(r.C_budget for r in runs)
  done_c = total_c - sum(r.C_budget for r in todo)
  is_main = jax.process_index() == 0
  console.say(f"ladder  {len(runs)} runs over {lc.n_budgets} budgets "
              f"C = {lc.c_min:.3g} … {lc.c_max:.3g} FLOPs; {len(runs) - len(todo)} already done; "
              f"results -> {table.path}")
  for r in runs:
    c = r.counts
    console.say(f"        {r.run_id}: d_model={r.shape.d_model} n_layers={r.shape.n_layers} "
                f"n_heads={r.shape.n_heads} d_ff={r.shape.d_ff} N={c.total:,} D={r.D:,.0f} "
                f"D/N={r.D / c.total:.1f}{'  (done)' if table.done(r.run_id) else ''}")
  bar = console.progress(total=round(total_c / 1e9), initial=round(done_c / 1e9), unit="GFLOP",
                         enabled=is_main and lc.progress)
  for i, r in enumerate(todo):
    bar.set_description(f"run {len(runs) - len(todo) + i + 1}/{len(runs)} {r.run_id}")
    cfg = run_config(base, r, workdir)
    cfg.train.progress = False
    t0 = time.time()
    row = {"run_id": r.run_id, "C_budget": r.C_budget, "N": r.counts.total,
           "N_non_embedding": r.counts.non_embedding,
           "shape": {"d_model": r.shape.d_model, "n_layers": r.shape.n_layers,
                     "n_heads": r.shape.n_heads, "d_ff": r.shape.d_ff, "vocab_size": vocab,
                     "seq_len": base.train.seq_len}}
    try:
      summary = train_lib.train(cfg, devices=devices, verbose=False)
      shape = r.shape
      row.update({
          "status": "done", "D": summary["tokens"], "steps": summary["steps"],
          "C_6nd": budget.flops_6nd(r.counts.total, summary["tokens"]),
          "C_appendix_f": budget.chinchilla_flops_per_token(shape) * summary["tokens"],
          "final_train_loss": summary["final_train_loss"],
          "final_eval_loss": summary["final_eval_loss"],
          "final_eval_bits_per_byte": summary["final_eval_bits_per_byte"],
          "eval_curve": _eval_curve(pathlib.Path(cfg.workdir), r.counts.total, per_step),
          "wall_time_s": time.time() - t0, "tokens_per_s": summary["tokens_per_s"],
          "mfu": summary["mfu"]})
    except KeyboardInterrupt:
      raise
    except Exception as e:  # one failed run must not stop the ladder
      row.update({"status": "failed", "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc(limit=5), "wall_time_s": time.time() - t0})
      console.say(f"\nrun {r.run_id} failed: {type(e).__name__}: {e}")
    if is_main:
      table.upsert(row)
      if row["status"] == "done":
        bar.write(f"        {r.run_id}: eval loss {row['final_eval_loss']:.4f} nats/token, "
                  f"{row['tokens_per_s']:,.0f} tokens/s, {row['wall_time_s']:.0f}s")
    bar.update(round(r.C_budget / 1e9))
  bar.close()
  n_failed = sum(1 for row in table.rows.values() if row.get("status") != "done")
  console.say(f"ladder  finished: {len(table.rows) - n_failed} runs done, {n_failed} failed; "
              f"table {table.path}")
  return table.path
