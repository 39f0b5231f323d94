"""A ladder laid out and priced on named hardware (``ladder.hardware``, e.g. v5e-8, h100x8).

With ``ladder.hardware`` set, every run of the grid (and the validation run) is
laid out by the planner for that target (:func:`chinchax.planning.layout.choose_layout`:
FSDP over all its devices, per run the smallest ``train.microbatches`` M and the
remat policy that leave 15% of a device free, a chunked loss from a 32k
vocabulary on) and priced by a step-time model: the roofline of the target
(:class:`chinchax.cost.step_time.RooflineStepTime`) or, with ``ladder.step_time``
naming a step-time file, that calibration. Its hours are steps × step time plus
its evals (forward only: a third of a step per token), its dollars those hours ×
the target's price (``chinchax/cost/hardware_prices.json``).

``ladder.c_max = 0`` sizes the budgets to ``ladder.budget_hours`` of the target
(:func:`size_budgets`): c_max the largest (2 significant digits) whose ladder,
validation run included, is predicted to take at most that many hours, c_min =
c_max / 10^``ladder.decades``.
"""

from __future__ import annotations

import dataclasses
import math

from chinchax import config as config_lib
from chinchax.cost import budget
from chinchax.cost import hardware as hardware_lib
from chinchax.cost import step_time as step_time_lib
from chinchax.planning import layout as layout_lib
from chinchax.planning import shapes as shapes_lib
import chinchax.ladder.grid as grid

SIZING_ROUNDS = 6  # fixed-point rounds of size_budgets (hours ∝ c_max to a few % per round)


@dataclasses.dataclass(frozen=True)
class RunCost:
  """One run of a ladder on its target.

  Attributes:
    run: the run (its shape, N, D, batch and steps).
    layout: M, remat, loss chunk, mesh and the analytic memory per device.
    step_s: predicted seconds per train step.
    eval_s: predicted seconds of its evals (curve evals and the final one).
    hours: (steps × step_s + eval_s) / 3600, hours of the whole target.
    dollars: hours × the target's $/hour, None without a price.
  """

  run: grid.LadderRun
  layout: layout_lib.Layout
  step_s: float
  eval_s: float
  hours: float
  dollars: float | None


def target(lc) -> hardware_lib.Hardware | None:
  """The ladder's hardware (``ladder.hardware``), None when unset.

  Raises:
    HardwareError: a spec the accelerator table does not know (the message lists the
      names it does).
  """
  spec = str(lc.hardware or "").strip()
  if not spec:
    return None
  try:
    return hardware_lib.parse_hardware(spec)
  except hardware_lib.HardwareError as e:
    raise hardware_lib.HardwareError(f"ladder.hardware: {e}") from None


def batch_multiple(hardware: hardware_lib.Hardware) -> int:
  """What a global batch must divide by on the planner's mesh: all the target's devices."""
  mesh = layout_lib.planned_mesh(hardware)
  return mesh["data"] * mesh["fsdp"]


def batch_multiple_for(config, n_devices: int) -> int:
  """A ladder's batch multiple: the target's (``ladder.hardware``), else data × fsdp of the
  base config's mesh on ``n_devices`` (:func:`chinchax.ladder.grid.data_parallel_size`)."""
  hardware = target(config.ladder)
  if hardware is None:
    return grid.data_parallel_size(config.train_config, n_devices)
  return batch_multiple(hardware)


def step_model(lc, hardware: hardware_lib.Hardware):
  """(step-time model, its source in a few words): ``ladder.step_time``'s file when it names
  one (a calibration), else the target's roofline (MFU 0.5, 70% of HBM bandwidth)."""
  if lc.step_time not in ("", "probe"):
    return step_time_lib.load_step_time_model(lc.step_time), "calibration"
  return step_time_lib.RooflineStepTime(hardware), "roofline"


