"""``chinchax plan``: a FLOP, wall-clock or dollar budget as a compute-optimal run.

One of --flops, --hours or --dollars is the budget (--hours and --dollars need
--hardware). The plan (model shape, tokens, batch, steps, learning rate,
predicted loss) is printed as a table, or JSON with --json; --write-config
writes it as a config file that chinchax train trains exactly. With
--unique-tokens U (a --flops budget) the plan is the data-constrained optimum:
repeated tokens are worth less, so it trains D / U epochs of a possibly
different N, reported beside the unconstrained answer and the loss the limit
costs (chinchax.planning.constrained). A budget below
one step of the smallest shape is refused, naming the smallest that works;
a plan whose FLOPs land more than 10% off the budget says so. Bad input is one
error line (exit 2) before anything is written.

Example:
  chinchax plan --flops 1e21 --law chinchilla-approach1
  chinchax plan --hours 48 --hardware v5p-128 --write-config runs/planned.py
  chinchax plan --flops 1e21 --unique-tokens 2e10 --law chinchilla-approach3
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys

from chinchax import config as config_lib
from chinchax import console
from chinchax.cost import hardware as hardware_lib
from chinchax.laws import parametric as laws
from chinchax.laws import units as law_units
from chinchax.laws import parametric as laws_parametric
from chinchax.laws import repeat as laws_repeat
from chinchax.cost import step_time as step_time_lib
from chinchax.cli import helptext
from chinchax.planning import config_file
from chinchax.planning import constrained
from chinchax.planning import loss_units
from chinchax.planning import planner
from chinchax.planning import recipe as recipe_lib
from chinchax.planning import render
from chinchax.planning.errors import PlanError


# The vocabulary of a plan for accelerators when neither --vocab-size nor the law's recipe
# names one: a 32k BPE (data.tokenizer=bpe), the size of Chinchilla's and Llama 2's vocabularies.
ACCELERATOR_VOCAB_SIZE = 32768

_NUMERIC_FLAGS = ("--flops", "--hours", "--dollars", "--vocab-size", "--seq-len", "--mfu",
                  "--bandwidth-efficiency", "--candidates", "--calibrate", "--unique-tokens")


def _join_negative_numbers(argv: list[str]) -> list[str]:
  """["--flops", "-1e20"] → ["--flops=-1e20"], so a negative budget reaches our own check."""
  out, i = [], 0
  while i < len(argv):
    a = argv[i]
    if a in _NUMERIC_FLAGS and i + 1 < len(argv) and argv[i + 1].startswith("-"):
      try:
        float(argv[i + 1])
      except ValueError:
        pass
      else:
        out.append(f"{a}={argv[i + 1]}")
        i += 2
        continue
    out.append(a)
    i += 1
  return out


def _parser() -> argparse.ArgumentParser:
  p = helptext.parser("plan", __doc__)
  g = p.add_mutually_exclusive_group(required=True)
  g.add_argument("--flops", type=float, help="FLOP budget C, FLOPs (C = 6ND)")
  g.add_argument("--hours", type=float, help="wall-clock budget in hours (needs --hardware)")
  g.add_argument("--dollars", type=float, help="dollar budget, US$ (needs --hardware with a price)")
  p.add_argument("--hardware", help="devices, e.g. v5p-128, v5e-16, h100x8, 8xa100-80gb, cpu "
                                    "(default: none; --flops then plans without time or cost)")
  p.add_argument("--law", default=planner.DEFAULT_LAW,
                 help="published law (chinchilla-approach1, chinchilla-approach2, "
                      "chinchilla-approach3, chinchilla-approach3-unrounded, epoch) or a fit JSON "
                      "path; an IsoTime fit's JSON also gives the step-time model (its chosen "
                      "predictor) unless --step-time-model is given (default: "
                      f"{planner.DEFAULT_LAW})")
  p.add_argument("--unique-tokens", metavar="U",
                 help="--flops: only U unique tokens exist; plan the data-constrained optimum "
                      "(epochs D / U, a repetition law: the --law fit's, else Muennighoff et "
                      "al. 2023's published constants) and write data.unique_tokens=U with "
                      "data.allow_repeat=True (default: unlimited fresh data)")
  p.add_argument("--vocab-size", type=int, default=None,
                 help="vocabulary size, tokens (default: the --law fit's tokenizer; for an "
                      "accelerator --hardware 32,768, a BPE; else 257: chinchax's byte "
                      "tokenizer)")
  p.add_argument("--seq-len", type=int, default=None,
                 help=f"tokens per sequence (default: the --law fit's, else "
                      f"{planner.DEFAULT_SEQ_LEN_ACCELERATOR} on accelerators, "
                      f"{planner.DEFAULT_SEQ_LEN_CPU} on CPU)")
  p.add_argument("--set", action="append", default=[], metavar="SECTION.KNOB=VALUE",
                 help="override a knob of the written config, e.g. train.peak_lr=0.003 "
                      "(repeatable; one that leaves the --law fit's recipe is reported as a "
                      "departure) (default: none)")
  p.add_argument("--step-time-model", metavar="PATH",
                 help="measured step-time JSON (format: chinchax.cost.step_time module "
                      "docstring) (default: an IsoTime --law fit's predictor, else the analytic "
                      "roofline of --hardware)")
  p.add_argument("--mfu", type=float, default=step_time_lib.DEFAULT_MFU,
                 help="roofline compute efficiency, a fraction of peak FLOP/s in (0, 1] "
                      "(default %(default)s)")
  p.add_argument("--bandwidth-efficiency", type=float,
                 default=step_time_lib.DEFAULT_BANDWIDTH_EFFICIENCY,
                 help="roofline fraction of peak HBM bandwidth, in (0, 1] (default %(default)s)")
  p.add_argument("--hardware-table", metavar="PATH",
                 help="accelerator/price table JSON (default: chinchax/cost/hardware_prices.json)")
  p.add_argument("--candidates", type=int, default=5, help="candidate shapes to list")
  p.add_argument("--kv-heads-ratio", type=int, default=1, metavar="R",
                 help="grouped-query attention: query heads per key/value head of the planned "
                      "shapes (1 = multi-head; 4, 8 as in Llama 2 70B / Llama 3; >= n_heads = "
                      "multi-query); N counts the smaller k/v projections")
  p.add_argument("--calibrate", type=int, default=0, metavar="K",
                 help="--hours/--dollars: time the K best candidates and the FLOP-optimal shape "
                      "on this machine's devices and choose among them (default 0: trust the "
                      "step-time model)")
  p.add_argument("--aot", action="store_true",
                 help="compile the planned run for --hardware (TPU slice or GPU host, no "
                      "accelerator needed: chinchax compile) and, when it does not fit, move it "
                      "to the fastest layout (remat, mesh, scan_layers) that does (default: off)")
  p.add_argument("--write-config", metavar="PATH",
                 help="write the plan as an ml_collections config file (default: none written)")
  p.add_argument("--overwrite", action="store_true",
                 help="let --write-config replace an existing file (default: refuse)")
  p.add_argument("--workdir", help="workdir of the written config (default: runs/plan-N…-D…)")
  p.add_argument("--json", action="store_true", help="print JSON instead of the table")
  return p


def _fraction(value: float, flag: str) -> float:
  if not (math.isfinite(value) and 0 < value <= 1):
    raise PlanError(f"{flag} must lie in (0, 1], got {value!r}")
  return value


def run(args: argparse.Namespace) -> planner.Plan:
  """Plans from parsed CLI arguments (raises PlanError, HardwareError, StepTimeError)."""
  if args.vocab_size is not None and args.vocab_size < 2:
    raise PlanError(f"--vocab-size must be an integer >= 2, got {args.vocab_size!r}")
  overrides = [_override(text) for text in args.set]
  if args.seq_len is not None and args.seq_len < 2:
    raise PlanError(f"--seq-len must be an integer >= 2, got {args.seq_len!r}")
  if args.candidates < 1:
    raise PlanError(f"--candidates must be >= 1, got {args.candidates!r}")
  if args.kv_heads_ratio < 1:
    raise PlanError(f"--kv-heads-ratio must be an integer >= 1 (query heads per key/value "
                    f"head; 1 = multi-head), got {args.kv_heads_ratio!r}")
  if args.calibrate < 0:
    raise PlanError(f"--calibrate must be >= 0 (candidates to time), got {args.calibrate!r}")
  if args.calibrate and args.flops is not None:
    raise PlanError("--calibrate times candidates for --hours or --dollars; a --flops plan "
                    "does not depend on step time")
  mfu = _fraction(args.mfu, "--mfu")
  bw = _fraction(args.bandwidth_efficiency, "--bandwidth-efficiency")
  for flag in ("flops", "hours", "dollars"):
    value = getattr(args, flag)
    if value is not None:
      planner.check_budget(value, f"--{flag}")
  unique = None
  if args.unique_tokens is not None:
    unique = constrained.parse_unique_tokens(args.unique_tokens)
    if args.flops is None:
      raise PlanError("--unique-tokens plans a --flops budget (give --flops C)")
  if (args.hours is not None or args.dollars is not None) and not args.hardware:
    raise PlanError("--hours and --dollars need --hardware (e.g. --hardware v5p-128 or h100x8)")
  law = planner.load_law(args.law)
  data_limit = None
  if unique is not None:
    rlaw, note = constrained.repeat_law(args.law, law)
    data_limit = constrained.data_limited(
        args.flops, unique, rlaw, note, loose=constrained.unidentified(args.law),
        plain=law if isinstance(law, laws_parametric.ParametricLaw) else rlaw.base)
    law = laws_repeat.DataLimitedLaw(rlaw, unique)
  rec, rec_note = recipe_lib.law_recipe(args.law)
  hw = None
  if args.hardware:
    table = hardware_lib.load_accelerators(args.hardware_table)
    hw = hardware_lib.measured_cpu(hardware_lib.parse_hardware(args.hardware, table))
  # An accelerator trains a real vocabulary unless told: bytes are the CPU ladder's tokens.
  chosen_bpe = (args.vocab_size is None and recipe_lib.vocab_size(rec) is None
                and hw is not None and hw.is_accelerator)
  vocab = (args.vocab_size or recipe_lib.vocab_size(rec)
           or (ACCELERATOR_VOCAB_SIZE if chosen_bpe else law_units.BYTES_VOCAB_SIZE))
  seq_len = args.seq_len or recipe_lib.seq_len(rec)
  model = None
  if args.step_time_model:
    if hw is None:
      raise PlanError("--step-time-model needs --hardware (the devices it was measured on)")
    model = step_time_lib.load_step_time_model(args.step_time_model)
    if model.fallback.n_devices != hw.n_devices:
      raise PlanError(f"step-time model {args.step_time_model!r} was measured on "
                      f"{model.fallback.n_devices} devices but --hardware {args.hardware!r} has "
                      f"{hw.n_devices}")
  elif hw is not None and _fit_step_time(args.law) is not None:
    model = _fit_model(_fit_step_time(args.law), args.law, hw, args.hardware, table)
  elif hw is not None:
    model = step_time_lib.RooflineStepTime(hw, mfu=mfu, bandwidth_efficiency=bw)
  kw = dict(vocab_size=vocab, seq_len=seq_len, k=args.candidates, step_time_model=model,
            kv_heads_ratio=args.kv_heads_ratio)
  if args.flops is not None and rec is not None:  # the law's recipe (planning.recipe)
    plan = recipe_lib.plan_flops(args.flops, law, rec, seq_len=args.seq_len,
                                 vocab=args.vocab_size, hardware=hw, step_time_model=model,
                                 k=args.candidates, kv_heads_ratio=args.kv_heads_ratio)
  elif args.flops is not None:
    plan = planner.plan_flops(args.flops, law, hardware=hw, **kw)
  else:
    if args.calibrate:
      # Only --calibrate needs the train stack (JAX, Flax, orbax): a plan without it starts in
      # well under a second, so the module is imported here.
      from chinchax.planning import measure as measure_lib
      kw.update(calibrate=args.calibrate,
                measure=functools.partial(measure_lib.measure_step_time, hardware=hw),
                progress=lambda line: console.say(f"chinchax plan: {line}", stream=sys.stderr))
      if hw.accelerator.kind == "cpu":
        _expose_cpu_devices(hw.n_devices)
      measure_lib.local_devices_for(hw)  # the wrong machine is refused before any planning
    if args.hours is not None:
      plan = planner.plan_time(args.hours * 3600.0, hw, law, budget_dict={"hours": args.hours},
                               **kw)
    else:
      plan = planner.plan_dollars(args.dollars, hw, law, **kw)
    if rec is not None:
      recipe_lib.attach(plan, rec, seq_len=args.seq_len, vocab=args.vocab_size)
  plan.data_limit = data_limit
  if chosen_bpe:
    plan.tokenizer = {"tokenizer": "bpe", "bpe_vocab_size": ACCELERATOR_VOCAB_SIZE}
  return _finish(plan, rec, rec_note, vocab, overrides)


def _override(text: str) -> tuple[str, str, object]:
  """One --set SECTION.KNOB=VALUE, checked against the config's knobs (PlanError)."""
  section, knob, value = recipe_lib.parse_override(text)
  base = config_lib.base_config()
  if section not in base or not hasattr(base[section], "keys") or knob not in base[section]:
    raise PlanError(f"--set {text!r}: {section}.{knob} is not a knob of a training config "
                    f"(chinchax train --help lists them)")
  return section, knob, value


