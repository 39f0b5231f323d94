"""Every distinct program of a ladder, as train configs ``chinchax compile --ladder`` compiles.

A ladder (``configs/ladder.py``) is many train runs; before its workers are started on
a slice, each program they will run is compiled for it: one per distinct shape ×
batch layout (global batch, microbatches M, remat, loss chunk, mesh), the validation
run included (at the grid's centre rule: the fitted law moves its N, not its budget).
With ``ladder.hardware`` (or, when it is unset, the ``--topology`` itself as the
hardware) each run has the planner's layout (:mod:`chinchax.ladder.pod`), as the
ladder will train it. :func:`render` lists the programs with XLA's memory per device
beside the planner's analytic figure and the compile time, then every run that does
not fit with its remedy.
"""

from __future__ import annotations

import dataclasses
import pathlib

from chinchax import config as config_lib
from chinchax import console
from chinchax.aot.topology import AotError, Target
from chinchax.cost import hardware as hardware_lib
from chinchax.ladder import grid
from chinchax.ladder import pod
from chinchax.train import spec as spec_lib


@dataclasses.dataclass
class Program:
  """One distinct program of a ladder.

  Attributes:
    key: (d_model, n_layers, n_heads, d_ff, global batch, M, remat, loss chunk, mesh).
    config: the train config of its first run (what is compiled).
    run_ids: every run that trains this program.
    analytic_bytes: the planner's memory estimate per device (None without a layout).
  """

  key: tuple
  config: object
  run_ids: list[str]
  analytic_bytes: float | None = None


def is_ladder_config(config) -> bool:
  """True for a ladder config (``ladder`` and ``train_config`` sections)."""
  return "ladder" in config and "train_config" in config


def _hardware(config, target: Target) -> hardware_lib.Hardware | None:
  """The ladder's hardware on ``target``: ``ladder.hardware``, which must have the target's
  device count, else the target's own spec when the hardware table knows it."""
  lc = config.ladder
  hw = pod.target(lc)
  if hw is None:
    try:
      return hardware_lib.parse_hardware(target.spec)
    except hardware_lib.HardwareError:
      return None
  if hw.n_devices != target.n_devices:
    raise AotError(f"ladder.hardware={lc.hardware!r} has {hw.n_devices} devices but --topology "
                   f"{target.spec} has {target.n_devices}; give the same target to both (or "
                   f"leave ladder.hardware unset)")
  if (hw.accelerator.name, hw.n_devices) != (target.accelerator.name, target.hardware.n_devices):
    console.warn(f"compiling the ladder planned for ladder.hardware={hw.spec} (its layouts, "
                 f"microbatches and remat) on --topology {target.spec}; "
                 f"--config.ladder.hardware={target.spec} plans it for {target.spec}")
  return hw


def ladder_programs(config, target: Target) -> list[Program]:
  """The distinct programs of the ladder of ``config`` on ``target`` (module doc).

  Raises:
    ConfigError: an invalid ladder or training config (as ``chinchax ladder`` would), a
      budget below one step of the smallest shape, a run that fits the target in no layout.
    AotError: ``ladder.hardware`` and ``--topology`` of different device counts.
  """
  lc, base = config.ladder, config.train_config
  n = target.n_devices
  hw = _hardware(config, target)
  if hw is not None and not lc.hardware:
    lc.hardware = hw.spec
  grid.validate_ladder(lc)
  config_lib.validate(base, n)
  vocab = spec_lib.resolve(base, n, backend=target.platform).model.vocab_size
  if hw is None:  # a target the planner cannot lay out: the runs as the base config has them
    runs = grid.plan_runs(lc, base.train, vocab,
                          batch_multiple=grid.data_parallel_size(base, n))
    costs = None
  else:
    pod.size_budgets(lc, base.train, vocab, hw)
    pod.check_one_step(lc, base.train, vocab, hw)
    runs = pod.ladder_runs(lc, base.train, vocab, hw)
    costs = pod.cost_runs(runs, lc, base.train, hw)
    pod.check_fits(costs, hw)
  programs: dict[tuple, Program] = {}
  for i, r in enumerate(runs):
    c = grid.run_config(base, r, pathlib.Path(config.workdir))
    analytic = None
    if costs is not None:
      pod.apply_layout(c, costs[i].layout)
      analytic = costs[i].layout.memory.total
    s = r.shape
    key = (s.d_model, s.n_layers, s.n_heads, s.d_ff, c.train.global_batch_size,
           c.train.microbatches, c.model.remat, str(c.train.loss_chunk_size),
           (c.mesh.data, c.mesh.fsdp, c.mesh.tensor))
    if key in programs:
      programs[key].run_ids.append(r.run_id)
    else:
      programs[key] = Program(key, c, [r.run_id], analytic)
  return list(programs.values())


def largest_run_config(config, target: Target):
  """(train config of the ladder's program with the most parameters × sequences, its first
  run's id): the one program to check when only one is compiled."""
  progs = ladder_programs(config, target)
  p = max(progs, key=lambda p: (p.config.model.d_model ** 2 * p.config.model.n_layers
                                * p.config.train.global_batch_size))
  return p.config, p.run_ids[0]


def _gb(x) -> str:
  return "-" if x is None else f"{x / 1e9:.3g}"


def row(i: int, p: Program, rep: dict) -> str:
  """One program's line: shape, batch layout, XLA's and the analytic GB per device, compile s."""
  r, ts = rep["run"], rep["train_step"]
  xla = (ts.get("memory") or {}).get("total")
  state = "fits" if rep["fits"] else "NO FIT"
  cached = " (cached)" if rep.get("cached") else ""
  shape = f"{r['d_model']}×{r['n_layers']}"
  batch = f"{r['global_batch_size']} = {r['microbatches']}×{r['microbatch_size']}"
  return (f"{i:>3} {shape:>9} {r['N'] / 1e6:>7.1f}M {batch:>12} {r['remat']:>5} "
          f"{_gb(xla):>6} {_gb(p.analytic_bytes):>6} {state:>6} "
          f"{ts.get('compile_s', 0.0):>9.1f} {len(p.run_ids):>2} run(s){cached}")


HEADER = (f"{'#':>3} {'shape':>9} {'N':>8} {'B = M×m':>12} {'remat':>5} {'XLA GB':>6} "
          f"{'model':>6} {'':>6} {'compile s':>9}")


def render(programs: list[Program], reports: list[dict], target: Target) -> str:
  """The table of the ladder's programs on ``target``, then each run that does not fit, with
  its remedy (the report's first suggestion)."""
  lines = [f"ladder: {len(programs)} distinct programs of "
           f"{sum(len(p.run_ids) for p in programs)} runs on {target.spec}", HEADER]
  lines += [row(i, p, rep) for i, (p, rep) in enumerate(zip(programs, reports), 1)]
  bad = [(p, rep) for p, rep in zip(programs, reports) if not rep["fits"]]
  worst = max((rep.get("analytic_memory_ratio") or 0.0 for rep in reports), default=0.0)
  ratios = [rep.get("analytic_memory_ratio") for rep in reports
            if rep.get("analytic_memory_ratio")]
  if ratios:
    lines.append(f"model/XLA memory: {min(ratios):.2f} … {worst:.2f} over the programs that fit")
  if not bad:
    lines.append(f"every program fits {target.spec}")
  for p, rep in bad:
    why = rep["train_step"].get("error") or "over the device's memory"
    fix = (rep.get("suggestions") or ["chinchax compile --search"])[0]
    lines.append(f"does not fit: {', '.join(p.run_ids)}: {why[:120]}; remedy: {fix}")
  return "\n".join(lines)
