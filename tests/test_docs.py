"""The README and docs/ stay true: every relative link resolves (anchors included), and every
`chinchax ...` command in them names a verb, flags, config files, variants, knobs, laws, hardware
and topologies that exist. Nothing is trained: config commands are parsed, the others' flags are
looked up in their --help."""

import contextlib
import io
import pathlib
import re
import shlex

import pytest

from chinchax import cli
from chinchax.cost import hardware as hardware_lib
from chinchax.aot import topology as topology_lib
from chinchax.cli import flags as flags_lib
from chinchax.planning import planner

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"^(\.\.\.|<.*>|[A-Z][A-Z0-9_/.]*)$")  # ..., <verb>, VERB, WORKDIR/...
WRITES = ("--write-config", "--out")  # flags whose value a later command on the page may read


def _id(page: pathlib.Path) -> str:
  return str(page.relative_to(REPO))


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
  return {_slug(l.lstrip("#")) for l in page.read_text().splitlines() if l.startswith("#")}


def test_the_docs_pages_exist_and_the_readme_lists_each():
  readme = (REPO / "README.md").read_text()
  names = {p.name for p in PAGES[1:]}
  assert {"training.md", "data.md", "ladder.md", "fitting.md", "tuning.md", "time-budgets.md",
          "compile-tpu.md", "clusters.md", "export.md", "bench.md"} <= names
  for name in names:
    assert f"(docs/{name})" in readme, name
  assert len(readme.splitlines()) <= 260


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_relative_link_resolves(page):
  bad = []
  for target in LINK.findall(page.read_text()):
    if re.match(r"[a-z]+:", target):  # https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
      bad.append(f"{target}: no {dest}")
    elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
      bad.append(f"{target}: no heading #{anchor} in {dest.name}")
  assert not bad, bad


def _commands(text: str) -> list[str]:
  """Each `chinchax ...` command: lines of fenced blocks (continuations joined) and inline spans."""
  out, in_block, held = [], False, ""
  for line in text.splitlines():
    if line.strip().startswith("```"):
      in_block, held = not in_block, ""
      continue
    if in_block:
      line = held + line.strip()
      if line.endswith("\\"):
        held = line[:-1] + " "
        continue
      held = ""
      if line.startswith("chinchax "):
        out.append(line)
    else:
      out += [s for s in re.findall(r"`([^`]+)`", line) if s.startswith("chinchax ")]
  return out


def _words(command: str) -> list[str]:
  """The command's arguments: comments and optional-flag brackets dropped."""
  return [w for w in (w.strip("[]") for w in shlex.split(command, comments=True)[1:]) if w]


@contextlib.contextmanager
def _quiet():
  with contextlib.redirect_stdout(io.StringIO()) as out:
    yield out


_HELP: dict[str, str] = {}


def _help(verb: str) -> str:
  if verb not in _HELP:
    with _quiet() as out:
      assert cli.main([verb, "--help"]) == 0
    _HELP[verb] = out.getvalue()
  return _HELP[verb]


def _value(words: list[str], flag: str) -> str | None:
  """The value given to ``flag``; None when absent or a placeholder (NAME, H)."""
  for i, w in enumerate(words):
    value = (words[i + 1] if w == flag and i + 1 < len(words)
             else w.split("=", 1)[1] if w.startswith(flag + "=") else None)
    if value is not None:
      return None if PLACEHOLDER.match(value) else value
  return None


def _check_config_verb(verb: str, words: list[str], written: set[str]) -> None:
  given = _value(words, "--config")
  if given is not None and given.split(":")[0] in written:  # e.g. plan --write-config, then train
    words = [w for w in words if w not in (given, "--config", f"--config={given}")]
  words = [w for w in words if not PLACEHOLDER.match(w)]
  if verb == "ladder":  # its one flag besides the config's: --dry-run (chinchax.cli.ladder)
    words = [w for w in words if w != "--dry-run"]
  flags_lib.parse_config(words, flags_lib.config_file(cli.CONFIG_VERBS[verb]), verb)


def _check_flag_verb(verb: str, words: list[str]) -> None:
  if "--config.SECTION.KNOB" in _help(verb):  # run-config overrides (compile): knobs that exist
    overrides = [w for w in words if w.startswith("--config.") and not PLACEHOLDER.match(w)]
    flags_lib.parse_config(overrides, flags_lib.config_file(cli.CONFIG_VERBS["train"]), "train")
    words = [w for w in words if not w.startswith("--config.")]
  known = set(re.findall(r"--[a-z][a-z0-9-]*", _help(verb)))
  flags = [w.split("=")[0] for w in words if w.startswith("--")]
  assert not [f for f in flags if f not in known], (verb, flags, sorted(known))
  law = _value(words, "--law")
  if law is not None and not law.endswith(".json"):
    planner.load_law(law)
  hw = _value(words, "--hardware")
  if hw is not None:
    hardware_lib.parse_hardware(hw)
  topology = _value(words, "--topology")
  if topology is not None:
    topology_lib.parse_target(topology, num_slices=int(_value(words, "--slices") or 1))
  config = _value(words, "--config")
  if config is not None:
    assert (REPO / config.split(":")[0]).is_file(), config


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_command_names_what_exists(page, monkeypatch):
  monkeypatch.chdir(REPO)  # the pages' paths (configs/train.py) are relative to the checkout
  written: set[str] = set()
  commands = _commands(page.read_text())
  for command in commands:
    words = _words(command)
    head = shlex.split(command, comments=True)[1]
    if PLACEHOLDER.match(head):  # chinchax <verb> --help, chinchax VERB --help
      continue
    if head.startswith("-"):
      with _quiet():
        assert cli.main([head]) == 0, command
      continue
    assert head in cli.VERBS, command
    words = words[1:]
    try:
      if head in cli.CONFIG_VERBS:
        _check_config_verb(head, words, written)
      else:
        _check_flag_verb(head, words)
    except Exception as e:  # noqa: BLE001 — the failing command, in the message
      pytest.fail(f"{_id(page)}: {command!r}: {type(e).__name__}: {e}")
    written |= {v for f in WRITES if (v := _value(words, f)) is not None}
