"""``--config FILE[:VARIANT]`` plus dotted overrides: the config front end of train, ladder,
prepare and bench (absl flags with ml_collections ``config_flags``).

The default config files are installed with the package (``chinchax.configs``,
the repository's top-level ``configs/``), so the defaults work from any
directory and under a non-editable install.
"""

from __future__ import annotations

import ast
import importlib.resources
import importlib.util
import os
import pathlib
import textwrap
import re
import shlex
import traceback

from absl import flags
from ml_collections import config_flags

from chinchax import config as config_lib
from chinchax import errors
from chinchax.cli import helptext
from chinchax.cli.helptext import UsageError

HELP_FLAGS = helptext.HELP_FLAGS


def config_file(name: str) -> pathlib.Path:
  """The installed config file ``name`` (e.g. ``"train.py"``) of the ``chinchax.configs`` package."""
  return pathlib.Path(str(importlib.resources.files("chinchax.configs").joinpath(name)))


def _config_arg(argv: list[str]) -> str | None:
  """The value of ``--config`` / ``--config=`` in ``argv``, or None."""
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def planned_of(argv: list[str]) -> dict | None:
  """The ``PLANNED`` dict of the ``--config`` file in ``argv`` (a config written by ``chinchax
  plan --write-config``: law, N, D, C, predicted_loss), read without running the file; None for
  any other config."""
  given = _config_arg(argv)
  path = pathlib.Path((given or "").partition(":")[0])
  if not given or not path.is_file():
    return None
  try:
    for node in ast.parse(path.read_text()).body:
      if (isinstance(node, ast.Assign) and len(node.targets) == 1
              and getattr(node.targets[0], "id", None) == "PLANNED"):
        value = ast.literal_eval(node.value)
        return value if isinstance(value, dict) else None
  except (OSError, SyntaxError, ValueError):
    return None
  return None


