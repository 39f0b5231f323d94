"""``chinchax ladder``: run (or resume) an IsoFLOP ladder, then fit its results table.

    chinchax ladder [--config configs/ladder.py:VARIANT] [--config.ladder.KNOB=VALUE ...]

One process by default; ``--config.ladder.workers=K`` starts K local workers;
``--config.ladder.worker=True`` makes this process one of many workers sharing
the workdir (SLURM arrays, TPU VMs, GKE: ``launch/*_ladder*``);
``--config.ladder.status=True`` prints each run's state and exits, writing nothing;
``--dry-run`` (``--config.ladder.dry_run=True``) prices the ladder on ``ladder.hardware``
(each run's layout, memory, step time, hours and dollars, the totals, the expected
interval of a) and exits, writing nothing and reading no data.

Example:
  chinchax ladder --config configs/ladder.py:tiny --config.workdir=runs/ladder-tiny
  chinchax ladder --config.ladder.status=True
  chinchax ladder --config configs/ladder.py:pod --config.ladder.hardware=h100x8 --dry-run
"""

from __future__ import annotations

import os
import sys

import jax

from analysis.isoflop import approach3
from analysis.isoflop import precision as precision_lib
from analysis.isotime import fit as isotime_fit
from analysis import pipeline as fit_pipeline
from analysis import tuning as tuning_report
from chinchax import config as config_lib
from chinchax import console
from chinchax.runtime import distributed as distributed_lib
from chinchax import errors
from chinchax.runtime import interrupts
from chinchax.runtime import watchdog
from chinchax import ladder as ladder_lib
from chinchax.ladder import dryrun as dryrun_lib
from chinchax.storage import paths as paths_lib
from chinchax.runtime import jax_settings as runtime
from chinchax.tracking import wandblog
from chinchax.cli import fit as fit_cli
from chinchax.cli import flags as flags_lib


def _fit_once(config, table, devices=None, validate: bool = True) -> bool:
  """:func:`_fit` under this process's claim of the table's fit (``ladder_lib.claim_fit``):
  withdrawn when the fit is interrupted or fails, so that a rerun fits the table again.
  Returns whether the table was fitted."""
  try:
    with fit_cli.disk_full_guard(table.parent / "fit"):
      fitted = _fit(config, table, devices, validate)
  except BaseException:
    ladder_lib.settle_fit_claim(table, done=False)
    raise
  ladder_lib.settle_fit_claim(table, done=fitted)
  return fitted


def _finish(config, table, devices=None, may_fit: bool = True, died=()) -> int:
  """Names the failed runs, fits the table (``may_fit``: this process holds its fit claim) and
  trains the validation run when no run failed; returns the exit status (module doc)."""
  lc = config.ladder
  failed = ladder_lib.failed_rows(table)
  for row in failed:
    console.warn(f"run {row['run_id']} failed ({row.get('attempts', 1)} attempt(s)): "
                 f"{row.get('error', '')}")
  if lc.fit and may_fit:
    if failed:  # a partial fit is validated by nothing, least of all by an earlier fit's run
      rows = ladder_lib.ResultsTable(table)
      for run_id in sorted(i for i, r in rows.rows.items() if r.get("role") == "validation"):
        console.warn(f"the validation run {run_id} was planned from an earlier fit; its row "
                     f"moved to {rows.set_aside(run_id)}")
    fitted = _fit_once(config, table, devices, validate=lc.validate and not failed)
  else:
    fitted = True
  if failed:
    console.warn(f"{len(failed)} of the ladder's runs failed ("
                 f"{', '.join(r['run_id'] for r in failed)}): the fit leaves them out and no "
                 f"validation run is trained from it; fix the cause and rerun the same command "
                 f"(a run is retried until it has failed ladder.max_attempts={lc.max_attempts} "
                 f"times; move its rows/<run>.json away to retry it beyond that)")
    return ladder_lib.RUNS_FAILED_EXIT_CODE
  for line in died:
    console.warn(f"{line}; the other workers recorded every run")
  if not fitted:
    return ladder_lib.FIT_FAILED_EXIT_CODE
  if lc.fit and may_fit:
    _closing_block(config)
  return ladder_lib.WORKER_DIED_EXIT_CODE if died else 0