def _finish(plan: planner.Plan, rec: dict | None, rec_note: str | None, vocab: int,
            overrides: list) -> planner.Plan:
  """The plan's loss units judged, --set overrides and recipe departures recorded as warnings."""
  same_tokens = rec is not None and vocab == recipe_lib.vocab_size(rec)
  loss_units.judge(plan, law_units.plan_units(plan.law.units if same_tokens else None, vocab))
  if overrides:
    written = config_file.planned_config(plan, "unused")
    recipe_lib.apply_overrides(plan, overrides, {s: dict(written[s]) for s, _, _ in overrides})
  if rec_note:
    plan.warnings.append(rec_note)
  warn = recipe_lib.departure_warning(plan)
  if warn:
    plan.warnings.append(warn)
  return plan


def _fit_step_time(law: str) -> dict | None:
  """The ``step_time`` section of a fit file given as --law (an IsoTime fit), else None."""
  try:
    d = laws.read_law_file(law)  # local or gs://
  except (OSError, ValueError):
    return None
  if d is None:
    return None
  sec = d.get("step_time") if isinstance(d, dict) else None
  return sec if isinstance(sec, dict) else None


def _fit_model(section: dict, path: str, hw: hardware_lib.Hardware, spec: str, table: dict):
  """The fit's step-time predictor (``step_time.model_from_dict``), checked against --hardware:
  the same device count and accelerator as the steps it was fitted on (PlanError)."""
  model = step_time_lib.model_from_dict(section, source=path)
  n = model.hardware.n_devices if hasattr(model, "hardware") else model.n_devices
  where = f"the step-time predictor of --law {path!r}"
  if n != hw.n_devices:
    raise PlanError(f"{where} was fitted on {n} device(s) but --hardware {spec!r} has "
                    f"{hw.n_devices}; plan for the hardware it measured, or give "
                    f"--step-time-model")
  try:
    fitted_on = hardware_lib.parse_hardware(str(section.get("hardware")), table)
  except hardware_lib.HardwareError:
    return model
  if fitted_on.accelerator.name != hw.accelerator.name:
    raise PlanError(f"{where} was fitted on {fitted_on.accelerator.display_name} but --hardware "
                    f"{spec!r} is {hw.accelerator.display_name}; plan for the hardware it "
                    f"measured, or give --step-time-model")
  return model


