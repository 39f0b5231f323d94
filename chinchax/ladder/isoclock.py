"""IsoTime runs on their own clock (``ladder.time_control = "decay"``).

A step count fixed before a run starts can only be as good as the step time it
is planned from, and on a shared host a shape's step time moves between calls
of the same program (on this project's 2-core VM, 50-step windows of one run
spread ±10%; eight repeats of one run 23-28 ms a step: docs/time-budgets.md). A seconds
budget is then missed by that much. The warmup-stable-decay schedule (Hägele et
al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
Durations", Sec. 3) does not need the horizon until its decay begins, so here:

1. **Plan** (``runs/<run_id>/time_plan.json``, before the run starts): the
   step time of the probe or step-time file (as ``ladder.time_control=fixed``
   plans it, :func:`chinchax.ladder.isotime.time_plan`), the planned steps
   floor(T / t), the warmup (capped at 10% of the planned steps) and the
   stable phase's end, (1 - ``ladder.cooldown_fraction``) · T seconds.
2. **Stable phase** (``runs/<run_id>/stable``): warmup then constant peak LR,
   stopped on the run's own clock (``train.stop_after_s``) after the stable
   seconds of training, and checkpointed at its last step k.
3. **Decision**: with t the step time measured over the stable phase, the
   run's steps are S = k + max(1, round((T - t·k) / t)); written to the time
   plan before the decay starts, so a resumed run keeps S and its schedule.
4. **Decay** (``runs/<run_id>``): the wsd run of S steps whose decay starts at
   k, started from the stable phase's checkpoint at k (``train.init_from``).
   Up to k its schedule and batches equal the stable phase's, so the run
   equals, bitwise, the wsd run of S steps with its decay at k trained from
   scratch (``tests/test_isoclock.py``).

A stable phase interrupted before its stop resumes from its checkpoint and
counts the steps before the interruption at the planned step time.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil

from chinchax.cost import budget
from chinchax import train as train_lib
from chinchax.checkpoint.integrity import saved_steps
from chinchax.storage import atomic as files
import chinchax.ladder.grid as grid
import chinchax.ladder.isotime as isotime

STABLE_DIR = "stable"
NEVER = 10 ** 9


def run_dir(plan, r: grid.LadderRun) -> pathlib.Path:
  """The run's training workdir, ``<workdir>/runs/<run_id>`` (as ``grid.run_config``)."""
  return plan.workdir / "runs" / r.run_id


def clock_plan(plan, r: grid.LadderRun) -> dict:
  """Run ``r``'s time plan: read from ``runs/<run_id>/time_plan.json``, or planned and written.

  Returns:
    {"time_control": "decay", "seconds_budget" (T), "step_time_s" (planned seconds per
    step), "step_time_source", "steps_planned" = floor(T / t), "warmup_steps",
    "stable_s" = (1 - cooldown_fraction)·T, "steps_cap" (the stable phase's upper step
    bound), "global_batch_size", "host", "probe"}; after the decision also "steps" (S),
    "decay_start_step" (k) and "stable" (its measured steps, step time and seconds).
  Raises:
    ConfigError: the probe failed or too few steps fit the budget.
    StepTimeError: the step-time file cannot be used.
  """
  path = run_dir(plan, r) / isotime.TIME_PLAN_FILE
  if path.exists():
    return json.loads(path.read_text())
  lc = plan.config.ladder
  t, source, probed = isotime.planned_step_time(plan, r)
  planned = isotime.steps_in_budget(lc, r, t, source)
  base_warmup = (r.hparams.warmup_steps if r.hparams.rule != "fixed"
                 else plan.config.train_config.train.warmup_steps)
  out = {"time_control": "decay", "seconds_budget": float(r.seconds_budget),
         "step_time_s": float(t), "step_time_source": source, "steps_planned": planned,
         "warmup_steps": min(int(base_warmup), budget.max_warmup_steps(planned)),
         "stable_s": (1.0 - lc.cooldown_fraction) * float(r.seconds_budget),
         "steps_cap": 2 * planned, "global_batch_size": r.hparams.global_batch_size,
         "host": isotime.host(), "probe": probed}
  _write(path, out)
  return out


def _write(path: pathlib.Path, plan_dict: dict) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  files.write_atomic(path, json.dumps(plan_dict, indent=2))


def _wsd(c, tp: dict, decay_start_step: int):
  c.train.update(schedule="wsd", decay_start_step=int(decay_start_step),
                 warmup_steps=int(tp["warmup_steps"]), progress=False)
  return c