def _load_variant(path: pathlib.Path, variant: str):
  """``get_config(variant)`` of the config file at ``path`` (a fresh module each call)."""
  spec = importlib.util.spec_from_file_location(f"_chinchax_help_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def _flat(node, prefix: str = ""):
  """(dotted key, value) of every leaf of a ConfigDict, in its key order."""
  for key, value in node.items():
    if hasattr(value, "items"):
      yield from _flat(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


HELP_WIDTH = 100  # no line of a verb's help is wider
# The knobs a verb reads, by prefix (a verb not named here reads all of its config).
VERB_KNOBS = {"prepare": ("data.",)}
# A working override for each config verb's help.
OVERRIDE_EXAMPLE = {"ladder": "--config.train_config.train.seq_len=256",
                    "bench": "--config.bench.timed_steps=10",
                    "prepare": "--config.data.tokenizer=bpe"}


def _wrapped(head: str, note: str, width: int) -> list[str]:
  """``head`` and its comment ``note`` in lines of at most HELP_WIDTH columns: the comment beside
  a head of ``width`` columns, continued below it, indented."""
  if not note:
    return [head[:HELP_WIDTH]] if len(head) <= HELP_WIDTH else textwrap.wrap(
        head, HELP_WIDTH, subsequent_indent=" " * 6, break_long_words=True)
  if len(head) > width:  # a long default: the comment on the lines below
    return (textwrap.wrap(head, HELP_WIDTH, subsequent_indent=" " * 6, break_long_words=True)
            + textwrap.wrap(note, HELP_WIDTH, initial_indent=" " * 8, subsequent_indent=" " * 8))
  return textwrap.wrap(note, HELP_WIDTH, initial_indent=f"{head:<{width}} ",
                       subsequent_indent=" " * (width + 1))


def knob_lines(config, kind: str = "train", prefixes: tuple[str, ...] = ()) -> list[str]:
  """The knobs of ``config`` (a ``kind`` config: train, ladder or bench), ``key = default`` and
  the knob's comment from ``chinchax/config/defaults.py`` (a ladder or bench ``train_config.*``
  knob not set anew there: its training knob's comment), wrapped to :data:`HELP_WIDTH` columns;
  only the keys starting with one of ``prefixes`` when given."""
  comments = config_lib.knob_comments(kind)
  train = config_lib.knob_comments("train")
  rows = []
  for key, value in _flat(config):
    if prefixes and not key.startswith(prefixes):
      continue
    note = comments.get(key) or train.get(key.removeprefix("train_config."))
    parts = key.split(".")
    if note is None and len(parts) == 3:  # bench models.NAME.d_model, sweeps.NAME.mesh
      note = comments.get(f"{parts[0]}.{parts[2]}")
    rows.append((f"{key} = {value!r}", note or ""))
  width = min(44, max(len(k) for k, _ in rows) + 2)
  out = []
  for k, note in rows:
    out += _wrapped(f"    {k}", note, width + 4)
  return out


def _help_text(verb: str, default: pathlib.Path, argv: list[str]) -> str:
  """``chinchax VERB --help`` of a config verb: usage, the config file's docstring, the flags,
  and every knob of the chosen (or default) variant with its default and comment."""
  given = _config_arg(argv)
  path, _, variant = (given or f"{default}:default").partition(":")
  path = pathlib.Path(path)
  variant = variant or "default"
  doc = (ast.get_docstring(ast.parse(path.read_text())) or "") if path.is_file() else ""
  lines = [f"usage: chinchax {verb} [--config FILE[:VARIANT]] [--config.SECTION.KNOB=VALUE ...]",
           "", helptext.plain(doc), "", "flags:",
           f"  --config FILE[:VARIANT]    config file and named variant (default: "
           f"{default}:default)",
           "  --config.KEY=VALUE         set one knob (a ConfigDict key path), e.g. "
           f"{OVERRIDE_EXAMPLE.get(verb, '--config.train.seq_len=256')}",
           "  -h, --help                 this help", ""]
  try:
    config = _load_variant(path, variant)
  except Exception as e:  # noqa: BLE001 — help still prints; the run itself reports the error
    lines.append(f"(the knobs of {path}:{variant} could not be listed: {type(e).__name__}: {e})")
    return "\n".join(lines)
  prefixes = VERB_KNOBS.get(verb, ())
  lines.append(f"knobs of {path.name}:{variant}"
               + (f" that {verb} reads ({', '.join(p + '*' for p in prefixes)})" if prefixes
                  else "") + ", each with its default (comments: chinchax/config/defaults.py):")
  kind = {"ladder": "ladder", "bench": "bench"}.get(verb, "train")
  return helptext.fit_width("\n".join(lines + knob_lines(config, kind, prefixes)))


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
  return lines[-1] if lines else type(e).__name__


def _chain(e: BaseException) -> list[BaseException]:
  """``e`` and the exceptions it was raised from or during, outermost first."""
  out = []
  while e is not None and e not in out:
    out.append(e)
    e = e.__cause__ or e.__context__
  return out


def _load_failure(e: Exception, path: pathlib.Path) -> str | None:
  """A config file that failed to load, in one line naming the file and the line; or the
  message of a chinchax error its ``get_config`` raised (an unknown variant); else None."""
  chain = _chain(e)
  ours = [x for x in chain if isinstance(x, errors.UserError)]
  if ours:
    return str(ours[-1]).strip()
  for x in chain:
    if isinstance(x, SyntaxError) and x.filename and pathlib.Path(x.filename).name == path.name:
      return (f"config file {path} cannot be loaded: {x.msg} at line {x.lineno}"
              + (f": {x.text.strip()}" if x.text and x.text.strip() else ""))
  for x in reversed(chain):
    frames = [f for f in traceback.extract_tb(x.__traceback__)
              if pathlib.Path(f.filename).resolve() == path.resolve()]
    if frames:
      words = str(x).strip().splitlines()
      return (f"config file {path} cannot be loaded: line {frames[-1].lineno} "
              f"({(frames[-1].line or '').strip()}) raised {type(x).__name__}"
              + (f": {words[-1]}" if words else ""))
  return None


def _requote(text: str, argv: list[str]) -> str | None:
  """absl's one-line ``flag --NAME=VALUE: why`` with VALUE quoted as the user's shell needs it
  (``'1 2'``), or None when ``text`` is not that message."""
  m = re.match(r"flag (--[A-Za-z0-9_.]+)=", text)
  if not m or "\n" in text.strip():
    return None
  name = m.group(1)
  for a in argv:
    head_value = a[len(name) + 1:] if a.startswith(name + "=") else None
    if head_value is not None and text.startswith(f"flag {name}={head_value}: "):
      return f"{name}={shlex.quote(head_value)}: {text[len(f'flag {name}={head_value}: '):]}"
  return None


def _boolean_in_words(line: str) -> str:
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
              f"(every knob with its comment: chinchax/config/defaults.py)")
    node = node[part]
  return None


def _integral_ints(argv: list[str], default: pathlib.Path) -> list[str]:
  """``argv`` with each ``--config.KEY=VALUE`` of an integer knob given as an integral number
  in float form (``1e6``, ``2.0``, ``1_000_000.0``) rewritten as that integer.

  Raises:
    UsageError: an integer knob given a number that is not whole (``2.5``, ``inf``).
  """
  at = [i for i, a in enumerate(argv) if a.startswith("--config.") and "=" in a]
  if not at:
    return argv
  path, _, variant = (_config_arg(argv) or str(default)).partition(":")
  try:
    base = _load_variant(pathlib.Path(path), variant or "default")
  except Exception:  # noqa: BLE001 — the parse that follows names what is wrong with the file
    return argv
  out = list(argv)
  for i in at:
    key, value = argv[i][len("--config."):].split("=", 1)
    node = base
    for part in key.split("."):
      node = node[part] if hasattr(node, "keys") and part in node else None
    if type(node) is not int:  # bool is not int here
      continue
    try:
      int(value)
      continue  # already an integer (1000000, 1_000_000): the parser takes it
    except ValueError:
      pass
    try:
      number = float(value)
    except ValueError:
      continue  # not a number at all: the parser says so
    if not number.is_integer():
      raise UsageError(f"--config.{key}={value} is not a whole number; {key} is an integer "
                       f"(e.g. 1e6 or 1_000_000)")
    out[i] = f"--config.{key}={int(number)}"
  return out


def set_knobs(argv: list[str], section: str) -> set[str]:
  """Names of the ``section`` knobs that ``argv`` sets (``--config.SECTION.KNOB[=VALUE]``)."""
  prefix = f"--config.{section}."
  return {a[len(prefix):].split("=", 1)[0] for a in argv if a.startswith(prefix)}


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
    print(_help_text(verb, default, argv))
    return None
  _check_config_file_exists(argv, default)
  argv = _integral_ints(argv, default)
  fv = flags.FlagValues()
  full_argv = [f"chinchax-{verb}"] + argv
  try:
    config_flags.DEFINE_config_file("config", default=str(default) if default.exists() else None,
                                    flag_values=fv, lock_config=True, sys_argv=full_argv,
                                    help_string=f"config file, e.g. {default.name}:VARIANT")
    rest = fv(full_argv)
    config = fv.config
  except Exception as e:  # noqa: BLE001 — any parse failure is the user's input
    path = pathlib.Path((_config_arg(argv) or str(default)).split(":", 1)[0])
    loaded = _load_failure(e, path)
    if loaded is not None:
      raise UsageError(loaded) from None
    line = _boolean_in_words(_requote(str(e), argv) or _one_line(e))
    raise UsageError(_unknown_key(argv, default, verb, line) or line) from None
  if len(rest) > 1:
    raise UsageError(f"unexpected argument(s) {' '.join(rest[1:])!r}; options look like "
                     f"--config.SECTION.KNOB=VALUE")
  if config is None:
    raise UsageError(f"no config given; use --config configs/{default.name}:VARIANT")
  _check_kind(config, verb, _config_arg(argv) or str(default))
  return config


# The section that marks each kind of config, and the verbs that take it.
_KIND_KEYS = {"ladder": ("ladder", "ladder.py"), "bench": ("bench", "bench.py"),
              "train": ("model", "train.py")}


def _check_kind(config, verb: str, given: str) -> None:
  """Raises UsageError when ``config`` is another verb's kind (a ladder config given to train)."""
  want = {"ladder": "ladder", "bench": "bench"}.get(verb, "train")
  if _KIND_KEYS[want][0] in config:
    return
  have = next((k for k, (key, _) in _KIND_KEYS.items() if key in config), None)
  what = f"a {have} config" if have else "not a config of chinchax " + verb
  use = f"; for that config: chinchax {have} --config {given}" if have else ""
  raise UsageError(f"--config {given} is {what} (it has no {_KIND_KEYS[want][0]!r} section); "
                   f"chinchax {verb} takes configs/{_KIND_KEYS[want][1]}:VARIANT{use}")
