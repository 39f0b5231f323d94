"""What a new user meets first: --help as plain text, one-line errors, a planner that warns."""

import json
import pathlib
import re

import pytest

from chinchax import cli
from chinchax import config as config_lib
from chinchax.planning import planner

REPO = pathlib.Path(__file__).resolve().parent.parent

# reST a terminal would show raw: roles, double and single backquotes, literal-block markers.
_REST = [re.compile(r":[a-z]+:`"), re.compile(r"``"), re.compile(r"`"), re.compile(r"::\s*$", re.M)]


def _run(capsys, *argv):
  rc = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return rc, out, [l for l in err.splitlines() if l.strip()]


@pytest.mark.parametrize("verb", cli.VERBS)
def test_every_verb_help_is_plain_text_with_flags_defaults_and_an_example(capsys, verb):
  rc, out, err = _run(capsys, verb, "--help")
  assert rc == 0 and not err, err
  for pattern in _REST:
    assert not pattern.search(out), (pattern.pattern, pattern.search(out).group(0))
  lines = out.splitlines()
  at = [i for i, l in enumerate(lines) if l.strip() in ("Example:", "Examples:")]
  assert at and lines[at[0] + 1].startswith(f"  chinchax {verb} "), out[-800:]
  flag_lines = [l for l in lines if l.lstrip().startswith("--")]
  assert flag_lines and "default" in out, out


