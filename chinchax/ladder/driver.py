"""``run_ladder``: one process's ladder — the grid listing, a worker, the closing line.

``chinchax ladder`` in one process is one worker (:func:`chinchax.ladder.worker.work`)
with a progress bar over the grid's FLOPs; with ``ladder.worker`` it is one of
many, printing only its own runs. Either way a rerun skips recorded runs and
resumes unfinished ones from their checkpoints, and several processes on the
same workdir never train a run twice at once.
"""

from __future__ import annotations

import pathlib

import jax

from chinchax import console
from chinchax.train.metrics import log_spaced_steps
import chinchax.ladder.table as table_lib
import chinchax.ladder.tuning as tuning
import chinchax.ladder.worker as worker_lib


# Exit statuses of `chinchax ladder` besides 0 (every run done), 2 (a user error), 75 (preempted)
# and 130 (Ctrl-C); each is explained in one line when it happens.
INCOMPLETE_EXIT_CODE = 1   # local workers ended (died) with runs not recorded: rerun to resume
RUNS_FAILED_EXIT_CODE = 3  # every run recorded, some failed: the rest fitted, no validation run
WORKER_DIED_EXIT_CODE = 4  # a local worker died, the others recorded every run: fitted, validated


def failed_rows(table_path: pathlib.Path) -> list[dict]:
  """The grid runs recorded ``failed`` in the table at ``table_path`` (not the validation run)."""
  rows = table_lib.ResultsTable(table_path).rows.values()
  return sorted((r for r in rows if r.get("status") != "done" and r.get("role") != "validation"),
                key=lambda r: r["run_id"])


def describe(plan: worker_lib.LadderPlan) -> None:
  """Prints the grid: each run's shape, N, D and state."""
  lc = plan.config.ladder
  states = worker_lib.run_states(plan)
  n_done = sum(s == "done" for _, s in states)
  timed = lc.budget_kind == "seconds"
  span = (f"T = {lc.t_min:.3g} … {lc.t_max:.3g} s of training" if timed
          else f"C = {lc.c_min:.3g} … {lc.c_max:.3g} FLOPs")
  console.say(f"ladder  {len(plan.runs)} runs over {lc.n_budgets} budgets {span}; "
              f"{n_done} already done; results -> {plan.workdir / 'results.jsonl'}")
  shapes = (f"the 'ladder' shape rule at n_layers {lc.depths} (d_model in steps of 4, "
            f"≈ equal N across depths); steps = T / step time "
            f"({'a timed probe of each shape' if lc.step_time == 'probe' else lc.step_time})"
            if timed else "the 'ladder' shape rule (n_layers fixed, d_model in steps of 4)")
  console.say(f"        shapes: {shapes}; hyperparameters: ladder.hparams={lc.hparams!r}; "
              f"init: model.init={plan.config.train_config.model.init!r}")
  if tuning.tuned(lc):
    mults = ", ".join(f"×{m:g}" for m in tuning.multipliers(lc))
    console.say(f"        tuned: every run trains {lc.lr_trials} LR(s) ({mults} the rule's) × "
                f"{lc.seeds} seed(s) in one program; each point is its best LR's "
                f"{'mean over seeds' if lc.seeds > 1 else 'run'} (chinchax.ladder.tuning)")
  sparse = sparse_curve_line(plan)
  if sparse:
    console.warn(sparse)
  for r, state in states:
    c = r.counts
    note = "" if state == "pending" else f"  ({state})"
    hp = r.hparams
    size = (f"T={r.seconds_budget:g}s" if r.seconds_budget is not None
            else f"D={r.D:,.0f} D/N={r.D / c.total:.1f}")
    steps = "from its step time" if r.seconds_budget is not None else hp.steps
    console.say(f"        {r.run_id}: d_model={r.shape.d_model} n_layers={r.shape.n_layers} "
                f"n_heads={r.shape.n_heads} d_ff={r.shape.d_ff} N={c.total:,} {size} "
                f"lr={hp.peak_lr:.3g} batch={hp.global_batch_size} steps={steps}{note}")


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
  return (f"run {r.run_id} records only {k} curve eval(s) (train.eval_points={t.eval_points} "
          f"from train.eval_points_from={t.eval_points_from} of its {r.hparams.steps} steps): "
          f"Approach 1's envelope then covers few FLOP values; lower "
          f"train_config.train.eval_points_from (the ladder's default is 0.1)")


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
    rows = plan.table.rows
    total_c = sum(r.C_budget for r in plan.runs)
    done_c = sum(r.C_budget for r in plan.runs if rows.get(r.run_id, {}).get("status") == "done")
    bar = console.progress(total=round(total_c / 1e9), initial=round(done_c / 1e9), unit="GFLOP",
                           enabled=is_main and lc.progress)

    def on_row(row):
      if row["status"] == "done":
        timed = (f", trained {row['train_time_s']:.1f}s of {row['seconds_budget']:g}s "
                 f"({row['steps']} steps)" if row.get("train_time_s") is not None else "")
        bar.write(f"        {row['run_id']}: eval loss {row['final_eval_loss']:.4f} nats/token, "
                  f"{row['tokens_per_s']:,.0f} tokens/s, {row['wall_time_s']:.0f}s{timed}")
      bar.update(round(row["C_budget"] / 1e9))

    def on_claim(r, gen, attempt):
      n = sum(1 for x in plan.runs if x.run_id in plan.table.rows) + 1
      bar.set_description(f"run {n}/{len(plan.runs)} {r.run_id}")

    worker_lib.work(plan, on_claim=on_claim, on_row=on_row,
                    say=lambda m: bar.write(m) if is_main else None)
    bar.close()
  console.say(finish_line(plan), enabled=is_main)
  return plan.workdir / "results.jsonl"
