"""The IsoTime ladder: budgets in seconds of training, width × depth at equal N.

"Time Matters" (Inbar & Sernau 2024, arXiv 2406.18922) claims that on a fixed
wall-clock budget a step's time, not its FLOPs, decides how many tokens a shape
sees, and that faster (wider, shallower) shapes win. This ladder tests that on
the hardware it runs on (``ladder.budget_kind = "seconds"``):

* **Grid.** Time budgets T from ``t_min`` to ``t_max`` seconds (``n_budgets``,
  geometric). Each budget is centred on the law-free guess N_opt(C) =
  sqrt(C / (6 · tokens_per_param)) at the nominal compute C = T ×
  ``flops_per_s``; ``sizes_per_budget`` N levels spread around it as on an
  IsoFLOP grid, and every N level is trained at each depth of ``ladder.depths``
  with the width of the ``"ladder"`` shape rule nearest that N (so shapes of
  ≈ equal N but different aspect ratio d_model / n_layers meet at equal time).
  Peak LR, batch, β2 and warmup come from the ``ladder.hparams`` rule at the
  nominal C.
* **Steps are fixed before a run starts** (``ladder.time_control = "fixed"``;
  ``"decay"`` fixes them at the decay of a wsd run from its own measured step
  time instead, :mod:`chinchax.ladder.isoclock`): floor(T / t_step), with t_step
  the mean of a short timed probe of its compiled step on its devices (``ladder.step_time = "probe"``: a short ``chinchax train`` of the
  run's config, :func:`probe`, cached per shape and host under
  ``<workdir>/probes/<host>/``) or a step-time file's prediction.
  The plan is written once to ``runs/<run_id>/time_plan.json``; a resumed run
  reads it back, so its schedule and step count never change.
* **Rows** record the budgeted seconds, the planned and measured step time, the
  measured training seconds (steps × measured step time: compilation, evals and
  checkpoints excluded; they are in ``compile_s`` and ``wall_time_s``), steps,
  tokens, FLOPs and loss (:func:`row_fields`).
* **Validation.** After the fit (``analysis.isotime.fit``), one run at
  ``validate_factor`` × ``t_max`` seconds with the shape of the ladder's family
  that the fitted law and step-time predictor rank best
  (:func:`plan_validation`), its predicted loss stored in its row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import shutil
import socket

import jax
import numpy as np

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.cost import hardware as hardware_lib
from chinchax.laws import parametric as laws
from chinchax.cost import step_time as step_time_lib
from chinchax import train as train_lib
from chinchax.storage import atomic as files
from chinchax.storage import paths as paths_lib
import chinchax.ladder.grid as grid

PROBES_DIR = "probes"
TIME_PLAN_FILE = "time_plan.json"


def budgets_s(lc) -> np.ndarray:
  """The time budgets T (seconds of training), geometric from ``t_min`` to ``t_max``."""
  return np.geomspace(lc.t_min, lc.t_max, lc.n_budgets)


def nominal_flops(lc, seconds: float) -> float:
  """The compute (6ND FLOPs) a budget of ``seconds`` is centred on: T × ``ladder.flops_per_s``."""
  return float(seconds) * float(lc.flops_per_s)


def plan_runs(lc, base_train, vocab_size: int, batch_multiple: int = 1) -> list[grid.LadderRun]:
  """The IsoTime grid: per budget T, ``sizes_per_budget`` N levels × ``ladder.depths``.

  N levels are N_opt · spread^u (u evenly in [−1, 1], N_opt from the nominal
  compute, module docstring); each level is made a shape at every depth by the
  ``"ladder"`` rule with that depth (width in steps of 4, two heads), each run
  keeping the level as ``N_target``. Budgets smallest first, then N level, then
  depth.
  """
  depths = grid.parse_depths(lc.depths)
  runs = []
  for T in budgets_s(lc):
    T = float(f"{T:.3g}")  # the id's budget is the budget
    C = nominal_flops(lc, T)
    n_opt = math.sqrt(C / (6.0 * lc.tokens_per_param))
    seen: dict[int, set[int]] = {depth: set() for depth in depths}  # sizes taken, per depth
    for u in np.linspace(-1.0, 1.0, lc.sizes_per_budget):
      for depth in depths:
        run = grid.make_run(lc, base_train, C, n_opt * lc.spread ** u, vocab_size,
                            exclude=frozenset(seen[depth]), batch_multiple=batch_multiple,
                            n_layers=depth, seconds=T)
        seen[depth].add(run.counts.total)
        runs.append(run)
  return runs


def run_config(base, run: grid.LadderRun, workdir: pathlib.Path, steps: int):
  """The training config of an IsoTime run of ``steps`` steps (``budget.mode = "steps"``):
  its cosine schedule ends on its last step; warmup capped at 10% of the steps."""
  c = grid.run_config(base, run, workdir)
  c.budget.update(mode="steps", steps=int(steps))
  if run.hparams.rule != "fixed":
    c.train.warmup_steps = min(run.hparams.warmup_steps, budget.max_warmup_steps(int(steps)))
  return c


def host() -> str:
  """This machine's name: probes are cached per host."""
  return socket.gethostname()


