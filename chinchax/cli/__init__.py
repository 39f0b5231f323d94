"""``chinchax <verb>``: train, ladder, plan, fit, prepare, export, bench, compile.

  chinchax train  [--config configs/train.py:VARIANT] [--config.model.d_model=128 ...]
  chinchax ladder [--config configs/ladder.py:VARIANT] [--config.ladder.c_max=3e12 ...]
  chinchax plan  --flops 1e21 | --hours 48 --hardware v5p-128 | --dollars 5000 --hardware h100x8
  chinchax fit   RESULTS [--approach 1|2|3|all] [--out DIR]
  chinchax prepare [--config configs/train.py:VARIANT] [--config.data.tokenizer=bpe ...]
  chinchax export WORKDIR --format safetensors [--out DIR] [--step N]
  chinchax bench [--config configs/bench.py:VARIANT] [--config.bench.timed_steps=10 ...]
  chinchax compile --topology v5e-16 | v5p-128 | h100x8 [--search] [--config configs/train.py:VARIANT]

Errors in the user's input (config, data, checkpoint mismatch, multi-process
start-up, plan and fit flags) are ``chinchax.errors.UserError``s: :func:`main`
prints one line ``error: ...`` and exits with status 2, before any expensive
work. A run stopped by SIGTERM saves a checkpoint at the next step boundary and
exits with status 75 (relaunch to resume; ``chinchax.distributed``); Ctrl-C
exits with status 130.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys

from chinchax import console
from chinchax import errors
from chinchax.cli import helptext

# Each verb's front end is the module chinchax.cli.<verb> with main(argv) -> exit status. Only the
# chosen one is imported: `chinchax plan` and `chinchax fit` start without JAX, Flax or orbax.
VERBS = ("train", "ladder", "plan", "fit", "prepare", "export", "bench", "compile")


def _usage() -> str:
  return helptext.plain(__doc__.strip()) + "\n\nEach verb's flags: chinchax VERB --help"


def _verb_help(module, rest: list[str]) -> int:
  """Runs ``module.main(rest)`` (a help flag among ``rest``) and prints what it printed as
  plain text, with the module docstring's ``Example:`` block when that help has none."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    status = module.main(rest)
  text = helptext.plain(out.getvalue().rstrip())
  if "example" not in text.lower():
    text += "\n\n" + helptext.example(module.__doc__)
  print(text.rstrip())
  return status


def main(argv: list[str] | None = None) -> int:
  """Entry point of the ``chinchax`` command; returns its exit status.

  0 done (or ``--help``), 2 a user error (one ``error:`` line on stderr),
  75 preempted after a checkpoint, 130 interrupted by Ctrl-C.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(_usage())
    return 0 if argv else errors.USER_ERROR_EXIT_CODE
  verb, rest = argv[0], argv[1:]
  if verb not in VERBS:
    print(f"error: unknown verb {verb!r}; known: {', '.join(VERBS)}\n\n{_usage()}",
          file=sys.stderr)
    return errors.USER_ERROR_EXIT_CODE
  finished = False
  try:
    module = importlib.import_module(f"chinchax.cli.{verb}")
    status = (_verb_help(module, rest) if any(a in helptext.HELP_FLAGS for a in rest)
              else module.main(rest))
    finished = True
    sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
    return status
  except errors.UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return errors.USER_ERROR_EXIT_CODE
  except KeyboardInterrupt:
    print("\ninterrupted; rerun the same command to resume from the last checkpoint",
          file=sys.stderr)
    return 130
  except BrokenPipeError:  # the reader left, e.g. `chinchax plan ... | head`
    console.discard(sys.stdout)
    # Done, only the output was cut: 0. Stopped part-way: 141 (128 + SIGPIPE), as a shell says.
    return 0 if finished else 141
