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


def _commands(text: str, blocks_only: bool = False) -> list[str]:
  """Each `chinchax ...` command: lines of fenced and indented blocks (continuations joined)
  and, unless ``blocks_only``, inline spans (which may be fragments: `chinchax plan --hardware`)."""
  out, in_block, held = [], False, ""
  for line in text.splitlines():
    if line.strip().startswith("```"):
      in_block, held = not in_block, ""
      continue
    if in_block or (line.startswith("    ") and (held or line.strip().startswith("chinchax "))):
      line = held + line.strip()
      if line.endswith("\\"):
        held = line[:-1] + " "
        continue
      held = ""
      if line.startswith("chinchax "):
        out.append(line)
    elif not blocks_only:
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
    kind = "ladder" if "--ladder" in words else "train"  # compile --ladder: a ladder config's
    flags_lib.parse_config(overrides, flags_lib.config_file(cli.CONFIG_VERBS[kind]), kind)
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


def _train_configs():
  """(page, command, workdir, settings) of every `chinchax train` command of the pages (a
  planned config that a page writes first is left out)."""
  for page in PAGES:
    for command in _commands(page.read_text()):
      words = _words(command)
      if (words[:1] != ["train"] or any(PLACEHOLDER.match(w) for w in words[1:])
              or set(words) & set(flags_lib.HELP_FLAGS)):
        continue
      given = _value(words, "--config")
      if given is not None and not (REPO / given.split(":")[0]).is_file():
        continue
      config = flags_lib.parse_config(words[1:], flags_lib.config_file("train.py"), "train")
      settings = config.to_dict()
      workdir = settings.pop("workdir")
      yield _id(page), command, workdir, settings


def test_no_two_documented_runs_share_a_workdir_with_other_settings(monkeypatch):
  """Run in page order on a fresh clone, a second run with other settings in the same default
  workdir is refused: each example that changes what is trained names its own workdir."""
  monkeypatch.chdir(REPO)
  seen: dict[str, tuple] = {}
  clashes = []
  for page, command, workdir, settings in _train_configs():
    if workdir in seen and seen[workdir][2] != settings:
      clashes.append(f"{page}: {command!r} trains into {workdir}, as {seen[workdir][0]}: "
                     f"{seen[workdir][1]!r} does with other settings")
    seen.setdefault(workdir, (page, command, settings))
  assert not clashes, "\n".join(clashes)


def test_the_cheap_commands_run_as_written(tmp_path, monkeypatch, capsys):
  """Every `chinchax plan` and `chinchax VERB --help` of the pages' command blocks (no JAX: < 1 s
  each) runs for real, in
  page order, with its --write-config redirected into a scratch folder; one that reads a file
  another verb writes first (a ladder's fit.json, a bench's step_time.json) is skipped."""
  monkeypatch.chdir(REPO)
  ran, failed = 0, []
  for page in PAGES:
    for command in _commands(page.read_text(), blocks_only=True):
      words = _words(command)
      if set(words) & set(flags_lib.HELP_FLAGS) and words[0] in cli.VERBS:
        pass  # a verb's help: no JAX either
      elif (words[:1] != ["plan"] or any(PLACEHOLDER.match(w) for w in words[1:])
              or "--aot" in words or "--calibrate" in words):
        continue
      reads = [_value(words, f) for f in ("--law", "--step-time-model")]
      if any(r is not None and r.endswith(".json") and not (REPO / r).is_file() for r in reads):
        continue
      out = _value(words, "--write-config")
      if out is not None:
        words = [str(tmp_path / f"{ran}.py") if w == out else
                 w.replace(out, str(tmp_path / f"{ran}.py")) for w in words]
      try:
        rc = cli.main(words)
      except SystemExit as e:
        rc = e.code
      ran += 1
      said = capsys.readouterr()
      if rc != 0:
        failed.append(f"{_id(page)}: {command!r}: exit {rc}: {said.err.strip()[-300:]}")
  assert ran >= 3 and not failed, "\n".join(failed)


