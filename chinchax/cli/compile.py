"""chinchax compile: compile a run for a TPU slice or GPU host before renting it.

usage: chinchax compile --topology NAME [--slices K] [--search] [--json] [--no-eval]
                        [--no-cache] [--out FILE] [--require-fit] [--ladder]
                        [--config FILE:VARIANT] [--config.SECTION.KNOB=V ...]

Builds the run's mesh from the config's mesh axes over the target's devices,
lowers and compiles the train step and the eval step that chinchax train would
run (train.build_program), with no accelerator present and nothing allocated,
and reports per device: arguments, outputs, temporaries and code against the
chip's HBM (headroom in GB and %), XLA's FLOPs and bytes beside the analytic
counts, the collectives of the optimized HLO by kind with their bytes per step,
a roofline step time (compute, HBM, interconnect) and the compile time. A
program that does not fit is reported with by how much and which knobs would
help; the exit status is 0 either way, 3 with --require-fit when it does not fit.

Options:
  --topology NAME   v5e-4 ... v5e-256, v6e-4 ... v6e-256, v4-8 ... (TensorCores),
                    v5p-8 ... v5p-128 ... (TensorCores), h100x8, h200x8, a100-80gbx8
  --slices K        K TPU slices of that topology (multi-slice; default 1)
  --search          compile variants (remat none/dots/full x mesh split x scan_layers, each
                    at the smallest train.microbatches M the analytic memory model fits, and
                    at the next M when XLA finds it too large), list those that fit, ranked
                    by roofline step time, and print the best one's flags
  --json            print the report (or the search's rows) as JSON
  --no-eval         compile the train step only
  --no-cache        compile again even if ~/.cache/chinchax/aot holds this program
  --out FILE        also write the JSON report to FILE
  --require-fit     exit with status 3 when the train step does not fit
  --ladder          the config is a ladder (default configs/ladder.py): compile every distinct
                    program of it (shape × batch layout, the validation run's included), each in
                    its own process, with the planner's microbatches and remat per run when
                    ladder.hardware is set (else the --topology as the hardware); list XLA's
                    memory beside the planner's and every run that does not fit with its
                    remedy (with --search: the layouts of its largest program)

TPU targets need libtpu (pip install -e ".[tpu]"), GPU targets JAX's CUDA plugin
(pip install -e ".[gpu-aot]"). The config defaults to configs/train.py.

Example:
  chinchax compile --config configs/train.py:125m --topology v5e-16 --search
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from chinchax import console
from chinchax.storage import paths as paths_lib
from chinchax.cli import flags as flags_lib
from chinchax.cli import helptext

REQUIRE_FIT_EXIT_CODE = 3


def _parser() -> argparse.ArgumentParser:
  p = helptext.parser("compile", __doc__, add_help=False)
  p.add_argument("--topology", required=True)
  p.add_argument("--slices", type=int, default=1)
  p.add_argument("--search", action="store_true")
  p.add_argument("--json", action="store_true")
  p.add_argument("--no-eval", action="store_true")
  p.add_argument("--no-cache", action="store_true")
  p.add_argument("--require-fit", action="store_true")
  p.add_argument("--out")
  p.add_argument("--ladder", action="store_true")
  return p


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
  """(config arguments: --config and --config.*, with a separate value; the others)."""
  config, rest, i = [], [], 0
  while i < len(argv):
    a = argv[i]
    if a == "--config" and i + 1 < len(argv):
      config += argv[i:i + 2]
      i += 2
      continue
    (config if a.startswith("--config") else rest).append(a)
    i += 1
  return config, rest


def main(argv: list[str]) -> int:
  """Compiles (or searches) and prints the report; see the module doc for the exit statuses.

  Raises:
    UserError: an unknown topology, a mesh or batch the target cannot take, a
      missing libtpu / CUDA plugin, bad flags — each before any compilation.
  """
  if any(a in flags_lib.HELP_FLAGS for a in argv):
    print(__doc__.strip())
    return 0
  config_argv, rest = _split(argv)
  global ladder_run, report_lib, search_lib, topology_lib
  # here: --help imports no JAX (tests/test_imports.py)
  from chinchax.aot import topology as topology_lib
  with topology_lib.quiet_stderr():  # the CUDA plugin's "no cuda drivers" lines as JAX loads
    from chinchax.aot import ladder_run
    from chinchax.aot import report as report_lib
    from chinchax.aot import search as search_lib
  args = _parser().parse_args(rest)
  if args.out is not None and paths_lib.is_url(args.out):  # gs://bucket/report.json
    paths_lib.check_writable_dir(args.out.rsplit("/", 1)[0], "--out's directory")
  elif args.out is not None:
    out = pathlib.Path(args.out)
    if not args.out or out.is_dir():
      raise topology_lib.AotError(f"--out {args.out!r} must name a file to write (e.g. "
                                  f"--out report.json)")
    if not out.parent.is_dir():
      raise topology_lib.AotError(f"--out {args.out!r}: directory {str(out.parent)!r} does not "
                                  f"exist")
  target = topology_lib.parse_target(args.topology, num_slices=args.slices)
  topology_lib.check_available(target)
  default = flags_lib.config_file("ladder.py" if args.ladder else "train.py")
  config = flags_lib.parse_config(config_argv, default, "ladder" if args.ladder else "compile")
  if config is None:
    return 0
  cache = None if args.no_cache else search_lib.CACHE_DIR
  if ladder_run.is_ladder_config(config) and not args.search:
    return _compile_ladder(config, target, args, cache)
  if ladder_run.is_ladder_config(config):
    config, run_id = ladder_run.largest_run_config(config, target)
    console.say(f"ladder: searching the layouts of its largest program, {run_id}",
                stream=sys.stderr, enabled=not args.json)
  console.say(target.describe(), stream=sys.stderr, enabled=not args.json)
  if args.search:
    def progress(i, n, row):
      m = row["mesh"]
      console.say(f"  [{i}/{n}] remat={row['remat']} mesh={m['data']}×{m['fsdp']}×{m['tensor']} "
                  f"scan_layers={row['scan_layers']} M={row['microbatches']}: "
                  f"{'fits' if row['fits'] else 'does not fit'}"
                  f"{' (cached)' if row['cached'] else ''}", stream=sys.stderr)
    rows = search_lib.search(config, target, cache_dir=cache, progress=progress)
    payload = [{k: v for k, v in r.items() if k != "report"} for r in rows]
    print(json.dumps(payload, indent=2, default=float) if args.json
          else search_lib.render(rows, target))
    fits = any(r["fits"] for r in rows)
  else:
    rep, cached = search_lib.compile_cached(config, target, eval_step=not args.no_eval,
                                            cache_dir=cache)
    rep["cached"] = cached
    payload = rep
    print(report_lib.dumps(rep) if args.json else report_lib.render(rep)
          + ("\n(from the compile cache; --no-cache compiles again)" if cached else ""))
    fits = rep["fits"]
  if args.out is not None:
    paths_lib.write_text_atomic(args.out, json.dumps(payload, indent=2, sort_keys=True,
                                                     default=float) + "\n")
  if args.require_fit and not fits:
    return REQUIRE_FIT_EXIT_CODE
  return 0


def _compile_ladder(config, target, args, cache) -> int:
  """Every distinct program of the ladder (``chinchax.aot.ladder_run``), each in its own
  process and through the compile cache; the table, or the reports as JSON."""
  # the largest planned memory first: a stopped or failing check has answered the riskiest runs
  programs = sorted(ladder_run.ladder_programs(config, target),
                    key=lambda p: -(p.analytic_bytes or 0.0))
  console.say(target.describe(), stream=sys.stderr, enabled=not args.json)
  reports = []
  for i, p in enumerate(programs, 1):
    rep, cached = search_lib.compile_cached(p.config, target, eval_step=not args.no_eval,
                                            cache_dir=cache)
    rep = dict(rep, cached=cached, run_ids=p.run_ids, analytic_planner_bytes=p.analytic_bytes)
    reports.append(rep)
    console.say(ladder_run.row(i, p, rep), stream=sys.stderr, enabled=not args.json)
  print(json.dumps(reports, indent=2, default=float) if args.json
        else ladder_run.render(programs, reports, target))
  if args.out is not None:
    paths_lib.write_text_atomic(args.out, json.dumps(reports, indent=2, sort_keys=True,
                                                     default=float) + "\n")
  if args.require_fit and not all(r["fits"] for r in reports):
    return REQUIRE_FIT_EXIT_CODE
  return 0


__all__ = ["main", "REQUIRE_FIT_EXIT_CODE"]