def _flat(node, prefix=""):
  for key, value in node.items():
    if hasattr(value, "items"):
      yield from _flat(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


@pytest.mark.parametrize("argv, config", [
    (["train", "--help"], config_lib.get_variant("default")),
    (["train", f"--config={REPO}/configs/train.py:tiny", "--help"], config_lib.get_variant("tiny")),
    (["ladder", "-h"], config_lib.get_ladder_variant("default")),
])
def test_config_verb_help_lists_every_knob_with_its_default_and_comment(capsys, argv, config):
  rc, out, _ = _run(capsys, *argv)
  assert rc == 0
  for key, value in _flat(config):
    assert f"    {key} = {value!r}" in out, key
  # the comment of chinchax/config/defaults.py, units included
  assert re.search(r"model\.d_model = \d+ +residual width", out)
  assert "seconds for all processes to reach the coordinator" in out


@pytest.mark.parametrize("verb, flag, shown", [
    ("plan", "--candidates", "(default: 5)"), ("plan", "--mfu", "(default 0.5)"),
    ("plan", "--flops", "FLOPs"), ("fit", "--seed", "(default: 0)"),
    ("fit", "--bootstrap", "(default: 200)"), ("export", "--dtype", "(default: float32)"),
])
def test_argparse_verb_help_shows_defaults_and_units(capsys, verb, flag, shown):
  rc, out, _ = _run(capsys, verb, "--help")
  entry = out[out.index(f"  {flag} "):]
  entry = entry[:entry.index("\n  -", 3)] if "\n  -" in entry[3:] else entry
  assert rc == 0 and shown in " ".join(entry.split()), entry


# ---------------------------------------------------------------- item 2: one clear line


@pytest.mark.parametrize("argv, needle", [
    (["fit"], "the following arguments are required: RESULTS; see chinchax fit --help"),
    (["fit", "x.jsonl", "--approach", "5"], "invalid choice: '5'"),
    (["export"], "required: WORKDIR; see chinchax export --help"),
    (["plan", "--flops", "1e20", "--bogus"], "unrecognized arguments: --bogus; see chinchax plan"),
])
def test_argparse_errors_are_one_line_with_a_hint(capsys, argv, needle):
  rc, out, err = _run(capsys, *argv)
  assert rc == 2 and out == "" and len(err) == 1, err
  assert err[0].startswith("error: ") and needle in err[0] and "usage:" not in err[0], err


def test_flag_parse_error_keeps_the_users_quoting(capsys):
  rc, _, err = _run(capsys, "train", "--config.model.d_model=1 2")
  assert rc == 2 and len(err) == 1 and "--config.model.d_model='1 2': invalid literal" in err[0], err


def test_unknown_variant_shows_no_class_path(capsys):
  rc, _, err = _run(capsys, "train", f"--config={REPO}/configs/train.py:nosuch")
  assert rc == 2 and len(err) == 1, err
  assert err[0] == "error: unknown config variant 'nosuch'; known: default, tiny, small, 125m", err


@pytest.mark.parametrize("text, needle", [
    ("def get_config(:\n  pass\n", "invalid syntax at line 1"),
    ("import os\nimport no_such_module_here\n", "line 2 (import no_such_module_here) raised "
                                                "ModuleNotFoundError"),
    ("def get_config():\n  x = 1\n  return x / 0\n", "line 3 (return x / 0) raised "
                                                     "ZeroDivisionError"),
])
def test_a_config_file_that_fails_to_load_is_named_with_its_line(capsys, tmp_path, text, needle):
  f = tmp_path / "mine.py"
  f.write_text(text)
  rc, _, err = _run(capsys, "train", f"--config={f}")
  assert rc == 2 and len(err) == 1, err
  assert f"config file {f} cannot be loaded: " in err[0] and needle in err[0], err


def test_fit_on_a_directory_says_what_it_is(capsys, tmp_path):
  rc, _, err = _run(capsys, "fit", tmp_path)
  assert rc == 2 and len(err) == 1 and "does not exist" not in err[0], err
  assert "is a directory" in err[0]
  (tmp_path / "results.jsonl").write_text("")
  _, _, err = _run(capsys, "fit", tmp_path)
  assert f"give its table, {tmp_path}/results.jsonl" in err[0], err


def test_export_of_a_missing_directory_says_it_is_missing(capsys, tmp_path):
  rc, _, err = _run(capsys, "export", tmp_path / "nosuch")
  assert rc == 2 and len(err) == 1, err
  assert "does not exist" in err[0] and "config.json" not in err[0].split(";")[0], err
  rc, _, err = _run(capsys, "export", tmp_path)  # exists, but is no run
  assert rc == 2 and "has no config.json" in err[0], err


# ---------------------------------------------------------------- item 1: budgets the plan misses


def test_a_budget_below_one_step_is_refused_naming_the_smallest_that_works(capsys):
  # Smallest accelerator shape: d_model 128, 2 layers, d_ff 384, vocab 257, tied embedding:
  # 257·128 + 2·(4·128² + 3·128·384 + 2·128) + 128 = 459,520 params (hand count).
  n_min = 257 * 128 + 2 * (4 * 128 ** 2 + 3 * 128 * 384 + 2 * 128) + 128
  assert n_min == 459_520
  c_min = 6 * n_min * 2048  # one step of one 2048-token sequence: 5.647e9 FLOPs
  rc, out, err = _run(capsys, "plan", "--flops", "1e5")
  assert rc == 2 and out == "" and len(err) == 1, err
  assert "cannot train one step" in err[0] and f"{c_min:.3g} FLOPs" in err[0], err
  assert "give --flops 5.7e+09 or more" in err[0], err
  assert planner.plan_flops(5.7e9).batch.steps == 1  # the budget it names does plan


def test_a_plan_off_its_budget_by_more_than_10_percent_says_so(capsys):
  # 1e10 FLOPs on the 459,520-parameter shape: D = 3,627 tokens = 1.77 steps of 2,048 -> 2 steps,
  # 6·459,520·4,096 = 1.129e10 FLOPs, 13% over.
  plan = planner.plan_flops(1e10)
  assert plan.batch.steps == 2 and plan.C == pytest.approx(6 * 459_520 * 4096)
  assert any("+13% off the budget 1e+10 FLOPs" in w for w in plan.warnings), plan.warnings
  rc, out, err = _run(capsys, "plan", "--flops", "1e10", "--json")
  assert rc == 0 and any("+13% off the budget" in l for l in err), err
  assert json.loads(out)["warnings"]
  big = planner.plan_flops(1e21)  # many steps: within 10%, no such warning
  assert not any("off the budget" in w for w in big.warnings), big.warnings
