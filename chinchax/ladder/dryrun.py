"""``chinchax ladder --dry-run``: the ladder on its target before a device is rented.

:func:`plan_dry_run` plans the grid for ``ladder.hardware`` (sizing its budgets to
``ladder.budget_hours`` when ``ladder.c_max`` is 0) with the validation run at the
grid's centre rule, and prices every run (:func:`chinchax.ladder.pod.cost_runs`);
nothing is written and no data is read. :func:`render` is the table: one row per run
(shape, N, D, global batch = M × microbatch, steps, memory per device and the share
of it left free, step time and its source, hours and dollars), then the totals and
the expected interval of a that the caller measured on synthetic ladders (the
analysis package's, ``analysis.isoflop.precision``), within 100 columns.
"""

from __future__ import annotations

import dataclasses
import textwrap

from chinchax import config as config_lib
from chinchax.cost import hardware as hardware_lib
from chinchax.train import spec as spec_lib
import chinchax.ladder.grid as grid
import chinchax.ladder.pod as pod


@dataclasses.dataclass
class DryRun:
  """A ladder priced on its target.

  Attributes:
    hardware: the target.
    costs: one per run, the grid's then the validation run.
    source: the step-time model in a few words ("roofline" or "calibration").
    model: its one-line description.
    budget_hours: ``ladder.budget_hours`` (0 = none stated).
    c_min, c_max: the grid's budgets (FLOPs), sized or given.
  """

  hardware: hardware_lib.Hardware
  costs: list[pod.RunCost]
  source: str
  model: str
  budget_hours: float
  c_min: float
  c_max: float

  @property
  def grid_costs(self) -> list[pod.RunCost]:
    return [c for c in self.costs if c.run.role == "grid"]

  @property
  def hours(self) -> float:
    return sum(c.hours for c in self.costs)

  @property
  def dollars(self) -> float | None:
    d = [c.dollars for c in self.costs]
    return None if any(x is None for x in d) else sum(d)

  def to_dict(self) -> dict:
    return {"hardware": self.hardware.to_dict(), "source": self.source, "model": self.model,
            "budget_hours": self.budget_hours, "c_min": self.c_min, "c_max": self.c_max,
            "hours": self.hours, "dollars": self.dollars,
            "runs": [{"run_id": c.run.run_id, "role": c.run.role, "C": c.run.C_budget,
                      "N": c.run.counts.total, "D": c.run.D, "steps": c.run.hparams.steps,
                      "layout": c.layout.to_dict(), "step_s": c.step_s, "eval_s": c.eval_s,
                      "hours": c.hours, "dollars": c.dollars} for c in self.costs]}


def plan_dry_run(config) -> DryRun:
  """Plans and prices the ladder of ``config`` on ``ladder.hardware`` (module doc).

  Raises:
    ConfigError: no ``ladder.hardware``; an invalid ladder; ``ladder.c_min`` below one step
      of the smallest shape; a run that fits the target in no layout (naming what would).
    HardwareError: a target the accelerator table does not know.
  """
  lc, base = config.ladder, config.train_config
  hardware = pod.target(lc)
  if hardware is None:
    raise config_lib.ConfigError(
        "a dry run prices the ladder on named hardware: give ladder.hardware (e.g. v5e-8, "
        "v5p-32, h100x8; configs/ladder.py:pod sets it)")
  if lc.budget_kind != "flops":
    raise config_lib.ConfigError(f"ladder.budget_kind={lc.budget_kind!r}: the dry run prices "
                                 f"IsoFLOP ladders only (ladder.budget_kind='flops')")
  grid.validate_ladder(lc)
  n = hardware.n_devices
  platform = "cpu" if hardware.accelerator.kind == "cpu" else hardware.accelerator.kind
  vocab = spec_lib.resolve(base, n, backend=platform).model.vocab_size
  pod.size_budgets(lc, base.train, vocab, hardware)
  pod.check_one_step(lc, base.train, vocab, hardware)
  costs = pod.cost_runs(pod.ladder_runs(lc, base.train, vocab, hardware), lc, base.train,
                        hardware)
  pod.check_fits(costs, hardware)
  model, source = pod.step_model(lc, hardware)
  return DryRun(hardware, costs, source, model.describe(), float(lc.budget_hours),
                float(lc.c_min), float(lc.c_max))


def _si(x: float) -> str:
  for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
    if x >= scale:
      return f"{x / scale:.3g}{unit}"
  return f"{x:.3g}"


def _gb(x: float) -> str:
  return f"{x / 1e9:.3g}" if x >= 1e7 else "<0.01"


