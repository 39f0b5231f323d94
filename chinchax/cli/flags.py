"""``--config FILE[:VARIANT]`` plus dotted overrides: the config front end of train, ladder,
prepare and bench (absl flags with ml_collections ``config_flags``).

The default config files are installed with the package (``chinchax.configs``,
the repository's top-level ``configs/``), so the defaults work from any
directory and under a non-editable install.
"""

from __future__ import annotations

import ast
import importlib.resources
import os
import pathlib
import re

from absl import flags
from ml_collections import config_flags

from chinchax import errors

HELP_FLAGS = ("-h", "--help", "-help", "--helpfull")


class UsageError(errors.UserError):
  """A command line that cannot be parsed: unknown key, wrong type, missing file, stray argument."""


def config_file(name: str) -> pathlib.Path:
  """The installed config file ``name`` (e.g. ``"train.py"``) of the ``chinchax.configs`` package."""
  return pathlib.Path(str(importlib.resources.files("chinchax.configs").joinpath(name)))


def _help_text(verb: str, default: pathlib.Path) -> str:
  doc = (ast.get_docstring(ast.parse(default.read_text())) or "") if default.exists() else ""
  return (f"usage: chinchax {verb} [--config {default.parent.name}/{default.name}:VARIANT] "
          f"[--config.SECTION.KNOB=VALUE ...]\n\n{doc}\n\nEvery knob, its default and "
          f"a one-line comment: chinchax/config.py. Default config file: {default}")


def _check_config_file_exists(argv: list[str], default: pathlib.Path) -> None:
  """A missing ``--config`` file is reported before absl's lazy loader sees it."""
  for i, a in enumerate(argv):
    value = a.split("=", 1)[1] if a.startswith("--config=") else (
        argv[i + 1] if a == "--config" and i + 1 < len(argv) else None)
    if value is not None and not os.path.isfile(value.split(":", 1)[0]):
      raise UsageError(f"config file {value.split(':', 1)[0]!r} does not exist (from "
                       f"{os.getcwd()}); e.g. --config {default}:VARIANT")


def _unquote(line: str) -> str:
  """A line of a wrapped message without the quotes its wrapping left: enclosing ones, and a
  lone quote at either end (a message quoted across several lines); a quote that closes a
  value inside the line, as in ``float: 'True'``, stays."""
  line = line.strip()
  while len(line) >= 2 and line[0] == line[-1] and line[0] in "'\"":
    line = line[1:-1].strip()
  for q in "'\"":
    if line.count(q) % 2:
      line = line[1:] if line.startswith(q) else line[:-1] if line.endswith(q) else line
  return line.strip()


def _one_line(e: Exception) -> str:
  """absl / ml_collections wrap the real cause of a parse error; its last line, in words."""
  text = str(e).replace("\\n", "\n").replace("\\'", "'")
  lines = [l for l in (_unquote(l) for l in text.strip().splitlines()) if l]
  if len(lines) >= 2 and lines[-1].startswith("Did you mean"):
    lines = [f"unknown config key {lines[-2]!r}; {lines[-1][0].lower() + lines[-1][1:]}"]
  line = lines[-1] if lines else type(e).__name__
  return re.sub(r"\('Non-boolean argument to boolean flag', '(.*)'\)",
                r"'\1' is not a boolean; use True or False", line)


def _unknown_key(argv: list[str], default: pathlib.Path, verb: str, key: str) -> str | None:
  """For a bare ``key`` message (an unknown key without a close match): which override named it,
  where it is missing, and the keys that are there."""
  if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
    return None
  overrides = [a[len("--config."):].split("=", 1)[0] for a in argv if a.startswith("--config.")]
  paths = [p for p in overrides if key in p.split(".")]
  if not paths:
    return None
  try:
    base = parse_config([a for a in argv if not a.startswith("--config.")], default, verb)
  except UsageError:
    return None
  node, parts = base, paths[0].split(".")
  for i, part in enumerate(parts):
    if not hasattr(node, "keys") or part not in node:
      where = f"section {'.'.join(parts[:i])!r}" if i else "the config"
      known = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "none: it is a value"
      return (f"unknown config key {paths[0]!r}: {where} has no key {part!r}; its keys: {known} "
              f"(every knob with its comment: chinchax/config.py)")
    node = node[part]
  return None


def parse_config(argv: list[str], default: pathlib.Path, verb: str):
  """Parses ``--config FILE[:VARIANT]`` plus dotted overrides.

  Args:
    argv: the verb's arguments.
    default: the config file used when ``--config`` is absent.
    verb: the verb's name, for the usage line.
  Returns:
    the locked ConfigDict, or None when ``-h``/``--help`` printed the usage and
    the file's variants.
  Raises:
    UsageError: unknown key, wrong type, missing file, unknown variant, stray argument.
  """
  if any(a in HELP_FLAGS for a in argv):
    print(_help_text(verb, default))
    return None
  _check_config_file_exists(argv, default)
  fv = flags.FlagValues()
  full_argv = [f"chinchax-{verb}"] + argv
  try:
    config_flags.DEFINE_config_file("config", default=str(default) if default.exists() else None,
                                    flag_values=fv, lock_config=True, sys_argv=full_argv,
                                    help_string=f"config file, e.g. {default.name}:VARIANT")
    rest = fv(full_argv)
    config = fv.config
  except Exception as e:  # noqa: BLE001 — any parse failure is the user's input
    line = _one_line(e)
    raise UsageError(_unknown_key(argv, default, verb, line) or line) from None
  if len(rest) > 1:
    raise UsageError(f"unexpected argument(s) {' '.join(rest[1:])!r}; options look like "
                     f"--config.SECTION.KNOB=VALUE")
  if config is None:
    raise UsageError(f"no config given; use --config configs/{default.name}:VARIANT")
  return config