def _probe_key(cfg, devices) -> str:
  """A digest of what a step's time depends on: model, batch, devices, JAX version."""
  key = {"model": cfg.model.to_dict(), "global_batch_size": cfg.train.global_batch_size,
         "seq_len": cfg.train.seq_len, "n_devices": len(devices),
         "device_kind": devices[0].device_kind, "mesh": cfg.mesh.to_dict(),
         "jax": jax.__version__}
  return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def probe(plan, r: grid.LadderRun) -> dict:
  """Times run ``r``'s train step on ``plan.devices`` as its run will take it; cached per shape
  and host.

  The probe is ``chinchax train`` itself for ``ladder.probe_steps`` + 1 steps: the run's
  model, batch, mesh and data pipeline (its reader threads share the run's cores), the first
  (compiling) step excluded, the others timed back to back by the loop's own clock. A bare
  step timed on random tokens (``chinchax bench``) misses the input pipeline's share, which
  on one CPU core was up to 17% of a step. The probe's own workdir is removed afterwards.

  Returns:
    {"step_time_s": mean seconds per timed step, "timed_steps", "compile_s" (the first
    step), "wall_s" (the whole probe), "host", "cached": whether it was read from the cache}.
  Raises:
    ConfigError: the probe run failed (its error included).
  """
  lc = plan.config.ladder
  cfg = run_config(plan.config.train_config, r, plan.workdir, lc.probe_steps + 1)
  path = plan.workdir / PROBES_DIR / host() / f"{_probe_key(cfg, plan.devices)}.json"
  if path.exists():
    return {**json.loads(path.read_text()), "cached": True}
  run_dir = files.unique_path(path.with_suffix(".run"))
  never = 10 ** 9
  cfg.workdir = str(run_dir)
  cfg.train.update(progress=False, log_every=never, eval_every=never, eval_points=0,
                   eval_windows=0, eval_batches=1, checkpoint_every=never, keep_checkpoints=1,
                   save_steps="")
  try:
    summary = train_lib.train(cfg, devices=plan.devices, verbose=False, lease_held=True)
  except Exception as e:  # noqa: BLE001 — one clear error for the run that needed it
    raise config_lib.ConfigError(
        f"the step-time probe of run {r.run_id} (d_model {r.shape.d_model} × "
        f"{r.shape.n_layers} layers, batch {r.hparams.global_batch_size}) failed: "
        f"{type(e).__name__}: {str(e)[:500]}") from None
  finally:
    shutil.rmtree(run_dir, ignore_errors=True)
  out = {"step_time_s": float(summary["step_time_s"]), "timed_steps": lc.probe_steps,
         "compile_s": summary["compile_s"], "wall_s": summary["wall_s"], "host": host()}
  path.parent.mkdir(parents=True, exist_ok=True)
  files.write_atomic(path, json.dumps(out, indent=2))
  return {**out, "cached": False}


def steps_in_budget(lc, r: grid.LadderRun, step_time_s: float, source: str) -> int:
  """floor(T / t_step): the steps of run ``r`` in its budget.

  Raises:
    ConfigError: fewer than ``ladder.min_steps`` steps fit (or the step time is
      not a positive number); the message names the smallest t_min that works.
  """
  T = float(r.seconds_budget)
  if not (math.isfinite(step_time_s) and step_time_s > 0):
    raise config_lib.ConfigError(f"run {r.run_id}: the {source} gives a step time of "
                                 f"{step_time_s!r} s; it must be a positive number")
  steps = int(math.floor(T / step_time_s))
  if steps < lc.min_steps:
    need = lc.min_steps * step_time_s * lc.t_min / T
    raise config_lib.ConfigError(
        f"run {r.run_id} (d_model {r.shape.d_model} × {r.shape.n_layers} layers, batch "
        f"{r.hparams.global_batch_size}): a step takes {step_time_s * 1e3:.3g} ms ({source}), "
        f"so its budget of {T:g} s holds only {steps} steps (ladder.min_steps={lc.min_steps}); "
        f"raise ladder.t_min to at least {need:.3g} s, or lower ladder.min_steps")
  return steps


