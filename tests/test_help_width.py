"""Every verb's help fits 100 columns, lists the knobs its verb reads, gives an override that
works, and prints without importing JAX."""

import pathlib
import subprocess
import sys

import pytest

from chinchax import cli

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("verb", cli.VERBS)
def test_help_fits_100_columns_and_imports_no_jax(verb):
  code = ("import sys\nfrom chinchax import cli\nrc = cli.main([%r, '--help'])\n"
          "assert 'jax' not in sys.modules, 'jax imported'\nsys.exit(rc)" % verb)
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  lines = r.stdout.splitlines()
  # a command line of an example stays whole (copyable); every other line fits
  wide = [l for l in lines if len(l) > 100 and not l.lstrip().startswith("chinchax ")]
  assert not wide, wide


def test_prepare_help_lists_only_data_knobs(capsys):
  assert cli.main(["prepare", "--help"]) == 0
  knobs = [l.split()[0] for l in capsys.readouterr().out.splitlines()
           if l.startswith("    ") and " = " in l and not l.startswith("     ")]
  assert knobs and all(k.startswith("data.") for k in knobs), knobs


def test_ladder_help_override_example_is_accepted(capsys, tmp_path):
  assert cli.main(["ladder", "--help"]) == 0
  example = [w for w in capsys.readouterr().out.split() if w.startswith("--config.train_config.")]
  assert example
  assert cli.main(["ladder", f"--config={REPO}/configs/ladder.py:tiny", f"--config.workdir={tmp_path / 'l'}",
                   "--config.ladder.status=True", example[0]]) == 0