def run_layout(run: grid.LadderRun, lc, hardware: hardware_lib.Hardware, model=None,
               loss_chunk_size="auto") -> layout_lib.Layout:
  """The planner's layout of ``run`` on ``hardware``; with ``ladder.microbatch_rows`` > 0, M
  raised until a microbatch holds at most that many sequences per device."""
  lay = layout_lib.choose_layout(run.shape, run.hparams.global_batch_size, hardware,
                                 model=model, loss_chunk_size=loss_chunk_size)
  rows = int(lc.microbatch_rows)
  dp = lay.mesh["data"] * lay.mesh["fsdp"]
  if rows <= 0 or lay.microbatch_size // dp <= rows:
    return lay
  b = run.hparams.global_batch_size
  m = next((m for m in layout_lib.microbatch_choices(b, dp) if m >= lay.microbatches
            and b // m // dp <= rows), lay.microbatches)
  prof = layout_lib.profile_for(hardware, model, run.shape.seq_len)
  mem = layout_lib.memory(run.shape, b, lay.mesh, microbatches=m, remat=lay.remat,
                          loss_chunk=lay.loss_chunk, profile=prof)
  t = (None if model is None else layout_lib.predict_step(
      model, run.shape, b, microbatches=m, remat=lay.remat, loss_chunk=lay.loss_chunk,
      causal_skip=prof.causal_skip))
  return dataclasses.replace(lay, microbatches=m, memory=mem, step_time_s=t)


def apply_layout(c, lay: layout_lib.Layout) -> None:
  """Writes a layout into a run's training config: mesh, microbatches, remat, loss chunk."""
  c.mesh.update(data=lay.mesh["data"], fsdp=lay.mesh["fsdp"], tensor=lay.mesh["tensor"])
  c.train.update(microbatches=lay.microbatches, loss_chunk_size=str(lay.loss_chunk))
  c.model.remat = lay.remat


def eval_tokens(train_cfg, run: grid.LadderRun) -> int:
  """Tokens a run evaluates: the final eval and its ``eval_points`` curve evals (windows of
  ``eval_windows`` / ``curve_eval_windows``, else ``eval_batches`` batches)."""
  t = train_cfg
  final = (t.eval_windows or t.eval_batches * run.hparams.global_batch_size) * t.seq_len
  curve = (t.curve_eval_windows or t.eval_windows
           or t.eval_batches * run.hparams.global_batch_size) * t.seq_len
  return final + t.eval_points * curve


def cost_runs(runs: list[grid.LadderRun], lc, train_cfg,
              hardware: hardware_lib.Hardware) -> list[RunCost]:
  """Each run's layout, step time, hours and dollars on ``hardware`` (module doc)."""
  model, _ = step_model(lc, hardware)
  out = []
  for r in runs:
    lay = run_layout(r, lc, hardware, model, train_cfg.loss_chunk_size)
    step = float(lay.step_time_s)
    per_token = step / (r.hparams.global_batch_size * train_cfg.seq_len)
    ev = eval_tokens(train_cfg, r) * per_token / 3.0  # forward only: 2 of a step's 6 FLOPs/param
    hours = (r.hparams.steps * step + ev) / 3600.0
    price = hardware.price_per_hour
    out.append(RunCost(r, lay, step, ev, hours, None if price is None else hours * price))
  return out


def validation_run(lc, train_cfg, vocab: int, multiple: int) -> grid.LadderRun:
  """The validation run as the dry run prices it: C = validate_factor × c_max at the grid's
  centre rule N = sqrt(C / (6 · tokens_per_param)) (the fitted law moves N, not C)."""
  C = lc.validate_factor * lc.c_max
  return grid.make_run(lc, train_cfg, C, math.sqrt(C / (6.0 * lc.tokens_per_param)), vocab,
                       role="validation", prefix="V", batch_multiple=multiple)


def ladder_runs(lc, train_cfg, vocab: int, hardware: hardware_lib.Hardware,
                validate: bool = True) -> list[grid.LadderRun]:
  """The grid's runs on ``hardware``'s batch multiple, then (``validate``) the validation run."""
  k = batch_multiple(hardware)
  runs = grid.plan_runs(lc, train_cfg, vocab, batch_multiple=k)
  return runs + ([validation_run(lc, train_cfg, vocab, k)] if validate and lc.validate else [])


def check_one_step(lc, train_cfg, vocab: int, hardware: hardware_lib.Hardware) -> None:
  """Raises ConfigError when ``ladder.c_min`` is below ``ladder.min_steps`` steps of one
  sequence per device on the shape rule's smallest shape, naming the smallest c_min that
  works."""
  rule = shapes_lib.PRESETS[lc.shape_rule]
  small = shapes_lib.propose_shapes(1.0, vocab_size=vocab, seq_len=train_cfg.seq_len,
                                    rule=rule, k=1)[0]
  k = batch_multiple(hardware)
  least = budget.flops_6nd(small.N, lc.min_steps * k * train_cfg.seq_len)
  if lc.c_min < least:
    raise config_lib.ConfigError(
        f"ladder.c_min={lc.c_min:.3g} FLOPs is below {lc.min_steps} step(s) "
        f"(ladder.min_steps) of {k} sequence(s) of {train_cfg.seq_len} tokens on the smallest "
        f"shape of the {lc.shape_rule!r} rule (d_model {small.shape.d_model}, N {small.N:,}) "
        f"on {hardware.spec}; give ladder.c_min >= {_round_up(least):.2g}")


def check_fits(costs: list[RunCost], hardware: hardware_lib.Hardware) -> None:
  """Raises ConfigError naming the largest run that fits no layout on ``hardware`` (even at
  the largest M with remat full), its memory and what would fit: the device count
  (``layout.min_devices``), or a smaller ``ladder.c_max``."""
  bad = [c for c in costs if not c.layout.fits]
  if not bad:
    return
  worst = max(bad, key=lambda c: c.layout.memory.total)
  ok = [c for c in costs if c.layout.fits and c.run.role == "grid"]
  n = layout_lib.min_devices(worst.run.shape, worst.run.hparams.global_batch_size, hardware,
                             loss_chunk=worst.layout.loss_chunk,
                             profile=layout_lib.profile_for(hardware,
                                                            seq_len=worst.run.shape.seq_len))
  acc = hardware.accelerator
  lay = worst.layout
  more = f"{n} {acc.display_name} devices" if n else "no device count (one sequence is too large)"
  bad_grid = [c.run.C_budget for c in bad if c.run.role == "grid"]
  if bad_grid:  # the budgets below the first one with a run that fits nowhere
    c_ok = max((c.run.C_budget for c in ok if c.run.C_budget < min(bad_grid)), default=None)
    smaller = (f", or ladder.c_max <= {c_ok:.3g} (the largest budget whose runs all fit)"
               if c_ok else "")
  else:
    smaller = ", or a smaller ladder.validate_factor (only the validation run does not fit)"
  raise config_lib.ConfigError(
      f"run {worst.run.run_id} (N={worst.run.counts.total:,}, global batch "
      f"{worst.run.hparams.global_batch_size}) does not fit {hardware.spec} even at M = "
      f"{lay.microbatches} microbatches with remat={lay.remat}: {lay.memory.total / 1e9:.3g} GB "
      f"per device against {(1 - layout_lib.MEMORY_HEADROOM) * lay.capacity / 1e9:.3g} GB "
      f"usable ({len(bad)} run(s) do not fit); use ladder.hardware with {more}{smaller}")


def size_budgets(lc, train_cfg, vocab: int, hardware: hardware_lib.Hardware) -> None:
  """Sets ``lc.c_min`` / ``lc.c_max`` (when ``lc.c_max`` is 0) so the ladder, validation run
  included, is predicted to take at most ``lc.budget_hours`` hours of ``hardware``; a given
  c_max with c_min = 0 gets c_min = c_max / 10^``lc.decades``.

  Raises:
    ConfigError: ``ladder.c_max = 0`` without ``ladder.budget_hours`` > 0.
  """
  if lc.c_max:
    if not lc.c_min:
      lc.c_min = lc.c_max / 10.0 ** float(lc.decades)
    return
  if not lc.budget_hours > 0:
    raise config_lib.ConfigError(
        "ladder.c_max=0 sizes the budgets to ladder.budget_hours of ladder.hardware: give "
        "ladder.budget_hours > 0 (e.g. 24) or a ladder.c_max in FLOPs")
  ratio = 10.0 ** float(lc.decades)
  c_max = 1e18
  for _ in range(SIZING_ROUNDS):
    lc.c_max, lc.c_min = c_max, c_max / ratio
    hours = sum(c.hours for c in cost_runs(ladder_runs(lc, train_cfg, vocab, hardware),
                                             lc, train_cfg, hardware))
    c_max *= lc.budget_hours / hours
  c_max = _round_down(c_max)
  while True:  # the largest 2-digit c_max under the budget
    lc.c_max, lc.c_min = c_max, c_max / ratio
    hours = sum(c.hours for c in cost_runs(ladder_runs(lc, train_cfg, vocab, hardware),
                                             lc, train_cfg, hardware))
    if hours <= lc.budget_hours:
      return
    c_max = _round_down(c_max * 0.97)


def _round_down(x: float) -> float:
  scale = 10.0 ** (math.floor(math.log10(x)) - 1)
  return math.floor(x / scale + 1e-9) * scale


def _round_up(x: float) -> float:
  scale = 10.0 ** (math.floor(math.log10(x)) - 1)
  return math.ceil(x / scale - 1e-9) * scale


def memory_text(lay: layout_lib.Layout) -> str:
  """``12.3/16 GB`` per device (estimate / capacity)."""
  return f"{lay.memory.total / 1e9:.3g}/{lay.capacity / 1e9:.3g} GB"


__all__ = ["RunCost", "apply_layout", "batch_multiple", "batch_multiple_for", "check_fits", "check_one_step",
           "cost_runs", "eval_tokens", "ladder_runs", "memory_text", "run_layout",
           "size_budgets", "step_model", "target", "validation_run"]
