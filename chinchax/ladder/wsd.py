"""The ladder on warmup-stable-decay schedules: one trunk per model shape, cooldowns off it.

With ``ladder.schedule = "wsd"`` the runs of the IsoFLOP grid that share a
shape (the same N at several budgets C, each with its own D) share their
warmup and constant-LR phase (Hägele et al. 2024, "Scaling Laws and
Compute-Optimal Training Beyond Fixed Training Durations", Sec. 3-4): a run
of S steps is the wsd schedule whose decay spans its last
``ladder.cooldown_fraction`` of steps, starting at its branch step
b = round(S · (1 - cooldown_fraction)).

For each shape the longest run is the **trunk**: trained directly on its own
wsd schedule (decay from its own branch step), it saves and keeps the
checkpoint at every other run's branch step (``train.save_steps``). Each other
run is a **cooldown**: it starts from the trunk's checkpoint at its branch
step (``train.init_from`` / ``train.init_step``: params, optimizer state and
step counter) and trains steps b … S-1 on its own decay. Up to b the trunk's
schedule (warmup, then constant peak_lr) and data (the batch of a step does
not depend on the run length) equal the run's own, so a cooldown equals the
direct wsd run of that length bitwise (``tests/test_wsd.py``). All runs of a
shape use one warmup, the 10% cap of the group's shortest run
(``budget.max_warmup_steps``), so that their first steps agree.

The worker needs, per run: :func:`run_config` (its training config, trunk or
cooldown), :func:`ready` (a cooldown may start once its branch checkpoint is
saved) and :func:`depends_on`; :func:`plan_shapes` is the pure grouping.
"""

from __future__ import annotations

import dataclasses
import pathlib

from chinchax.cost import budget
from chinchax.storage import atomic as files
import chinchax.ladder.grid as grid
import chinchax.train.spec as spec_lib


@dataclasses.dataclass(frozen=True)
class Cooldown:
  """One run of a shape group on its wsd schedule.

  Attributes:
    run: the ladder run.
    steps: its total steps S = round(D / tokens_per_step).
    branch_step: where its decay starts, round(S · (1 - cooldown_fraction)); a
      cooldown starts from the trunk's checkpoint at this step.
  """

  run: grid.LadderRun
  steps: int
  branch_step: int

  @property
  def trained_steps(self) -> int:
    """Steps this run trains itself as a cooldown (S - branch_step)."""
    return self.steps - self.branch_step


@dataclasses.dataclass(frozen=True)
class ShapePlan:
  """The runs of one model shape: its trunk (the longest run) and the cooldowns off it.

  Attributes:
    shape: the shared model shape.
    trunk: the longest run (largest D), trained from scratch on its own wsd
      schedule; its decay starts at ``trunk.branch_step``.
    cooldowns: the shape's other runs, ascending steps; each starts from the
      trunk's checkpoint at its ``branch_step``.
    warmup_steps: the group's warmup, min(``train.warmup_steps``, 10% of the
      shortest run's steps).
  """

  shape: budget.ModelShape
  trunk: Cooldown
  cooldowns: tuple[Cooldown, ...]
  warmup_steps: int

  @property
  def save_steps(self) -> tuple[int, ...]:
    """The trunk's checkpoints that must be kept: every cooldown's branch step."""
    return tuple(sorted({c.branch_step for c in self.cooldowns}))

  @property
  def trained_steps(self) -> int:
    """Steps this shape trains in all: the trunk's plus each cooldown's own."""
    return self.trunk.steps + sum(c.trained_steps for c in self.cooldowns)


def run_steps(run: grid.LadderRun, tokens_per_step: int | None = None) -> int:
  """A run's steps, as the trainer resolves them: round(D / tokens_per_step)
  (``budget.steps_for_tokens``), D = C / (6 N) (``LadderRun.D``); None: the run's own
  batch (``run.hparams``)."""
  if tokens_per_step is None:
    return run.hparams.steps
  return budget.steps_for_tokens(run.D, tokens_per_step)


def run_tokens_per_step(run: grid.LadderRun) -> int:
  """The run's global_batch_size × seq_len under its hyperparameter rule."""
  return run.hparams.global_batch_size * run.shape.seq_len


def plan_shapes(runs: list[grid.LadderRun], tokens_per_step: int | None, cooldown_fraction: float,
                warmup_steps: int) -> list[ShapePlan]:
  """Groups ``runs`` by identical shape; per shape a trunk and its cooldowns (pure).

  Args:
    runs: the ladder's runs (``grid.plan_runs``).
    tokens_per_step: global_batch_size × seq_len; None: each run's own (``run.hparams``;
      the runs of a shape share one batch, ``grid.plan_runs`` with ``ladder.schedule="wsd"``).
    cooldown_fraction: ``ladder.cooldown_fraction``, in (0, 0.9].
    warmup_steps: ``train.warmup_steps`` of the base training config.
  Returns:
    one :class:`ShapePlan` per distinct shape, in order of first appearance in
    ``runs``. The trunk is the run with the most steps (ties: the first in
    ``runs``); a run whose steps equal the trunk's is still a cooldown (it
    branches at the trunk's own decay start and retrains the decay).
  """
  groups: dict[budget.ModelShape, list[Cooldown]] = {}
  for r in runs:
    steps = run_steps(r, tokens_per_step)
    groups.setdefault(r.shape, []).append(
        Cooldown(r, steps, spec_lib.wsd_decay_start(steps, cooldown_fraction)))
  plans = []
  for shape, members in groups.items():
    trunk = max(members, key=lambda c: c.steps)  # the first of the longest
    others = sorted((c for c in members if c is not trunk), key=lambda c: c.steps)
    warmup = min(warmup_steps, budget.max_warmup_steps(min(c.steps for c in members)))
    plans.append(ShapePlan(shape, trunk, tuple(others), warmup))
  return plans