def _fit(config, table, devices=None, validate: bool = True) -> bool:
  """Approaches 1–3 (an IsoTime ladder: the step-time predictors, loss from shape and time,
  wider vs deeper; ``analysis.isotime.fit``) on the table into ``fit/`` beside it, then
  (``ladder.validate``) the validation run on ``devices`` (default: all) and its comparison,
  and for a tuned ladder the tuning report (``analysis.tuning``); a fit that fails keeps
  the runs (returns False; True when fitted). A ladder with a unique-data axis trains its
  validation run, fixed by its config, before the fit (``chinchax.ladder.repeat``)."""
  lc = config.ladder
  timed = lc.budget_kind == "seconds"
  out = table.parent / "fit"
  plan = None
  if validate and ladder_lib.unique_axis(lc):  # needs no fit: trained even if the fit fails
    plan = ladder_lib.prepare(config, devices, check_data=False)
    ladder_lib.run_validation(plan, out / "fit.json")
  try:
    if timed:
      plan = ladder_lib.prepare(config, devices, check_data=False)
      shape = fit_cli.ladder_flop_shape(plan.vocab, config.train_config.train.seq_len)
      isotime_fit.fit_isotime(table, out, flop_shape=shape, log=console.say, warn=console.warn)
    else:
      n_runs = len(ladder_lib.ResultsTable(table).rows)
      console.say(f"ladder  fitting Approaches 1–3 ({lc.bootstrap} bootstrap resamples, "
                  f"~{ladder_lib.duration(ladder_lib.fit_seconds(lc, n_runs))}); "
                  f"its lines: fit/fit.log")
      with _FitLog(out / "fit.log") as log:
        fit_pipeline.fit_results(table, out, n_bootstrap=lc.bootstrap, log=log,
                                 warn=lambda m: log(f"warning: {m}"), grid=lc.fit_grid or None)
  except errors.UserError as e:  # the runs are kept; `chinchax fit` can be rerun on the table
    console.warn(f"could not fit the table {table}: {e}; the runs are kept (rerun the same "
                 f"command, or chinchax fit {table}, once the cause is fixed)")
    return False
  if validate:
    plan = plan or ladder_lib.prepare(config, devices, check_data=False)
    if ladder_lib.run_validation(plan, out / "fit.json") is not None:
      if timed:
        isotime_fit.add_isotime_validation(table, out, log=console.say)
      else:
        with _FitLog(out / "fit.log") as log:
          fit_pipeline.add_validation(table, out, log=log)
  if ladder_lib.tuned(lc):  # a tuned ladder: best LR vs the rule, LR law, a untuned
    try:
      tuning_report.tuning_report(str(table), str(out), log=console.say)
    except errors.UserError as e:
      console.warn(f"no tuning report for {table}: {e}")
  try:  # train.wandb: the fit's figures and numbers into the ladder's W&B group
    wandblog.log_fit(config, out)
  except Exception as e:  # noqa: BLE001 — the fit on disk stands; W&B is a copy
    console.warn(f"the fit was not logged to Weights & Biases: {type(e).__name__}: {e}")
  return True


class _FitLog:
  """The fit's progress lines, appended to ``fit.log`` beside ``fit.json`` (the ladder's console
  shows its closing block instead, :func:`chinchax.ladder.closing_lines`)."""

  def __init__(self, path):
    self.path = path

  def __enter__(self):
    self.file = None
    if not paths_lib.is_url(str(self.path)):  # a bucket's fit keeps fit.json and fit.md only
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self.file = open(self.path, "a")
    return self

  def __call__(self, msg: str) -> None:
    if self.file is not None:
      self.file.write(msg + "\n")
      self.file.flush()

  def __exit__(self, *exc):
    if self.file is not None:
      self.file.close()


def _closing_block(config) -> None:
  """Prints the ladder's answer (:func:`chinchax.ladder.closing_lines`) when its fit exists."""
  lc = config.ladder
  fit_dir = paths_lib.as_path(config.workdir) / "fit"
  try:
    lines = ladder_lib.closing_lines(fit_dir, None if lc.budget_kind == "seconds" else lc.c_max)
  except (KeyError, TypeError, ValueError) as e:  # a fit.json of another layout: the files stand
    lines = [f"ladder  the fit is in {fit_dir} (fit.md, fit.json; no summary: "
             f"{type(e).__name__}: {e})"]
  for line in lines:
    console.say(line)


def dry_run_text(config) -> str:
  """The dry run's table (``chinchax.ladder.dryrun``) with the expected interval of a from
  synthetic ladders at the planned grid (``analysis.isoflop.precision``)."""
  dry = dryrun_lib.plan_dry_run(config)
  g = dry.grid_costs
  prec = precision_lib.expected_a_interval(
      [c.run.counts.total for c in g], [c.run.D for c in g], [c.run.C_budget for c in g],
      noise=config.ladder.fit_noise)
  return dryrun_lib.render(dry, prec)


def _pin_to_first_core(lc) -> set[int] | None:
  """An IsoTime ladder with local workers: this process (the probe at start, the validation run
  at the end) runs pinned to one core like each worker, so that every step time is measured on
  the same hardware. Before JAX starts, so its threads inherit it. Returns the cores this
  process had (the workers' to share), or None when it stays unpinned."""
  if (lc.budget_kind == "seconds" and lc.workers > 1 and not lc.worker and lc.pin_cpus
          and hasattr(os, "sched_getaffinity")):
    cores = set(os.sched_getaffinity(0))
    if len(cores) >= lc.workers:
      os.sched_setaffinity(0, {min(cores)})
      return cores
  return None