def stable_config(plan, r: grid.LadderRun, tp: dict, stop_after_s: float):
  """The stable phase's training config: ``steps_cap`` steps of warmup then constant LR (its
  decay start at the cap: no decay), stopped after ``stop_after_s`` seconds of training, one
  checkpoint (its last step), in ``runs/<run_id>/stable``."""
  c = isotime.run_config(plan.config.train_config, r, plan.workdir, tp["steps_cap"])
  c.workdir = str(run_dir(plan, r) / STABLE_DIR)
  c.train.update(stop_after_s=float(stop_after_s), checkpoint_every=NEVER, keep_checkpoints=1,
                 eval_points=0, save_steps="")
  return _wsd(c, tp, tp["steps_cap"])


def decay_config(plan, r: grid.LadderRun, tp: dict):
  """The decided run's training config: S = ``tp["steps"]`` steps, wsd with its decay from
  k = ``tp["decay_start_step"]``, started from the stable phase's checkpoint at k."""
  k = int(tp["decay_start_step"])
  c = isotime.run_config(plan.config.train_config, r, plan.workdir, tp["steps"])
  c.train.update(init_from=str(run_dir(plan, r) / STABLE_DIR), init_step=k)
  return _wsd(c, tp, k)


def decide(tp: dict, stable_steps: int, step_time_s: float, stable_train_s: float) -> dict:
  """The decision after the stable phase: S = k + max(1, round((T - stable seconds) / t)).

  Args:
    tp: the time plan (:func:`clock_plan`).
    stable_steps: k, the stable phase's last step.
    step_time_s: t, seconds per step measured over the stable phase.
    stable_train_s: seconds of training in the stable phase (t·k, plus the planned time of
      steps before an interruption).
  Returns:
    ``tp`` with "steps", "decay_start_step" and "stable" added.
  Raises:
    ValueError: a step time that is not a positive number.
  """
  if not (math.isfinite(step_time_s) and step_time_s > 0):
    raise ValueError(f"the stable phase measured a step time of {step_time_s!r} s")
  decay_steps = max(1, int(round((tp["seconds_budget"] - stable_train_s) / step_time_s)))
  return {**tp, "steps": int(stable_steps) + decay_steps, "decay_start_step": int(stable_steps),
          "stable": {"steps": int(stable_steps), "step_time_s": float(step_time_s),
                     "train_s": float(stable_train_s)}}


def train_clocked(plan, r: grid.LadderRun, tp: dict) -> tuple[dict, object, dict]:
  """Trains (or resumes) run ``r`` on its clock: stable phase, decision, decay (module doc).

  Returns:
    (time plan, the decay's config, its summary with ``step_time_s`` and ``compile_s`` of
    the whole run: the stable phase's seconds and the decay's over S steps).
  Raises:
    whatever ``train`` raises (Preempted, Diverged, ...): the plan keeps what was decided.
  """
  path = run_dir(plan, r) / isotime.TIME_PLAN_FILE
  if "steps" not in tp:
    stable_dir = run_dir(plan, r) / STABLE_DIR
    k0 = max(saved_steps(stable_dir), default=0)  # steps of an interrupted stable phase
    before_s = k0 * tp["step_time_s"]
    cfg = stable_config(plan, r, tp, max(tp["stable_s"] - before_s, 1e-9))
    s = train_lib.train(cfg, devices=plan.devices, verbose=False, lease_held=True)
    k, t = int(s["steps"]), float(s["step_time_s"])
    tp = decide(tp, k, t, before_s + t * (k - k0))
    tp["stable"].update(compile_s=s.get("compile_s"), resumed_at=k0,
                        stopped_by_time=bool(s.get("stopped_by_time")))
    _write(path, tp)
  cfg = decay_config(plan, r, tp)
  summary = dict(train_lib.train(cfg, devices=plan.devices, verbose=False, lease_held=True))
  k, S = tp["decay_start_step"], tp["steps"]
  decay_t = summary.get("step_time_s")
  if decay_t is not None and math.isfinite(decay_t) and summary["steps"] == S:
    total_s = tp["stable"]["train_s"] + decay_t * (S - k)
    summary.update(step_time_s=total_s / S, decay_step_time_s=decay_t,
                   compile_s=(tp["stable"].get("compile_s") or 0.0)
                   + (summary.get("compile_s") or 0.0))
    shutil.rmtree(run_dir(plan, r) / STABLE_DIR / "checkpoints", ignore_errors=True)
  return tp, cfg, summary