def find(plans: list[ShapePlan], run_id: str) -> tuple[ShapePlan, Cooldown]:
  """(its shape plan, its entry) of ``run_id``.

  Raises:
    KeyError: no plan holds ``run_id``.
  """
  for p in plans:
    for c in (p.trunk, *p.cooldowns):
      if c.run.run_id == run_id:
        return p, c
  raise KeyError(f"run {run_id!r} is in no shape plan")


def trunk_config(base, plan: ShapePlan, workdir: pathlib.Path):
  """The trunk's training config: ``grid.run_config`` of the longest run on its wsd schedule,
  the group's warmup, and its cooldowns' branch steps saved and kept (``train.save_steps``)."""
  c = grid.run_config(base, plan.trunk.run, workdir)
  c.train.update(schedule="wsd", decay_start_step=plan.trunk.branch_step,
                 warmup_steps=plan.warmup_steps,
                 save_steps=",".join(str(s) for s in plan.save_steps))
  return c


def cooldown_config(base, plan: ShapePlan, cooldown: Cooldown, workdir: pathlib.Path):
  """A cooldown's training config: ``grid.run_config`` of its run on its own wsd schedule
  (decay from its branch step), started from the trunk's checkpoint at that step."""
  c = grid.run_config(base, cooldown.run, workdir)
  c.train.update(schedule="wsd", decay_start_step=cooldown.branch_step,
                 warmup_steps=plan.warmup_steps,
                 init_from=str(trunk_workdir(plan, workdir)), init_step=cooldown.branch_step)
  return c


def run_config(base, plans: list[ShapePlan], run: grid.LadderRun, workdir: pathlib.Path):
  """The wsd training config of any ladder run: :func:`trunk_config` or :func:`cooldown_config`.

  Args:
    base: the ladder's ``train_config``.
    plans: :func:`plan_shapes` of the ladder's runs.
    run: the run.
    workdir: the ladder's workdir (runs train in ``<workdir>/runs/<run_id>``).
  Raises:
    KeyError: ``run`` is in no plan.
  """
  plan, entry = find(plans, run.run_id)
  if entry is plan.trunk:
    return trunk_config(base, plan, workdir)
  return cooldown_config(base, plan, entry, workdir)


def trunk_workdir(plan: ShapePlan, workdir: pathlib.Path) -> pathlib.Path:
  """The trunk's training workdir, ``<workdir>/runs/<trunk run_id>`` (as ``grid.run_config``)."""
  return files.as_path(workdir) / "runs" / plan.trunk.run.run_id


def depends_on(plans: list[ShapePlan], run: grid.LadderRun) -> tuple[str, int] | None:
  """(trunk run_id, branch step) a cooldown needs before it can start; None for a trunk."""
  plan, entry = find(plans, run.run_id)
  return None if entry is plan.trunk else (plan.trunk.run.run_id, entry.branch_step)


def ready(plans: list[ShapePlan], run: grid.LadderRun, workdir: pathlib.Path) -> bool:
  """True when ``run`` can start: a trunk always; a cooldown once the trunk's checkpoint at its
  branch step is complete (orbax moves a finished step directory into place; on gs:// it
  writes ``commit_success.txt`` into it last), or once the cooldown's own workdir holds
  checkpoints (it resumes from them)."""
  dep = depends_on(plans, run)
  if dep is None:
    return True
  own = files.as_path(workdir) / "runs" / run.run_id / "checkpoints"
  if own.is_dir() and any(p.name.isdigit() and _complete(p) for p in own.iterdir()):
    return True
  trunk_id, step = dep
  return _complete(files.as_path(workdir) / "runs" / trunk_id / "checkpoints" / str(step))


def _complete(step_dir) -> bool:
  """A checkpoint step directory orbax has finished writing."""
  if "://" in str(step_dir):
    return (step_dir / "commit_success.txt").exists()
  return step_dir.is_dir()


def trained_flops(plans: list[ShapePlan], tokens_per_step: int | None = None) -> float:
  """FLOPs the wsd plan trains: Σ over shapes of 6·N·tokens of the trunk and of each cooldown's
  own steps (C = 6ND, Kaplan et al. 2020 / Hoffmann et al. 2022); None: each shape's own batch."""
  return sum(budget.flops_6nd(p.trunk.run.counts.total, p.trained_steps * (
      tokens_per_step or run_tokens_per_step(p.trunk.run))) for p in plans)


def cosine_flops(runs: list[grid.LadderRun], tokens_per_step: int | None = None) -> float:
  """FLOPs the cosine plan trains: Σ over runs of 6·N·tokens, tokens = steps × tokens_per_step
  (None: each run's own batch)."""
  return sum(budget.flops_6nd(r.counts.total, run_steps(r, tokens_per_step) * (
      tokens_per_step or run_tokens_per_step(r))) for r in runs)
