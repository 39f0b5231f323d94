"""A validated ladder: its runs, workdir, base config and devices (:func:`prepare`).

``prepare`` plans the grid (IsoFLOP, :mod:`chinchax.ladder.grid`, or IsoTime,
:mod:`chinchax.ladder.isotime`), checks the corpus feeds it, and writes
``grid.json``; :class:`LadderPlan` gives each run its training config.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time

import jax

from chinchax import config as config_lib
from chinchax.storage import paths as paths_lib
from chinchax import train as train_lib
from chinchax.tracking import wandblog
from chinchax.data import sources as sources_lib
from chinchax.data import unique as unique_lib
from chinchax.storage import atomic as files
import chinchax.ladder.grid as grid
import chinchax.ladder.isotime as isotime
from chinchax.storage import lease as lease_lib
import chinchax.ladder.pod as pod
import chinchax.ladder.repeat as repeat
import chinchax.ladder.table as table_lib
import chinchax.ladder.tuning as tuning
import chinchax.ladder.wsd as wsd_lib

GRID_FILE = "grid.json"


@dataclasses.dataclass
class LadderPlan:
  """A validated ladder: its runs (grid order), workdir, base config and devices."""

  config: object
  runs: list[grid.LadderRun]
  workdir: pathlib.Path
  devices: list
  vocab: int
  wsd_plans: list | None = None

  def run_config(self, r: grid.LadderRun, steps: int | None = None):
    """The training config of run ``r``: cosine (``grid.run_config``), a wsd trunk or a
    cooldown (``wsd.run_config``); the validation run trains directly on its schedule. An
    IsoTime run takes ``steps`` (its time plan's; default: the nominal steps of its rule).
    With ``ladder.lr_trials`` / ``ladder.seeds`` every run carries its trials
    (``chinchax.ladder.tuning``), the validation run included."""
    c = self._run_config(r, steps)
    hardware = pod.target(self.config.ladder)
    if hardware is not None:  # ladder.hardware: the planner's layout of this run on it
      pod.apply_layout(c, pod.run_layout(r, self.config.ladder, hardware,
                                         loss_chunk_size=c.train.loss_chunk_size))
    tuning.apply(c, self.config.ladder)
    wandblog.name_ladder_run(c, self.workdir, r.run_id)  # train.wandb: the ladder's W&B group
    return c

  def _run_config(self, r: grid.LadderRun, steps: int | None = None):
    base = self.config.train_config
    if r.seconds_budget is not None:
      return isotime.run_config(base, r, self.workdir, steps or r.hparams.steps)
    if self.wsd_plans is None:
      return grid.run_config(base, r, self.workdir)
    if r.role == "validation":
      c = grid.run_config(base, r, self.workdir)
      c.train.update(schedule="wsd", decay_fraction=self.config.ladder.cooldown_fraction)
      return c
    return wsd_lib.run_config(base, self.wsd_plans, r, self.workdir)

  def ready(self, r: grid.LadderRun) -> bool:
    """Whether ``r`` can start now (a wsd cooldown waits for its trunk's branch checkpoint)."""
    return (self.wsd_plans is None or r.role == "validation"
            or wsd_lib.ready(self.wsd_plans, r, self.workdir))

  @property
  def table(self) -> table_lib.ResultsTable:
    return table_lib.ResultsTable(self.workdir / "results.jsonl", [r.run_id for r in self.runs])

  def leases(self, owner: str) -> lease_lib.Leases:
    return lease_lib.Leases(self.workdir / lease_lib.LEASES_DIR, owner,
                            self.config.ladder.lease_expiry_s)


def prepare(config, devices=None, check_data: bool = True, write: bool = True) -> LadderPlan:
  """Validates the ladder, plans its runs and (``check_data``) checks the corpus up front.

  With ``write`` (a ladder that will run), creates the workdir and writes
  ``grid.json`` (the run ids) into it; without (``ladder.status``, a read-only
  query), writes nothing.

  An IsoTime ladder (``ladder.budget_kind = "seconds"``) plans its grid with
  :func:`chinchax.ladder.isotime.plan_runs` and, with ``check_data``, checks
  that its runs fit ``ladder.min_steps`` steps in their budgets
  (:func:`chinchax.ladder.isotime.check_budgets`: one probe).

  Raises:
    ConfigError: invalid ladder or training config, a run shorter than
      ``ladder.min_steps`` under its hyperparameter rule (or, IsoTime, in its
      time budget), a corpus too small for the largest D.
    DataError: the corpus cannot be read.
  """
  lc = config.ladder
  grid.validate_ladder(lc)
  tuning.check_train_config(config)
  base = config.train_config
  config_lib.validate(base)
  devices = list(jax.devices() if devices is None else devices)
  workdir = paths_lib.resolved(config.workdir)  # local, or gs:// (docs/storage.md)
  spec0 = train_lib.resolve(base, len(devices))
  timed = lc.budget_kind == "seconds"
  hardware = pod.target(lc)
  multiple = pod.batch_multiple_for(config, len(devices))
  if hardware is not None and not timed:
    pod.size_budgets(lc, base.train, spec0.model.vocab_size, hardware)  # ladder.c_max = 0
    pod.check_one_step(lc, base.train, spec0.model.vocab_size, hardware)
  runs = (isotime.plan_runs if timed else grid.plan_runs)(
      lc, base.train, spec0.model.vocab_size, batch_multiple=multiple)
  runs = repeat.expand(runs, lc)  # ladder.unique_tokens: the grid once per unique-data size
  if (write and hardware is not None and hardware.accelerator.kind != "cpu"
          and len(devices) != hardware.n_devices):
    raise config_lib.ConfigError(
        f"ladder.hardware={lc.hardware!r} lays the runs out on {hardware.n_devices} devices but "
        f"this ladder has {len(devices)} ({devices[0].platform}); name this host's target "
        f"(e.g. ladder.hardware={devices[0].platform}-{len(devices)} as the hardware table "
        f"spells it) or run it where {lc.hardware} is")
  if hardware is not None and not timed:  # a run that fits no layout: refused before any trains
    pod.check_fits(pod.cost_runs(runs, lc, base.train, hardware), hardware)
  short = [] if timed else [r for r in runs if r.hparams.steps < lc.min_steps]
  if short:
    r = short[0]
    raise config_lib.ConfigError(
        f"budget C={r.C_budget:.3g} gives run {r.run_id} only {r.hparams.steps} steps of "
        f"{r.hparams.global_batch_size}×{base.train.seq_len} tokens "
        f"(ladder.min_steps={lc.min_steps}, ladder.hparams={lc.hparams!r}); raise ladder.c_min "
        f"or shrink the batch")
  wsd_plans = (wsd_lib.plan_shapes(runs, None, lc.cooldown_fraction, base.train.warmup_steps)
               if lc.schedule == "wsd" else None)
  plan = LadderPlan(config, runs, workdir, devices, spec0.model.vocab_size, wsd_plans)
  if check_data:
    # with a unique-data axis the validation run is fixed by the config: its U is checked
    # with the grid's, before any run trains (not found unusable after the grid)
    fixed = [fixed_validation_run(plan)] if repeat.axis_of(lc) else []
    check_corpus(plan, runs + fixed)
  if write:
    workdir.mkdir(parents=True, exist_ok=True)
  if check_data and timed:
    isotime.check_budgets(plan)
  if write:
    workdir.mkdir(parents=True, exist_ok=True)
    files.write_atomic(workdir / GRID_FILE, json.dumps([r.run_id for r in runs]))
  return plan


def fixed_validation_run(plan: LadderPlan) -> grid.LadderRun:
  """The validation run of a ladder with a unique-data axis, fixed by its config: C_val =
  ``ladder.validate_factor`` × ``ladder.c_max``, N = sqrt(C_val / (6 · tokens_per_param)) (the
  grid's centre rule), ``data.unique_tokens`` = ``ladder.validate_unique_tokens``; id
  ``VU<U>_C<C>_N<N>``."""
  lc = plan.config.ladder
  C = lc.validate_factor * lc.c_max
  base = plan.config.train_config
  run = grid.make_run(lc, base.train, C, math.sqrt(C / (6.0 * lc.tokens_per_param)), plan.vocab,
                      role="validation", prefix="V",
                      batch_multiple=pod.batch_multiple_for(plan.config, len(plan.devices)))
  u = lc.validate_unique_tokens
  return dataclasses.replace(run, unique_tokens=u,
                             run_id=f"V{repeat.prefix(u)}{run.run_id.removeprefix('V')}")


def check_corpus(plan: LadderPlan, runs: list[grid.LadderRun]) -> None:
  """Builds (or loads) the token store and checks it feeds every run of ``runs`` without
  repetition (unless ``data.allow_repeat``), and each run's unique-data prefix
  (``data.unique_tokens``, :mod:`chinchax.data.unique`) feeds it.

  Raises:
    ConfigError: a run needs more than one epoch of the training split.
    DataError: the corpus cannot be read; a run's ``data.unique_tokens`` exceeds the split,
      holds less than one batch, or is read more than ``data.max_epochs`` times (or more than
      once without ``data.allow_repeat``); the message names the run.
  """
  base = plan.config.train_config
  spec0 = train_lib.resolve(base, len(plan.devices))
  first = plan.run_config(runs[0])
  one_step = dataclasses.replace(spec0, steps=1, tokens=spec0.tokens_per_step)
  try:
    split = train_lib.prepare_data(first, one_step).train_split
  except OSError:  # workers started together built the same token store; it is complete now
    time.sleep(1.0)
    split = train_lib.prepare_data(first, one_step).train_split
  n_windows = (split.n_tokens - 1) // base.train.seq_len
  ends = None
  for r in runs:
    asked = base.data.unique_tokens if r.unique_tokens is None else r.unique_tokens
    if asked or base.data.max_epochs:
      what = f"run {r.run_id} (budget C={r.C_budget:.3g}, N={r.counts.total:,})"
      if r.role == "validation":
        what = (f"validation run {r.run_id} (ladder.validate_unique_tokens={asked}, budget "
                f"C={r.C_budget:.3g}, N={r.counts.total:,})")
      try:
        rc = plan.run_config(r)
        unique_lib.check_config(rc.data, rc.train)
        if asked and ends is None:
          ends = unique_lib.document_ends(split.directory, split.n_tokens)
        unique = (int(sum(unique_lib.select_documents(
            ends, asked, rc.data.unique_order, config_lib.data_shuffle_seed(rc))[1])) if asked
                  else split.n_tokens)
        unique_lib.check_reads(unique, asked, seq_len=base.train.seq_len,
                               global_batch_size=r.hparams.global_batch_size,
                               steps=r.hparams.steps, allow_repeat=base.data.allow_repeat,
                               max_epochs=base.data.max_epochs, what=what)
      except sources_lib.DataError as e:
        raise sources_lib.DataError(
            str(e) if str(e).startswith(what) else f"{what}: {e}") from None
      continue
    need = r.hparams.steps * r.hparams.global_batch_size
    if need > n_windows and not base.data.allow_repeat:
      raise config_lib.ConfigError(
          f"run {r.run_id} (budget C={r.C_budget:.3g}, N={r.counts.total:,}) needs D={r.D:,.0f} "
          f"tokens = {need / n_windows:.2f} epochs of the {split.n_tokens:,}-token training "
          f"split; lower ladder.c_max or set train_config.data.allow_repeat=True")
