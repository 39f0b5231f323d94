"""``run_ladder``: one process's ladder — the grid listing, a worker, the closing line.

``chinchax ladder`` in one process is one worker (:func:`chinchax.ladder.worker.work`)
with the ladder's progress line (:mod:`chinchax.ladder.progress`); with ``ladder.worker`` it is one of
many, printing only its own runs. Either way a rerun skips recorded runs and
resumes unfinished ones from their checkpoints, and several processes on the
same workdir never train a run twice at once.
"""

from __future__ import annotations

import pathlib

import jax

from chinchax import console
from chinchax.train.metrics import log_spaced_steps
from chinchax.storage import atomic as files
import chinchax.ladder.progress as progress_lib
import chinchax.ladder.table as table_lib
import chinchax.ladder.tuning as tuning
import chinchax.ladder.worker as worker_lib


# Exit statuses of `chinchax ladder` besides 0 (every run done), 2 (a user error), 75 (preempted)
# and 130 (Ctrl-C); each is explained in one line when it happens.
INCOMPLETE_EXIT_CODE = 1   # local workers ended (died) with runs not recorded: rerun to resume
RUNS_FAILED_EXIT_CODE = 3  # every run recorded, some failed: the rest fitted, no validation run
WORKER_DIED_EXIT_CODE = 4  # a local worker died, the others recorded every run: fitted, validated
FIT_FAILED_EXIT_CODE = 5   # every run done, but the table could not be fitted (the reason warned)


def failed_rows(table_path: pathlib.Path) -> list[dict]:
  """The grid runs recorded ``failed`` in the table at ``table_path`` (not the validation run)."""
  rows = table_lib.ResultsTable(table_path).rows.values()
  return sorted((r for r in rows if r.get("status") != "done" and r.get("role") != "validation"),
                key=lambda r: r["run_id"])


GRID_LISTING = "grid.txt"  # the grid, one run per line, beside results.jsonl


def grid_lines(plan: worker_lib.LadderPlan) -> list[str]:
  """The grid, one line per run: its shape, N, D (or time budget), hyperparameters and state."""
  out = []
  for r, state in worker_lib.run_states(plan):
    c, hp = r.counts, r.hparams
    size = (f"T={r.seconds_budget:g}s" if r.seconds_budget is not None
            else f"D={r.D:,.0f} D/N={r.D / c.total:.1f}")
    steps = "from its step time" if r.seconds_budget is not None else hp.steps
    out.append(f"{r.run_id}: d_model={r.shape.d_model} n_layers={r.shape.n_layers} "
               f"n_heads={r.shape.n_heads} d_ff={r.shape.d_ff} N={c.total:,} {size} "
               f"lr={hp.peak_lr:.3g} batch={hp.global_batch_size} steps={steps}  ({state})")
  return out


def describe(plan: worker_lib.LadderPlan, full: bool = False) -> None:
  """Prints the ladder's header: what it trains, fits and validates, in three lines.

  The grid itself (each run's shape, N, D and state) goes to ``grid.txt`` in the workdir (a
  workdir that cannot be written keeps none); ``full`` (``ladder.status``) prints it instead
  and writes nothing.
  """
  lc = plan.config.ladder
  states = worker_lib.run_states(plan)
  n_done = sum(s == "done" for _, s in states)
  timed = lc.budget_kind == "seconds"
  budgets = sorted({r.seconds_budget if timed else r.C_budget for r in plan.runs})
  sizes = [r.counts.total for r in plan.runs]
  span = (f"T = {lc.t_min:.3g} … {lc.t_max:.3g} s of training" if timed
          else f"C = {lc.c_min:.3g} … {lc.c_max:.3g} FLOPs")
  console.say(f"ladder  {len(plan.runs)} runs: {len(budgets)} budgets {span} × "
              f"{len(plan.runs) // max(len(budgets), 1)} sizes (N = {min(sizes):,} … "
              f"{max(sizes):,}); {n_done} already done")
  rule = (f"n_layers {lc.depths}, steps from a step-time probe" if timed
          else "shapes 'ladder'")
  then = []
  if lc.fit:
    then.append("fit" if not timed else "fit L(N, time)")
    if lc.validate:
      then.append(f"validate at {lc.validate_factor:g} × C_max")
  tuned = (f"; {lc.lr_trials} LR(s) × {lc.seeds} seed(s) per run" if tuning.tuned(lc) else "")
  console.say(f"        {rule}, hparams {lc.hparams!r}, init "
              f"{plan.config.train_config.model.init!r}{tuned}"
              + (f"; then {', then '.join(then)}" if then else ""))
  sparse = sparse_curve_line(plan)
  if full:  # ladder.status: a read-only query writes nothing
    for line in grid_lines(plan):
      console.say(f"        {line}")
  else:
    listing = plan.workdir / GRID_LISTING
    try:
      files.write_atomic(listing, "\n".join(grid_lines(plan)) + "\n")
      console.say(f"        grid: {listing} (--config.ladder.status=True prints it)")
    except OSError:
      pass
  if sparse:
    console.warn(sparse)


