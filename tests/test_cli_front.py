"""The command line's front: help without JAX, per-kind knob comments, --version, one `error:`
line for another verb's config or a workdir that is a file, a reader that leaves early."""

import contextlib
import importlib
import io
import os
import pathlib
import re
import subprocess
import sys

import pytest

from chinchax import cli
from chinchax.cli import helptext

REPO = pathlib.Path(__file__).resolve().parent.parent


def _help(*argv) -> str:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert cli.main(list(argv)) == 0
  return out.getvalue()


@pytest.mark.parametrize("verb", ["train", "ladder"])
def test_config_verb_help_imports_no_jax(verb):
  code = ("import sys, contextlib, io\nfrom chinchax.cli import main\n"
          f"with contextlib.redirect_stdout(io.StringIO()): rc = main([{verb!r}, '--help'])\n"
          "print(rc, sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                        timeout=120, cwd=REPO)
  assert proc.stdout.split("\n")[0] == "0 []", proc.stdout + proc.stderr


@pytest.mark.parametrize("verb", ["bench", "ladder", "prepare", "train"])
def test_help_without_the_verb_module_is_the_verb_modules_own(verb, capsys):
  """The import-free help of a config verb prints what the verb's own main(--help) prints."""
  module = importlib.import_module(f"chinchax.cli.{verb}")
  assert module.main(["--help"]) == 0
  own = helptext.plain(capsys.readouterr().out.rstrip())
  assert own.strip() and own.strip() in _help(verb, "--help")


def _comment(text: str, key: str) -> str:
  (line,) = [l for l in text.splitlines() if l.startswith(f"    {key} = ")]
  return re.split(r" = \S+\s+", line, maxsplit=1)[1]


def test_knob_comments_belong_to_each_kind_of_config():
  train, ladder, bench = _help("train", "--help"), _help("ladder", "--help"), _help("bench", "-h")
  assert "checkpoints" in _comment(train, "workdir") and "bench" not in _comment(train, "workdir")
  assert "bench" not in _comment(ladder, "train_config.workdir")
  assert "results.jsonl" in _comment(ladder, "workdir")
  assert "bench.json" in _comment(bench, "workdir")
  sweeps = [l for l in bench.splitlines() if l.startswith("    sweeps.size.")]
  comments = [re.split(r" = \S+\s+", l, maxsplit=1)[1] for l in sweeps]
  assert len(sweeps) == 7 and len(set(comments)) == 7, comments
  assert "residual width" in _comment(bench, "models.s1.d_model")


def test_top_level_help_speaks_to_users_and_version_prints(capsys):
  text = _help("--help")
  assert "UserError" not in text and "chinchax.errors" not in text
  assert "--version" in text
  out = _help("--version")
  assert re.fullmatch(r"chinchax \d+\.\d+\.\d+\S*\n", out), out


def test_top_level_help_into_a_closed_pipe_is_no_traceback():
  proc = subprocess.Popen([sys.executable, "-m", "chinchax.cli", "-h"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, cwd=REPO)
  proc.stdout.close()  # the reader left before a byte was written (`chinchax -h | head -2`)
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=60) == 0 and err == "", err


@pytest.mark.parametrize("argv, needle", [
    (["train", f"--config={REPO}/configs/ladder.py:tiny"], "is a ladder config"),
    (["ladder", f"--config={REPO}/configs/train.py:tiny"], "is a train config"),
    (["bench", f"--config={REPO}/configs/ladder.py:tiny"], "is a ladder config"),
])
def test_another_verbs_config_is_one_error_line(capsys, argv, needle):
  assert cli.main(argv) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
  verb = argv[0]
  assert f"chinchax {verb} takes configs/" in err[0]


def test_a_ladder_workdir_that_is_a_file_is_one_error_line(capsys, tmp_path):
  f = tmp_path / "afile"
  f.write_text("mine\n")
  rc = cli.main(["ladder", f"--config={REPO}/configs/ladder.py:tiny", f"--config.workdir={f}"])
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert rc == 2 and len(err) == 1 and "is a file, not a directory" in err[0], err
  assert f.read_text() == "mine\n"