def _ms(s: float) -> str:
  return f"{s * 1e3:.2g}ms" if s < 0.01 else f"{s * 1e3:.3g}ms" if s < 1 else f"{s:.3g} s"


WIDTH = 100  # columns of the table and its wrapped lines
HEADER = (f"{'run':>3} {'C':>6} {'shape':>8} {'N':>6} {'D':>6} {'B = M×m':>12} {'steps':>6} "
          f"{'GB/dv':>5} {'free':>4} {'remat':>5} {'step':>6} {'src':>4} {'hours':>6} {'$':>6}")


def row(i: str, c: pod.RunCost, source: str) -> str:
  """One run's line of the table (≤ 100 columns)."""
  r, lay = c.run, c.layout
  free = 1.0 - lay.memory.total / lay.capacity
  batch = f"{r.hparams.global_batch_size} = {lay.microbatches}×{lay.microbatch_size}"
  dollars = "-" if c.dollars is None else f"{c.dollars:,.0f}"
  budget = f"{r.C_budget:.2g}".replace("e+", "e")
  return (f"{i:>3} {budget:>6} {f'{r.shape.d_model}×{r.shape.n_layers}':>8} "
          f"{_si(r.counts.total):>6} {_si(r.D):>6} {batch:>12} {r.hparams.steps:>6} "
          f"{_gb(lay.memory.total):>5} {100 * free:>3.0f}% {lay.remat:>5} "
          f"{_ms(c.step_s):>6} {source[:4]:>4} {c.hours:>6.3g} {dollars:>6}")


def render(dry: DryRun, precision: dict | None = None) -> str:
  """The dry run's table (module doc); ``precision``: ``analysis.isoflop.precision``'s
  expected interval of a (None: not measured)."""
  h, acc = dry.hardware, dry.hardware.accelerator
  head = [f"ladder dry run on {h.spec} ({h.n_devices}× {acc.display_name}, "
           f"{acc.memory_bytes / 1e9:.3g} GB each): {len(dry.grid_costs)} runs over "
           f"C = {dry.c_min:.3g} … {dry.c_max:.3g} FLOPs, then the validation run (V)",
           ]
  lines = [HEADER]
  for i, c in enumerate(dry.costs, 1):
    lines.append(row("V" if c.run.role == "validation" else str(i), c, dry.source))
  price = h.price_per_hour
  dollars = "no price in the hardware table" if dry.dollars is None else \
      f"${dry.dollars:,.0f} at ${price:.4g}/hour ({acc.price_date}, {acc.price_source})"
  peak = max(dry.costs, key=lambda c: c.layout.memory.total)
  lines.append(f"total: {dry.hours:.2f} hours of {h.spec} = {dry.hours * h.n_devices:.1f} "
               f"device-hours; {dollars}")
  if dry.budget_hours:
    over = dry.hours > dry.budget_hours
    lines.append(f"budget: ladder.budget_hours = {dry.budget_hours:g}: "
                 + ("OVER by " if over else "within, ")
                 + f"{abs(dry.budget_hours - dry.hours):.2f} hours"
                 + (" (lower ladder.c_max)" if over else ""))
  lines.append(f"memory: at most {peak.layout.memory.total / 1e9:.3g} GB per device "
               f"({peak.run.run_id}) of {acc.memory_bytes / 1e9:.3g} GB; the planner keeps 15% "
               f"free; `chinchax compile --ladder` checks each program with XLA")
  lines.append(f"step time: {dry.model}; hours = steps × step + evals (a third of a step "
               f"per token)")
  if precision is not None:
    if precision.get("width") is None:
      lines.append(f"fit: at ladder.fit_noise = {precision['noise']:g} only "
                   f"{precision['fitted']}/{precision['replicates']} synthetic ladders could "
                   f"be fitted: widen the grid (ladder.spread, more budgets) or lower the noise")
    else:
      lines.append(f"fit: expected 95% interval of a (N_opt ∝ C^a): width "
                   f"{precision['width']:.3f} ({precision['lo']:.3f} … {precision['hi']:.3f} "
                   f"around a = {precision['a_true']:.3f}) at ladder.fit_noise = "
                   f"{precision['noise']:g}, Approach 2 on {precision['fitted']} synthetic "
                   f"ladders of the planned runs ({precision['law']} law)")
  foot = lines[len(dry.costs) + 1:]
  wrap = lambda text: textwrap.fill(text, WIDTH, subsequent_indent="  ")  # noqa: E731
  return "\n".join([wrap(x) for x in head] + lines[:len(dry.costs) + 1]
                   + [wrap(x) for x in foot])