MIN_CURVE_POINTS = 4  # fewer curve evals than this leave Approach 1 few FLOP values to read


def sparse_curve_line(plan: worker_lib.LadderPlan) -> str | None:
  """A warning when some run would record fewer than :data:`MIN_CURVE_POINTS` curve evals
  (``train.eval_points`` log-spaced from ``train.eval_points_from`` of its steps), else None."""
  t = plan.config.train_config.train
  if t.eval_points <= 0 or plan.config.ladder.budget_kind == "seconds":  # no Approach 1 there
    return None
  k, fewest = min((len(log_spaced_steps(r.hparams.steps, t.eval_points, t.eval_points_from)), i)
                  for i, r in enumerate(plan.runs))
  if k >= MIN_CURVE_POINTS:
    return None
  r = plan.runs[fewest]
  return (f"run {r.run_id} records only {k} curve eval(s): Approach 1's envelope covers few FLOP "
          f"values; lower train_config.train.eval_points_from={t.eval_points_from}")


def finish_line(plan: worker_lib.LadderPlan) -> str:
  """``ladder  finished: K runs done, F failed; table PATH`` (or, before the end, the runs open)."""
  rows = plan.table.rows
  n_done = sum(1 for r in plan.runs if rows.get(r.run_id, {}).get("status") == "done")
  n_failed = sum(1 for r in plan.runs if r.run_id in rows) - n_done
  n_open = len(plan.runs) - n_done - n_failed
  head = f"ladder  {n_done} runs done, {n_failed} failed, {n_open} not recorded yet" if n_open \
      else f"ladder  finished: {n_done} runs done, {n_failed} failed"
  return f"{head}; table {plan.workdir / 'results.jsonl'}"


def run_ladder(config, devices=None) -> pathlib.Path:
  """Runs (or resumes) the ladder of ``config`` in this process; returns the results-table path.

  With ``ladder.worker`` this process is one of many workers sharing the
  workdir. The fit of the table is the caller's (``chinchax ladder`` runs it
  when ``ladder.fit`` is set).

  Raises:
    ConfigError: invalid ladder or training config, a budget whose runs are
      shorter than ``ladder.min_steps``, before any run starts.
    DataError: the corpus cannot feed the largest D without repetition.
    Preempted: SIGTERM stopped a run after its checkpoint (its lease released).
  """
  lc = config.ladder
  plan = worker_lib.prepare(config, devices)
  is_main = jax.process_index() == 0
  if lc.worker:
    worker_lib.work(plan, say=lambda m: console.say(m, enabled=is_main))
  else:
    if is_main:
      describe(plan)
    bar = (progress_lib.LadderProgress(plan, failures=False) if is_main and lc.progress
           else None)
    write = bar.write if bar is not None else (lambda m: console.say(m, enabled=is_main))
    if bar is not None:
      bar.update()
    worker_lib.work(plan, on_claim=lambda *claim: None,
                    on_row=lambda row: bar.update() if bar is not None else None, say=write)
    if bar is not None:
      bar.close()
  console.say(finish_line(plan), enabled=is_main)
  return plan.workdir / "results.jsonl"