def main(argv: list[str]) -> int:
  """Runs the ladder's missing runs, then (``ladder.fit``) Approaches 1–3 on its table, once.

  Returns the exit status: 0 every run done (and fitted), 1 local workers ended with runs
  not recorded, 3 some runs failed (the rest fitted, no validation run), 4 a local worker
  died but the others recorded every run (fitted and validated), 5 every run done but the
  table could not be fitted (the reason warned; a rerun fits again), 75 preempted and 130
  interrupted after a checkpoint (rerun the same command to resume).

  Raises:
    UserError: bad flags or config, a corpus too small for the grid.
  """
  dry = "--dry-run" in argv
  argv = [a for a in argv if a != "--dry-run"]
  config = flags_lib.parse_config(argv, flags_lib.config_file("ladder.py"), "ladder")
  if config is None:
    return 0
  lc = config.ladder
  if dry or lc.dry_run:
    print(dry_run_text(config))
    return 0
  ladder_lib.validate_ladder(lc)
  if lc.fit_grid:  # before any run trains, not at the fit
    try:
      approach3.parse_grid(lc.fit_grid)
    except ValueError as e:
      raise config_lib.ConfigError(f"ladder.fit_grid={lc.fit_grid!r}: {e}") from None
  config_lib.validate(config.train_config)
  paths_lib.check_writable_dir(config.workdir, "workdir")
  local_workers = lc.workers > 1 and not lc.worker
  n_cpu = config.train_config.mesh.num_cpu_devices
  machine_cores = _pin_to_first_core(lc)
  # With local workers this process trains only the validation run, after them: on CPU it takes
  # one device per worker's core (data parallel), which is 1.3x faster than one device on the
  # same cores (benchmarks/ladder_acceptance.sh; docs/ladder.md).
  runtime.setup_cpu_devices(max(n_cpu, lc.workers) if local_workers and n_cpu else n_cpu)
  runtime.setup_compilation_cache(config.train_config.compile_cache_dir)
  # The grid as a worker plans it (batches rounded to its own devices).
  worker_devices = (jax.devices()[:n_cpu] if local_workers and n_cpu
                    and jax.default_backend() == "cpu" else None)
  if lc.status:
    plan = ladder_lib.prepare(config, worker_devices, check_data=False, write=False)
    ladder_lib.describe(plan, full=True)
    console.say(ladder_lib.finish_line(plan))
    return 0
  if not lc.worker and lc.fit and not ladder_lib.is_local_worker():
    plan = ladder_lib.prepare(config, worker_devices, check_data=False, write=False)
    if ladder_lib.fit_settled(plan):  # nothing to train or fit: the answer again, at once
      console.say(f"ladder  done before: {len(plan.runs)} runs, their fit and validation in "
                  f"{plan.workdir}")
      _closing_block(config)
      return 0
  if local_workers:  # the ladder's own handlers stop its workers and release their leases
    with watchdog.deferring():
      return _run_local(config, argv, worker_devices, machine_cores)
  if ladder_lib.is_local_worker():
    ladder_lib.die_with_parent()
  distributed_lib.install_sigterm_handler()
  try:
    with watchdog.deferring():
      table = ladder_lib.run_ladder(config)
  except distributed_lib.Preempted as e:
    if not ladder_lib.is_local_worker():  # a local worker's parent reports it, once
      console.say(str(e), stream=sys.stderr, enabled=console.primary())
    return (interrupts.INTERRUPTED_EXIT_CODE if isinstance(e, interrupts.Interrupted)
            else distributed_lib.PREEMPTED_EXIT_CODE)
  if not console.primary():
    return 0
  return _finish(config, table, may_fit=ladder_lib.claim_fit(table) or not lc.worker)


def _run_local(config, argv, worker_devices, machine_cores) -> int:
  """The ladder on ``ladder.workers`` local worker processes, then its fit (module doc)."""
  lc = config.ladder
  plan = ladder_lib.prepare(config, worker_devices)  # builds the token store once, first
  ladder_lib.describe(plan)
  bar = ladder_lib.LadderProgress(plan, workers=lc.workers) if lc.progress else None
  result = ladder_lib.run_local_workers(argv, lc.workers, pin=lc.pin_cpus,
                                        available=machine_cores, progress=bar,
                                        say=console.say)
  if result.interrupted:
    console.say(interrupts.message(), stream=sys.stderr)
    return interrupts.INTERRUPTED_EXIT_CODE
  plan.table.refresh()
  console.say(ladder_lib.finish_line(plan))
  table = plan.workdir / "results.jsonl"
  if any(r.run_id not in plan.table.rows for r in plan.runs):  # the workers stopped early
    if result.stopped or distributed_lib.PREEMPTED_EXIT_CODE in result.codes:
      console.say("preempted: the runs in progress were checkpointed; relaunch the same "
                  "command to resume", stream=sys.stderr)
      return distributed_lib.PREEMPTED_EXIT_CODE
    console.warn(f"{'; '.join(result.died())}; rerun the same command to resume the runs not "
                 f"recorded yet")
    return ladder_lib.INCOMPLETE_EXIT_CODE
  # An IsoTime validation run trains on a worker's devices: the step-time predictor was
  # fitted on those.
  return _finish(config, table, worker_devices if lc.budget_kind == "seconds" else jax.devices(),
                 may_fit=ladder_lib.claim_fit(table), died=result.died())