def planned_step_time(plan, r: grid.LadderRun) -> tuple[float, str, dict | None]:
  """(seconds per step, its source "probe" or "model: ...", the probe's record or None) of
  run ``r`` by ``ladder.step_time``.

  Raises:
    ConfigError: the probe failed, or the file was measured on other devices.
    StepTimeError: the step-time file cannot be used.
  """
  if plan.config.ladder.step_time == "probe":
    probed = probe(plan, r)
    return float(probed["step_time_s"]), "probe", probed
  model = _model(plan)
  return (float(model.predict(r.shape, r.hparams.global_batch_size)),
          f"model: {model.describe()}", None)


def time_plan(plan, r: grid.LadderRun) -> dict:
  """Run ``r``'s fixed step count: read from ``runs/<run_id>/time_plan.json``, or planned
  (probe or step-time file, :func:`steps_in_budget`) and written there once.

  Returns:
    {"seconds_budget", "step_time_s" (the planned seconds per step),
    "step_time_source" ("probe" or "model: ..."), "steps", "host", "probe"}.
  Raises:
    ConfigError: the probe failed or too few steps fit the budget.
    StepTimeError: the step-time file cannot be used.
  """
  path = plan.workdir / "runs" / r.run_id / TIME_PLAN_FILE
  if path.exists():
    return json.loads(path.read_text())
  lc = plan.config.ladder
  gbs = r.hparams.global_batch_size
  t, source, probed = planned_step_time(plan, r)
  steps = steps_in_budget(lc, r, t, source)
  out = {"seconds_budget": float(r.seconds_budget), "step_time_s": float(t),
         "step_time_source": source, "steps": steps, "global_batch_size": gbs, "host": host(),
         "probe": probed}
  path.parent.mkdir(parents=True, exist_ok=True)
  files.write_atomic(path, json.dumps(out, indent=2))
  return out


def _model(plan):
  """``ladder.step_time``'s model, measured on as many devices as the runs use.

  Raises:
    StepTimeError: the file cannot be used.
    ConfigError: it was measured on another number of devices.
  """
  path = pathlib.Path(plan.config.ladder.step_time).expanduser()
  model = step_time_lib.load_step_time_model(path)
  if model.fallback.n_devices != len(plan.devices):
    raise config_lib.ConfigError(
        f"ladder.step_time={str(path)!r} was measured on {model.fallback.n_devices} device(s), "
        f"the runs use {len(plan.devices)}; measure it on the runs' devices or use 'probe'")
  return model


def check_budgets(plan) -> None:
  """Before any run starts: every run fits ``ladder.min_steps`` steps in its budget.

  With a step-time file every run is checked; with probes, the run most likely
  to be the slowest of the smallest budget (its largest N level at its largest
  depth) is probed here (the probe is cached for its run).

  Raises:
    ConfigError: the first run that cannot (see :func:`steps_in_budget`).
  """
  lc = plan.config.ladder
  runs = [r for r in plan.runs if r.seconds_budget is not None]
  if not runs:
    return
  if lc.step_time != "probe":
    model = _model(plan)
    for r in runs:
      steps_in_budget(lc, r, float(model.predict(r.shape, r.hparams.global_batch_size)),
                      f"model: {model.describe()}")
    return
  t_lo = min(r.seconds_budget for r in runs)
  slowest = max((r for r in runs if r.seconds_budget == t_lo),
                key=lambda r: (r.N_target, r.shape.n_layers, r.counts.total))
  steps_in_budget(lc, slowest, probe(plan, slowest)["step_time_s"], "probe")


def hardware_spec(devices) -> str:
  """The accelerator-table name of ``devices`` (``cpu``, ``h100``, …), else their device kind."""
  acc = hardware_lib.match_accelerator(devices[0].device_kind, jax.default_backend(),
                                       hardware_lib.load_accelerators())
  return acc.name if acc is not None else devices[0].device_kind.lower().replace(" ", "-")


