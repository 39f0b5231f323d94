"""``chinchax <verb>``: train, ladder, plan, fit, prepare, export, sample, bench, compile.

  chinchax train  [--config configs/train.py:VARIANT] [--config.model.d_model=128 ...]
  chinchax ladder [--config configs/ladder.py:VARIANT] [--config.ladder.c_max=3e12 ...]
  chinchax plan  --flops 1e21 | --hours 48 --hardware v5p-128 | --dollars 5000 --hardware h100x8
  chinchax fit   RESULTS [--approach 1|2|3|all] [--out DIR]
  chinchax prepare [--config configs/train.py:VARIANT] [--config.data.tokenizer=bpe ...]
  chinchax export WORKDIR --format safetensors [--out DIR] [--step N]
  chinchax sample WORKDIR [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-p P]
  chinchax bench [--config configs/bench.py:VARIANT] [--config.bench.timed_steps=10 ...]
  chinchax compile --topology v5e-16 | v5p-128 | h100x8 [--search] [--config configs/train.py:VARIANT]

Errors in the user's input (config, data, checkpoint mismatch, multi-process
start-up, plan and fit flags) end with one line ``error: ...`` and exit
status 2, before any expensive work. A run stopped by SIGTERM saves a checkpoint at the next step boundary and
exits with status 75 (relaunch to resume; ``chinchax.runtime.distributed``); Ctrl-C
exits with status 130.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import signal
import sys

from chinchax import console
from chinchax.storage import diskfull
from chinchax.storage import gcs
from chinchax import errors
from chinchax.runtime import interrupts
from chinchax.runtime import watchdog
from chinchax.cli.helptext import HELP_FLAGS, example, fit_width, plain

# Each verb's front end is the module chinchax.cli.<verb> with main(argv) -> exit status. Only the
# chosen one is imported: `chinchax plan` and `chinchax fit` start without JAX, Flax or orbax.
VERBS = ("train", "ladder", "plan", "fit", "prepare", "export", "sample", "bench", "compile")
# The config verbs' default config files (as in each one's main): their --help comes from the
# config alone, without importing the verb and JAX (tests/test_cli_help.py keeps the two equal).
CONFIG_VERBS = {"train": "train.py", "ladder": "ladder.py", "prepare": "train.py",
                "bench": "bench.py"}


def _usage() -> str:
  return (plain(__doc__.strip()) + "\n\nEach verb's flags: chinchax VERB --help; "
          "the version: chinchax --version")


def version() -> str:
  """The installed distribution's version (``pyproject.toml``), or "unknown" outside an install."""
  try:
    return importlib.metadata.version("chinchax")
  except importlib.metadata.PackageNotFoundError:
    return "unknown"


def _module_doc(verb: str) -> str | None:
  """The docstring of ``chinchax.cli.<verb>``, read from its source without importing it."""
  spec = importlib.util.find_spec(f"chinchax.cli.{verb}")
  with open(spec.origin, encoding="utf-8") as f:
    return ast.get_docstring(ast.parse(f.read()))