def _documented_runs() -> dict[str, tuple[int, str]]:
  """workdir → (seq_len, data.source) of the runs the pages train: each `chinchax train`
  command's, and each run of the default ladder (runs/ladder/runs/<run_id>)."""
  import importlib.util
  from chinchax.ladder import grid
  runs = {w: (s["train"]["seq_len"], s["data"]["source"]) for _, _, w, s in _train_configs()}
  spec = importlib.util.spec_from_file_location("ladder_configs", REPO / "configs" / "ladder.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("default")
  t = c.train_config
  for r in grid.plan_runs(c.ladder, t.train, 257):
    runs[f"{c.workdir}/runs/{r.run_id}"] = (t.train.seq_len, t.data.source)
  return runs


def test_sample_examples_fit_their_run_and_prompt_what_it_learned(monkeypatch):
  """Each `chinchax sample` example of the pages and of `sample --help` names a run the pages
  train (a real ladder run id), asks for prompt bytes + new tokens within its seq_len (byte
  tokens), and prompts a run trained on Python source with text that occurs in that source."""
  from chinchax.data import sources
  monkeypatch.chdir(REPO)
  runs = _documented_runs()
  examples = [c for p in PAGES for c in _commands(p.read_text(), blocks_only=True)]
  examples += [line.strip() for line in _help("sample").splitlines()
               if line.strip().startswith("chinchax sample ")]
  examples = [c for c in examples if c.startswith("chinchax sample ")]
  stdlib = None
  bad = []
  for command in examples:
    words = _words(command)
    workdir = words[1]
    if PLACEHOLDER.match(workdir):
      continue
    if workdir not in runs:
      bad.append(f"{command!r}: no page trains {workdir}")
      continue
    seq_len, source = runs[workdir]
    prompt = (_value(words, "--prompt") or "").encode("utf-8")
    new = int(_value(words, "--max-new-tokens") or 0)
    if len(prompt) + new > seq_len:
      bad.append(f"{command!r}: {len(prompt)} prompt bytes + {new} new > seq_len {seq_len}")
    if prompt and source == "stdlib":
      stdlib = stdlib or [f.read_bytes() for f in sources.StdlibSource().files]
      if not any(prompt in text for text in stdlib):
        bad.append(f"{command!r}: {prompt!r} occurs nowhere in the Python source it learned")
  assert len(examples) >= 3 and not bad, "\n".join(bad)


def test_the_docs_runner_reads_each_command_once_and_says_why_it_skips(monkeypatch):
  """benchmarks/docs_commands.py: an indented block's continued commands come apart, fragments
  and placeholders are not run, and every long or unrunnable command carries its reason."""
  import importlib.util
  spec = importlib.util.spec_from_file_location("docs_commands",
                                                REPO / "benchmarks" / "docs_commands.py")
  runner = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(runner)
  monkeypatch.chdir(REPO)
  storage = [c for c, _ in runner.commands((REPO / "docs" / "storage.md").read_text())]
  assert [c.split()[1] for c in storage] == ["train", "ladder", "fit"], storage
  assert all(c.count("chinchax ") == 1 for c in storage)
  skip = lambda c, inline=False: runner.skip_reason(runner.words(c), False, {}, inline)  # noqa
  assert skip("chinchax plan --flops 1e21 --law chinchilla-approach1") is None
  assert skip("chinchax fit WORKDIR/results.jsonl").startswith("a synopsis")
  assert skip("chinchax sample --temperature 0", inline=True).startswith("an inline mention")
  assert skip("chinchax ladder").startswith("long: a whole ladder")
  assert runner.skip_reason(runner.words("chinchax ladder"), True, {}) is None
  assert "Gutenberg" in skip("chinchax train --config.data.paths='../shared/corpora/g/*.txt'")
