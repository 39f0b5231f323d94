"""The ladder's validation run: the fitted law's allocation at a larger budget, held out.

After the grid is fitted, ``ladder.validate`` trains one more run at
C_val = ``ladder.validate_factor`` × the largest grid budget, with the
fitted law's N_opt(C_val) (the law ``chinchax plan --law fit.json`` would
use, :func:`chinchax.laws.parametric.law_from_dict`) made a shape by the ladder's
shape rule and given the ``ladder.hparams`` settings. Its row in
``results.jsonl`` carries ``"role": "validation"`` and its id starts with
``V``; the fit never uses it, and ``fit.json`` / ``fit.md`` compare its
measured final eval loss with the law's prediction
(:mod:`analysis.validation`). Extrapolating 3× past the grid is the
out-of-sample test Hoffmann et al. 2022 make with Chinchilla itself (Sec. 3.4).

A ladder with a unique-data axis (``ladder.unique_tokens``, :mod:`chinchax.ladder.repeat`)
trains a validation run fixed by its config instead (:func:`plan_fixed_validation`): no fit
is needed to place it.
"""

from __future__ import annotations

import json
import pathlib

from chinchax import console
from chinchax import errors
from chinchax.laws import parametric as laws
import chinchax.ladder.grid as grid
import chinchax.ladder.isotime as isotime
from chinchax.storage import lease as lease_lib
from chinchax.storage import paths as paths_lib
import chinchax.ladder.plan as plan_lib
import chinchax.ladder.pod as pod
import chinchax.ladder.repeat as repeat
import chinchax.ladder.worker as worker_lib


def plan_validation(plan: worker_lib.LadderPlan, fit_json: pathlib.Path) -> grid.LadderRun:
  """The validation run of ``plan`` for the law in ``fit_json``.

  Raises:
    ValueError: ``fit_json`` holds no law (neither Approach 3 nor an allocation).
    OSError: it cannot be read.
  """
  lc = plan.config.ladder
  law = laws.law_from_dict(json.loads(paths_lib.as_path(fit_json).read_text()), name="fit")
  C = lc.validate_factor * lc.c_max
  n_opt = float(law.optimal_allocation(C)[0])
  base = plan.config.train_config
  return grid.make_run(lc, base.train, C, n_opt, plan.vocab, role="validation", prefix="V",
                       batch_multiple=pod.batch_multiple_for(plan.config, len(plan.devices)))


def plan_fixed_validation(plan: worker_lib.LadderPlan) -> grid.LadderRun:
  """The validation run of a ladder with a unique-data axis, fixed by its config
  (:func:`chinchax.ladder.plan.fixed_validation_run`, which the ladder checks before its grid)."""
  return plan_lib.fixed_validation_run(plan)


def run_validation(plan: worker_lib.LadderPlan, fit_json: pathlib.Path,
                   owner: str | None = None) -> dict | None:
  """Trains (or finds) the validation run of an IsoFLOP or an IsoTime ladder (see
  :func:`train_validation`); returns its row, or None when it cannot run. A ladder with a
  unique-data axis trains :func:`plan_fixed_validation` (``fit_json`` is not read)."""
  if repeat.axis_of(plan.config.ladder):
    return train_validation(plan, plan_fixed_validation(plan), owner)
  if plan.config.ladder.budget_kind == "seconds":
    try:
      run, prediction = isotime.plan_validation(plan, fit_json)
    except (OSError, ValueError, errors.UserError) as e:
      console.warn(f"no validation run: cannot plan it from {fit_json} ({e})")
      return None
    return train_validation(plan, run, owner, extra=prediction)
  try:
    run = plan_validation(plan, fit_json)
  except (OSError, ValueError) as e:
    console.warn(f"no validation run: cannot read a law from {fit_json} ({e})")
    return None
  return train_validation(plan, run, owner)


def train_validation(plan: worker_lib.LadderPlan, run: grid.LadderRun,
                     owner: str | None = None, extra: dict | None = None) -> dict | None:
  """Trains (or finds) the validation run; returns its row, or None when it cannot run.

  A finished row of the same run in the table is returned as is (a rerun of
  the ladder trains it once); the row of another validation run (planned from an
  earlier fit, e.g. before a failed run was fixed) is moved out of the table. The
  run holds a lease like any grid run, so two
  processes never train it at once; one that finds it leased returns None.
  A run the law places outside what the ladder can train (fewer than
  ``ladder.min_steps`` steps, more tokens than the corpus) is skipped with a
  warning.

  ``extra`` (an IsoTime run's predicted loss and step time) is written into
  its row.

  Raises:
    Preempted, KeyboardInterrupt: as for a grid run (its lease is released).
  """
  table = plan.table
  table.refresh()
  for stale in sorted(i for i, r in table.rows.items()
                      if r.get("role") == "validation" and i != run.run_id):
    dest = table.set_aside(stale)  # an earlier fit's validation run: not this fit's test
    console.warn(f"the validation run {stale} was planned from an earlier fit; its row moved "
                 f"to {dest}")
  row = table.row(run.run_id)
  if row is not None and row.get("status") == "done":
    return row
  if run.seconds_budget is None and run.hparams.steps < plan.config.ladder.min_steps:
    console.warn(f"no validation run: {run.run_id} would take only {run.hparams.steps} steps "
                 f"(ladder.min_steps={plan.config.ladder.min_steps})")
    return None
  try:
    worker_lib.check_corpus(plan, [run])
  except Exception as e:  # the grid's data is there; only this run's size is in question
    console.warn(f"no validation run: {e}")
    return None
  leases = plan.leases(owner or lease_lib.worker_id())
  held = leases.try_claim(run.run_id)
  if held is None:
    console.warn(f"the validation run {run.run_id} is being trained by another worker")
    return None
  held.attempt = (row or {}).get("attempts", 0) + 1
  held.beat()
  if run.seconds_budget is None:
    size = f"D={run.D:,.0f} (C = {plan.config.ladder.validate_factor:g} × the largest budget)"
  else:
    size = (f"{run.seconds_budget:g} s ({plan.config.ladder.validate_factor:g} × the largest "
            f"budget), predicted loss {extra['predicted_loss']:.4f}")
  console.say(f"ladder  validation run {run.run_id}: d_model={run.shape.d_model} "
              f"n_layers={run.shape.n_layers} N={run.counts.total:,} {size}")
  row = worker_lib.run_under_lease(plan, run, held, plan.config.ladder.heartbeat_s)
  if row is None:
    return None
  row.update(extra or {})
  table.upsert(row)
  held.release()
  if row["status"] != "done":
    console.warn(f"the validation run {run.run_id} failed: {row['error']}")
    return None
  table.merge()
  return row
