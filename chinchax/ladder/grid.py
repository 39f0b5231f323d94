"""The ladder's IsoFLOP grid: its runs, their shapes, their training configs.

For each FLOP budget C of a geometric grid, ``sizes_per_budget`` model sizes N
are spread log-uniformly around the predicted optimum N_opt(C) (the optimum
in the middle of the spread). Each (C, N) becomes a concrete shape by the
shape rule's ``"ladder"`` preset (``chinchax.planning.shapes``: a fixed
depth, width in steps of 4) and trains on D = C / (6N) tokens with its own
cosine schedule spanning exactly its own steps (``budget.mode = "flops"``),
in its own workdir ``runs/<run_id>``, with the peak LR, batch, β2 and warmup
of the ``ladder.hparams`` rule (:mod:`chinchax.cost.hparams`).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import numpy as np

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.cost import hparams as hparams_lib
from chinchax.planning import shapes as shapes_lib
import chinchax.ladder.repeat as repeat
import chinchax.ladder.tuning as tuning


@dataclasses.dataclass(frozen=True)
class LadderRun:
  """One point of the IsoFLOP grid.

  Attributes:
    run_id: stable id, e.g. ``C1.00e+11_N31936``.
    C_budget: the IsoFLOP budget (FLOPs, C = 6·N·D).
    N_target: the size asked for by the grid (parameters).
    shape: the concrete shape (exact N from ``budget.param_counts``).
    hparams: its peak LR, batch, β2 and warmup (:class:`chinchax.cost.hparams.HParams`).
    role: ``"grid"`` (a point of an IsoFLOP profile) or ``"validation"`` (the
      run that tests the fitted law; never fitted).
    seconds_budget: an IsoTime run's budget, seconds of training (its steps are
      set from its step time, :mod:`chinchax.ladder.isotime`; ``C_budget`` is then
      the nominal compute its hyperparameters are read at); None on an IsoFLOP grid.
    unique_tokens: the run's ``data.unique_tokens`` on a ladder with a unique-data axis
      (:mod:`chinchax.ladder.repeat`); None: the base training config's.
  """

  run_id: str
  C_budget: float
  N_target: float
  shape: budget.ModelShape
  hparams: hparams_lib.HParams
  role: str = "grid"
  seconds_budget: float | None = None
  unique_tokens: int | None = None

  @property
  def counts(self) -> budget.ParamCounts:
    return budget.param_counts(self.shape)

  @property
  def D(self) -> float:
    """Tokens for this run: C / (6 N) with N the total parameter count."""
    return self.C_budget / (6.0 * self.counts.total)


def make_run(lc, base_train, C: float, n_target: float, vocab_size: int,
             exclude: frozenset[int] = frozenset(), role: str = "grid",
             prefix: str = "", batch_multiple: int = 1, n_layers: int | None = None,
             seconds: float | None = None, shape: budget.ModelShape | None = None) -> LadderRun:
  """The run of budget C nearest ``n_target`` parameters: its shape and hyperparameters.

  Args:
    lc: the ladder section (``hparams``; a rule's batch shrinks so the run takes at least
      max(``min_steps``, ``batch_min_steps``) steps).
    base_train: the base training section (seq_len and the rule's base values).
    C: FLOP budget (C = 6·N·D).
    n_target: parameters asked for.
    vocab_size: the tokenizer's vocabulary.
    exclude: total parameter counts not to use (sizes already in the budget).
    role, prefix: the run's role, and a prefix of its id (``V`` for validation).
    batch_multiple: the data-parallel size: a rule's batch is rounded to the
      nearest positive multiple of it (the steps follow).
    n_layers: the depth (default: the ``"ladder"`` shape rule's fixed 2); the width
      is the rule's nearest to ``n_target`` at this depth.
    seconds: an IsoTime run's budget in seconds (its id ``T<s>s_N<N>_L<n_layers>``).
    shape: this shape instead of the rule's.
  """
  if shape is None:
    rule = shapes_lib.PRESETS[lc.shape_rule]
    if n_layers is not None:
      rule = dataclasses.replace(rule, min_layers=int(n_layers))
    shape = shapes_lib.propose_shapes(
        n_target, vocab_size=vocab_size, seq_len=base_train.seq_len, rule=rule, k=1,
        exclude=exclude)[0].shape
  n = budget.param_counts(shape).total
  hp = hparams_lib.hparams_for_run(lc.hparams, n, C, base_train.seq_len,
                                   hparams_lib.Base.from_config(base_train),
                                   min_steps=max(lc.min_steps, lc.batch_min_steps))
  if hp.rule != "fixed" and hp.global_batch_size % batch_multiple:
    gbs = max(batch_multiple, batch_multiple * round(hp.global_batch_size / batch_multiple))
    hp = _with_batch(hp, gbs, C / (6.0 * n), base_train.seq_len)
  run_id = (f"{prefix}C{C:.2e}_N{n}" if seconds is None
            else f"{prefix}T{seconds:.3g}s_N{n}_L{shape.n_layers}")
  return LadderRun(run_id=run_id, C_budget=float(C), N_target=float(n_target), shape=shape,
                   hparams=hp, role=role, seconds_budget=seconds)


def plan_runs(lc, base_train, vocab_size: int, batch_multiple: int = 1) -> list[LadderRun]:
  """The ladder's runs, budget by budget, smallest N first.

  N_opt(C) = sqrt(C / (6 · tokens_per_param)) (C = 6·N·D with D = ratio·N), and
  sizes N_opt · spread^u for ``sizes_per_budget`` values of u evenly in [-1, 1],
  each made a shape by the shape rule's ``"ladder"`` preset
  (:data:`chinchax.planning.shapes.PRESETS`). A size whose nearest shape is
  already taken in its budget moves to the nearest free one, so every budget
  has exactly ``sizes_per_budget`` sizes. Each run's hyperparameters come
  from the ``ladder.hparams`` rule (``base_train``: the base training section).
  """
  budgets = np.geomspace(lc.c_min, lc.c_max, lc.n_budgets)
  runs = []
  for C in budgets:
    n_opt = math.sqrt(C / (6.0 * lc.tokens_per_param))
    seen: set[int] = set()
    for u in np.linspace(-1.0, 1.0, lc.sizes_per_budget):
      run = make_run(lc, base_train, C, n_opt * lc.spread ** u, vocab_size,
                     exclude=frozenset(seen), batch_multiple=batch_multiple)
      seen.add(run.counts.total)
      runs.append(run)
  if lc.schedule == "wsd":
    runs = _share_hparams_per_shape(lc, base_train, runs)
  return runs


def _share_hparams_per_shape(lc, base_train, runs: list[LadderRun]) -> list[LadderRun]:
  """The runs with one peak LR, batch, β2 and warmup per shape: the rule's values at the
  shape's largest budget (its wsd trunk), each run keeping its own D and steps.

  A wsd trunk and its cooldowns are one optimisation (Hägele et al. 2024,
  Sec. 3), so they cannot differ in LR or batch; a rule that reads C
  (``deepseek``) is evaluated at the trunk's budget.
  """
  top: dict[budget.ModelShape, LadderRun] = {}
  for r in runs:
    if r.shape not in top or r.C_budget > top[r.shape].C_budget:
      top[r.shape] = r
  return [dataclasses.replace(r, hparams=_with_batch(
      top[r.shape].hparams, top[r.shape].hparams.global_batch_size, r.D, base_train.seq_len))
      for r in runs]


def _with_batch(hp: hparams_lib.HParams, gbs: int, D: float, seq_len: int) -> hparams_lib.HParams:
  """``hp`` with global batch ``gbs`` for a run of D tokens: its steps, warmup capped at 10%."""
  steps = budget.steps_for_tokens(D, gbs * seq_len)
  return dataclasses.replace(hp, global_batch_size=gbs, steps=steps,
                             warmup_steps=min(hp.warmup_steps, budget.max_warmup_steps(steps)))


def data_parallel_size(base, n_devices: int) -> int:
  """data × fsdp of the base config's mesh on ``n_devices``: what a global batch must divide by."""
  mesh = config_lib.resolve_mesh_shape(base.mesh, n_devices)
  return int(mesh["data"] * mesh["fsdp"])


BUDGET_KINDS = ("flops", "seconds")


def parse_depths(text) -> tuple[int, ...]:
  """``ladder.depths`` (``"1,2,4"``) as distinct n_layers, ascending.

  Raises:
    ConfigError: not a comma-separated list of positive integers.
  """
  parts = [p.strip() for p in str(text).split(",") if p.strip()]
  try:
    depths = sorted({int(p) for p in parts})
  except ValueError:
    depths = []
  if not depths or depths[0] < 1 or len(depths) != len(parts):
    raise config_lib.ConfigError(
        f"ladder.depths={text!r} must be distinct positive integers separated by commas "
        f"(n_layers at every N level), e.g. '1,2,4'")
  return tuple(depths)


TIME_CONTROLS = ("fixed", "decay")  # ladder.time_control of an IsoTime ladder (chinchax.ladder.isoclock)


def validate_time_budgets(lc) -> None:
  """Checks an IsoTime ladder's knobs (``ladder.budget_kind=seconds``).

  Raises:
    ConfigError: a time budget that is not a positive number of seconds, t_max
      below t_min, bad depths, throughput, step-time source or probe length, or
      an unknown ``ladder.time_control``, or a wsd ``ladder.schedule`` (an IsoTime run's
      schedule follows its time control).
  """
  E = config_lib.ConfigError
  for k in ("t_min", "t_max", "flops_per_s"):
    v = lc[k]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
      what = "seconds of training" if k != "flops_per_s" else "FLOPs per second"
      raise E(f"ladder.{k}={v!r} must be a positive number of {what}")
  if lc.t_max < lc.t_min:
    raise E(f"ladder.t_max={lc.t_max:g} s is below ladder.t_min={lc.t_min:g} s")
  parse_depths(lc.depths)
  if lc.step_time != "probe" and not pathlib.Path(str(lc.step_time)).expanduser().is_file():
    raise E(f"ladder.step_time={lc.step_time!r} must be 'probe' or the path of a step-time "
            f"file (chinchax.cost.step_time); no such file")
  if not isinstance(lc.probe_steps, int) or lc.probe_steps < 3:
    raise E(f"ladder.probe_steps={lc.probe_steps!r} must be an integer >= 3")
  if lc.time_control not in TIME_CONTROLS:
    raise E(f"ladder.time_control={lc.time_control!r} is not one of "
            f"{', '.join(map(repr, TIME_CONTROLS))}")
  if lc.schedule != "cosine":
    raise E(f"ladder.schedule={lc.schedule!r} needs ladder.budget_kind='flops'; an IsoTime "
            f"ladder's runs take their schedule from ladder.time_control (fixed: a cosine "
            f"cycle each; decay: warmup-stable-decay on the run's clock)")


def validate_ladder(lc) -> None:
  """Checks the ladder section (grid and workers); raises ConfigError naming the bad value."""
  E = config_lib.ConfigError
  if lc.budget_kind not in BUDGET_KINDS:
    raise E(f"ladder.budget_kind={lc.budget_kind!r} is not one of "
            f"{', '.join(map(repr, BUDGET_KINDS))}")
  if lc.budget_kind == "seconds":
    validate_time_budgets(lc)
  sized = lc.c_max == 0 and bool(lc.hardware) and lc.budget_kind == "flops"  # chinchax.ladder.pod
  for k in ("c_min", "c_max", "tokens_per_param", "spread"):
    if k in ("c_min", "c_max") and lc[k] == 0 and (sized or (k == "c_min" and lc.hardware)):
      continue  # sized by chinchax.ladder.pod: c_max to budget_hours, c_min = c_max / 10^decades
    if not isinstance(lc[k], (int, float)) or not math.isfinite(lc[k]) or lc[k] <= 0:
      raise E(f"ladder.{k}={lc[k]!r} must be a positive number"
              + (" (0 for both sizes them to ladder.budget_hours of ladder.hardware)"
                 if k in ("c_min", "c_max") else ""))
  for k in ("budget_hours", "fit_noise"):
    if not isinstance(lc[k], (int, float)) or not math.isfinite(lc[k]) or lc[k] < 0:
      raise E(f"ladder.{k}={lc[k]!r} must be a number >= 0")
  if not isinstance(lc.decades, (int, float)) or not 0 < lc.decades <= 6:
    raise E(f"ladder.decades={lc.decades!r} must be a number in (0, 6] (c_min = c_max / "
            f"10^decades)")
  if not isinstance(lc.microbatch_rows, int) or lc.microbatch_rows < 0:
    raise E(f"ladder.microbatch_rows={lc.microbatch_rows!r} must be an integer >= 0")
  if not isinstance(lc.validate_factor, (int, float)) or not lc.validate_factor > 1:
    raise E(f"ladder.validate_factor={lc.validate_factor!r} must be a number > 1 (the validation "
            f"run's budget is validate_factor × ladder.c_max, beyond the grid)")
  if not sized and lc.c_min and lc.c_max < lc.c_min:
    raise E(f"ladder.c_max={lc.c_max:g} is below ladder.c_min={lc.c_min:g}")
  if lc.spread <= 1:
    raise E(f"ladder.spread={lc.spread!r} must be > 1 (the N range is N_opt/spread … N_opt·spread)")
  if not isinstance(lc.n_budgets, int) or lc.n_budgets < 1:
    raise E(f"ladder.n_budgets={lc.n_budgets!r} must be a positive integer")
  if not isinstance(lc.sizes_per_budget, int) or lc.sizes_per_budget < 3:
    raise E(f"ladder.sizes_per_budget={lc.sizes_per_budget!r} must be an integer >= 3 "
            f"(a parabola needs three points)")
  if lc.schedule not in config_lib.LR_SCHEDULES:
    raise E(f"ladder.schedule={lc.schedule!r} is not one of "
            f"{', '.join(map(repr, config_lib.LR_SCHEDULES))}")
  f = lc.cooldown_fraction
  if not isinstance(f, (int, float)) or not 0.0 < f <= config_lib.MAX_DECAY_FRACTION:
    raise E(f"ladder.cooldown_fraction={lc.cooldown_fraction!r} must lie in "
            f"(0, {config_lib.MAX_DECAY_FRACTION}]")
  tuning.validate_tuning(lc)
  repeat.validate_axis(lc)
  for k in ("min_steps", "batch_min_steps"):
    if not isinstance(lc[k], int) or lc[k] < 1:
      raise E(f"ladder.{k}={lc[k]!r} must be an integer >= 1")
  hparams_lib.check_rule(lc.hparams)
  if lc.shape_rule not in shapes_lib.PRESETS:
    raise E(f"ladder.shape_rule={lc.shape_rule!r} is not one of "
            f"{', '.join(map(repr, shapes_lib.PRESETS))}")
  for k in ("workers", "max_attempts"):
    if not isinstance(lc[k], int) or lc[k] < 1:
      raise E(f"ladder.{k}={lc[k]!r} must be a positive integer")
  for k in ("lease_expiry_s", "heartbeat_s", "poll_s"):
    if not isinstance(lc[k], (int, float)) or not math.isfinite(lc[k]) or lc[k] <= 0:
      raise E(f"ladder.{k}={lc[k]!r} must be a positive number of seconds")
  if lc.heartbeat_s * 2 > lc.lease_expiry_s:
    raise E(f"ladder.heartbeat_s={lc.heartbeat_s!r} must be at most half of "
            f"ladder.lease_expiry_s={lc.lease_expiry_s!r} (a live worker's lease must never "
            f"look expired)")


def run_config(base, run: LadderRun, workdir: pathlib.Path):
  """The training config of one ladder run: the base config with its shape, budget and
  hyperparameters (``run.hparams``)."""
  c = base.copy_and_resolve_references()
  s, hp = run.shape, run.hparams
  c.model.update(d_model=s.d_model, n_layers=s.n_layers, n_heads=s.n_heads, d_ff=s.d_ff)
  c.budget.update(mode="flops", flops=run.C_budget, n_kind="total")
  if hp.rule != "fixed":
    c.train.update(peak_lr=hp.peak_lr, global_batch_size=hp.global_batch_size, b2=hp.b2,
                   warmup_steps=hp.warmup_steps)
  if run.unique_tokens is not None:  # a ladder.unique_tokens axis
    c.data.unique_tokens = run.unique_tokens
  c.workdir = str(workdir / "runs" / run.run_id)
  return c