def _verb_help(verb: str, rest: list[str]) -> int:
  """Prints ``chinchax VERB --help`` (a help flag among ``rest``) as plain text, with the verb
  module's ``Example:`` block when that help has none. A config verb's help comes from its
  config (no JAX imported); the others' from their ``main(rest)``."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    if verb in CONFIG_VERBS:
      flags = importlib.import_module("chinchax.cli.flags")  # loaded like a verb's module
      flags.parse_config(rest, flags.config_file(CONFIG_VERBS[verb]), verb)
      status, doc = 0, _module_doc(verb)
    else:
      module = importlib.import_module(f"chinchax.cli.{verb}")
      status, doc = module.main(rest), module.__doc__
  text = plain(out.getvalue().rstrip())
  if "example" not in text.lower():
    text += "\n\n" + example(doc)
  print(fit_width(text.rstrip()))
  return status


CHECKPOINTING_VERBS = ("train", "ladder")  # resume from their checkpoints when rerun


def main(argv: list[str] | None = None) -> int:
  """Entry point of the ``chinchax`` command; returns its exit status.

  0 done (or ``--help``), 2 a user error (one ``error:`` line on stderr), 69 the storage
  stopped answering or a step stalled (one line, :mod:`chinchax.runtime.watchdog`),
  75 preempted (SIGTERM), 130 interrupted by Ctrl-C.
  """
  command = argv is None  # the `chinchax` command itself, not a call from Python
  argv = list(sys.argv[1:] if argv is None else argv)
  finished = False
  try:
    if not argv or argv[0] in ("-h", "--help", "help", "--version", "-V"):
      finished = True  # printing is the whole job: a reader that leaves early is no failure
      print(f"chinchax {version()}" if argv and argv[0] in ("--version", "-V") else _usage())
      sys.stdout.flush()
      return 0 if argv else errors.USER_ERROR_EXIT_CODE
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
      print(f"error: unknown verb {verb!r}; known: {', '.join(VERBS)}\n\n{_usage()}",
            file=sys.stderr)
      return errors.USER_ERROR_EXIT_CODE
    if any(a in HELP_FLAGS for a in rest):
      status = _verb_help(verb, rest)
    else:  # importing chinchax chose JAX's platforms: no libtpu on a host without TPUs
      interrupts.install()  # Ctrl-C in a run: stop at the next step boundary (chinchax.runtime.interrupts)
      interrupts.quiet_closed_loop_callbacks()  # a failed async save's late callbacks
      status = importlib.import_module(f"chinchax.cli.{verb}").main(rest)
      if status == interrupts.INTERRUPTED_EXIT_CODE and command:
        interrupts.exit_now(status)  # no teardown under XLA's or orbax's threads
    finished = True
    sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
    return status
  except errors.UserError as e:
    print(f"error: {e}", file=sys.stderr)
    if command and isinstance(e, diskfull.DiskFull):
      interrupts.exit_now(errors.USER_ERROR_EXIT_CODE)  # orbax's threads may still be failing
    return errors.USER_ERROR_EXIT_CODE
  except KeyboardInterrupt as e:  # one line: a stage's own (what it kept), else the general one
    line = str(e) if isinstance(e, errors.InterruptedWith) else interrupts.message()
    status = interrupts.INTERRUPTED_EXIT_CODE
    if watchdog.last_signal() == signal.SIGTERM:  # a store build stopped by SIGTERM: requeue
      status, line = watchdog.PREEMPTED_EXIT_CODE, line.replace("interrupted", "preempted", 1)
    print(f"\n{line}", file=sys.stderr)
    if command:
      interrupts.exit_now(status)  # see chinchax.runtime.interrupts
    return status
  except BrokenPipeError:  # the reader left, e.g. `chinchax plan ... | head`
    console.discard(sys.stdout)
    # Done, only the output was cut: 0. Stopped part-way: 141 (128 + SIGPIPE), as a shell says.
    return 0 if finished else 141
  except Exception as e:  # noqa: BLE001 — the storage stopped answering: one line, else raised
    why = gcs.unreachable(e)
    if why is None:
      if isinstance(e, OSError) and diskfull.is_disk_full(e):
        return _disk_full(e)
      raise
    doing = f" while {watchdog.doing()}" if watchdog.doing() else ""
    if argv and argv[0] in CHECKPOINTING_VERBS:
      kept = watchdog.last_saved() or "no checkpoint of this run was saved"
      then = f"{kept}; rerun the same command once it answers again to resume from there"
    else:  # fit, export, prepare...: each writes its files whole or not at all
      then = "rerun the same command once it answers again"
    print(f"error: the storage at {gcs.endpoint()} stopped answering{doing} ({why}); {then}",
          file=sys.stderr)
    if command:  # no teardown: the clients' exit hooks would retry each upload for minutes
      interrupts.exit_now(watchdog.UNAVAILABLE_EXIT_CODE)
    return watchdog.UNAVAILABLE_EXIT_CODE


def _disk_full(e: OSError) -> int:
  """A full disk where no step names it (a ladder lease, the fit's files): one line, exit 2."""
  print(f"error: the disk is full: writing {e.filename or 'a file'} failed ({e.strerror}); "
        f"{diskfull.size(diskfull.free_bytes(e.filename or '.') or 0)} are free; free some "
        f"space and rerun the same command (what was written before is kept)", file=sys.stderr)
  return errors.USER_ERROR_EXIT_CODE