def row_fields(plan, r: grid.LadderRun, tp: dict, summary: dict, cfg) -> dict:
  """The IsoTime columns of run ``r``'s results row (the module docstring)."""
  t = summary.get("step_time_s")
  timed = t is not None and math.isfinite(t)
  probed = tp.get("probe") or {}
  model = train_lib.resolve(cfg, len(plan.devices)).model  # "auto" dtype and kernel resolved
  return {
      "budget_kind": "seconds", "seconds_budget": float(r.seconds_budget),
      "N_target": r.N_target, "step_time_planned_s": tp["step_time_s"],
      "step_time_source": tp["step_time_source"],
      "step_time_s": float(t) if timed else None,
      "train_time_s": float(t) * summary["steps"] if timed else None,
      "train_time_error": (float(t) * summary["steps"] / r.seconds_budget - 1.0) if timed
      else None,
      "compile_s": summary.get("compile_s"), "n_devices": len(plan.devices),
      "hardware": hardware_spec(plan.devices), "compute_dtype": model.compute_dtype,
      # the step-time profile's two kinds: scores materialised (xla) or a flash kernel
      "attention": "xla" if model.attention == "xla" else "cudnn",
      "attention_impl": model.attention,
      "probe": {k: probed.get(k) for k in ("step_time_s", "timed_steps", "compile_s", "wall_s",
                                           "host")} if probed else None,
      "time_control": tp.get("time_control", "fixed"),
      **({"stable": tp["stable"], "decay_start_step": tp["decay_start_step"],
          "decay_step_time_s": summary.get("decay_step_time_s"), "schedule": "wsd"}
         if "stable" in tp else {"schedule": "cosine"})}


def plan_validation(plan, fit_json: pathlib.Path) -> tuple[grid.LadderRun, dict]:
  """The IsoTime validation run: ``validate_factor`` × ``t_max`` seconds, with the shape of the
  ladder's family (every depth of ``ladder.depths``, N from N_opt/8 to 8·N_opt of the nominal
  compute) that the fit's law and chosen step-time predictor rank best — the lowest predicted
  L(N, D) with D = floor(T / t_pred) · tokens per step, as ``chinchax plan --hours`` ranks shapes
  (``chinchax.planning.timed``), with the ladder's hyperparameter rule.

  Returns:
    (run, prediction): prediction holds ``predicted_loss`` (nats/token),
    ``predicted_step_time_s``, ``predicted_steps``, ``predicted_D``, ``predictor``,
    ``law`` and the number of candidates ranked.
  Raises:
    ValueError: ``fit_json`` has no L(N, D) law or no step-time predictor.
    OSError: it cannot be read.
  """
  lc = plan.config.ladder
  fit = json.loads(paths_lib.as_path(fit_json).read_text())
  law = laws.law_from_dict(fit, name="isotime-fit")
  if not isinstance(law, laws.ParametricLaw):
    raise ValueError(f"{fit_json} has no L(N, D) law (Approach 3), only an allocation")
  if not isinstance(fit.get("step_time"), dict):
    raise ValueError(f"{fit_json} has no 'step_time' predictor (not an IsoTime fit)")
  model = step_time_lib.model_from_dict(fit["step_time"])
  T = float(lc.validate_factor * lc.t_max)
  C = nominal_flops(lc, T)
  n_opt = math.sqrt(C / (6.0 * lc.tokens_per_param))
  base = plan.config.train_config
  multiple = grid.data_parallel_size(base, len(plan.devices))
  best, seen = None, set()
  for depth in grid.parse_depths(lc.depths):
    for n in np.geomspace(n_opt / 8.0, n_opt * 8.0, 25):
      run = grid.make_run(lc, base.train, C, float(n), plan.vocab, role="validation",
                          prefix="V", batch_multiple=multiple, n_layers=depth, seconds=T)
      if run.shape in seen:
        continue
      seen.add(run.shape)
      gbs = run.hparams.global_batch_size
      t = float(model.predict(run.shape, gbs))
      steps = int(math.floor(T / t)) if t > 0 else 0
      if steps < lc.min_steps:
        continue
      D = steps * gbs * base.train.seq_len
      loss = float(law.loss_shape(run.counts.total, D, run.shape.d_model / run.shape.n_layers)
                   if isinstance(law, laws.AspectLaw) else law.loss(run.counts.total, D))
      if best is None or loss < best[1]["predicted_loss"]:
        best = (run, {"predicted_loss": loss, "predicted_step_time_s": t,
                      "predicted_steps": steps, "predicted_D": D})
  if best is None:
    raise ValueError(f"no shape of the ladder's family fits ladder.min_steps={lc.min_steps} "
                     f"steps in {T:g} s by the fit's step-time predictor")
  run, pred = best
  run = dataclasses.replace(run, N_target=float(run.counts.total))
  pred.update(predictor=fit.get("chosen_predictor") or model.name, law=law.name,
              n_candidates=len(seen))
  return run, pred