def _expose_cpu_devices(n: int) -> None:
  """Makes ``n`` virtual CPU devices visible for --calibrate on ``cpuxN``, if JAX has not started.

  Once JAX's backend runs (e.g. in-process callers), its device count is kept
  and :func:`chinchax.planning.measure.measure_step_time` says what is missing.
  """
  import jax  # imported here: planning without --calibrate never starts JAX
  if n > 1:
    try:
      jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
      pass


def main(argv: list[str] | None = None) -> int:
  """``chinchax plan`` entry point; returns 0 (also for ``--help``).

  Raises:
    PlanError, HardwareError, StepTimeError: bad flags, law, hardware or
      step-time file; nothing is written.
  """
  parser = _parser()
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    args = parser.parse_args(_join_negative_numbers([str(a) for a in argv]))
  except SystemExit as e:  # --help
    return e.code if isinstance(e.code, int) else 0
  if args.write_config:  # a file the user has is never replaced unasked; said before planning
    config_file.check_config_path(args.write_config, overwrite=args.overwrite)
  plan = run(args)
  if args.aot:
    if args.write_config:  # a path that cannot be written is said before minutes of compiling
      config_file.check_config_path(args.write_config, overwrite=args.overwrite)
    # Only --aot compiles (JAX, libtpu): a plan without it starts in well under a second.
    from chinchax.aot import plancheck
    plancheck.check_plan(plan, workdir=args.workdir, progress=lambda i, n, row: console.say(
        f"chinchax plan --aot: [{i}/{n}] remat={row['remat']} mesh={row['mesh']['data']}×"
        f"{row['mesh']['fsdp']}×{row['mesh']['tensor']} scan_layers={row['scan_layers']} "
        f"M={row['microbatches']}: "
        f"{'fits' if row['fits'] else 'does not fit'}", stream=sys.stderr))
  if args.write_config:
    config_file.write_config(plan, args.write_config, args.workdir, overwrite=args.overwrite,
                             n_devices=plan.hardware.n_devices if plan.hardware else 1)
  if args.json:
    for w in plan.warnings:
      console.warn(w)
    print(json.dumps(render.finite(plan.to_dict()), indent=2, allow_nan=False))
  else:
    print(render.format_plan(plan))
    if plan.aot is not None:
      print(plancheck.render_check(plan.aot))
    if args.write_config:
      print(f"  config         wrote {args.write_config}")
  return 0
