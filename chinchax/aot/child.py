"""One compile in its own process: ``python -m chinchax.aot.child`` (used by ``chinchax.aot.search``).

A compiler can crash outright: libtpu 0.0.42 ends the process with SIGSEGV on
some layouts (seen: a 78M-parameter, vocab-257 model with remat=full over
fsdp=4 on v5e-4). Each compile of ``chinchax compile`` and ``plan --aot`` runs
here, so a crash becomes a report of its own and the search goes on; and the
parent never loads libtpu, which one process at a time may hold.

Reads one JSON object on stdin — {"config": the run config as JSON, "target":
spec, "num_slices": K, "eval_step": bool} — and writes the report of
``chinchax.aot.report.summarize`` as JSON on stdout. A UserError is written as
{"user_error": message} (exit status 2); libtpu taken by another process as this
one started it, as {"libtpu_busy": message} (the parent runs the compile again).
"""

from __future__ import annotations

import json
import sys

import ml_collections

from chinchax import errors
from chinchax.aot import program as program_lib
from chinchax.aot import report as report_lib
from chinchax.aot import topology as topology_lib


def config_from_json(text: str) -> ml_collections.ConfigDict:
  """The run config a parent sent (``ConfigDict.to_json_best_effort``), as a ConfigDict."""
  return ml_collections.ConfigDict(json.loads(text))


def main() -> int:
  request = json.loads(sys.stdin.read())
  try:
    target = topology_lib.parse_target(request["target"], num_slices=request["num_slices"])
    config = config_from_json(request["config"])
    run = program_lib.compile_run(config, target, eval_step=request["eval_step"])
    rep = report_lib.summarize(run)
  except topology_lib.LibtpuBusy as e:
    print(json.dumps({"libtpu_busy": str(e)}))
    return errors.USER_ERROR_EXIT_CODE
  except errors.UserError as e:
    print(json.dumps({"user_error": str(e)}))
    return errors.USER_ERROR_EXIT_CODE
  print(json.dumps(rep, sort_keys=True, default=float))  # one line: the parent reads the last
  return 0


if __name__ == "__main__":
  sys.exit(main())
