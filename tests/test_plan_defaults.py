"""What a plan assumes when not told: an accelerator's vocabulary, the measured CPU, where a
written config may go, and how a law's loss in other tokens is shown."""

import importlib.metadata
import json

from chinchax import cli
from chinchax.cost import hardware as hardware_lib


def _plan(capsys, *argv) -> tuple[int, str, str]:
  rc = cli.main(["plan", *map(str, argv)])
  out = capsys.readouterr()
  return rc, out.out, out.err


def test_an_accelerator_plan_trains_a_32k_bpe_unless_told(capsys, tmp_path):
  rc, out, _ = _plan(capsys, "--hours", 48, "--hardware", "h100x8", "--write-config",
                     tmp_path / "p.py")
  assert rc == 0 and "vocab_size 32768" in out and "32,768-token BPE" in out, out
  written = (tmp_path / "p.py").read_text()
  assert 'tokenizer="bpe", bpe_vocab_size=32768' in written and "vocab_size=32768" in written
  rc, out, _ = _plan(capsys, "--hours", 48, "--hardware", "h100x8", "--vocab-size", 257)
  assert rc == 0 and "vocab_size 257" in out and "BPE" not in out
  rc, out, _ = _plan(capsys, "--hours", 1, "--hardware", "cpux8")  # the CPU ladder's bytes
  assert rc == 0 and "vocab_size 257" in out and "BPE" not in out


def test_a_cpu_plan_prices_the_measured_host(capsys, tmp_path, monkeypatch):
  """With a calibration of this host's 8-device layout in the cache, --hardware cpux8 is priced
  at that peak (divided among the devices), not the table's nominal 5e10 FLOP/s per device."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  rc, out, _ = _plan(capsys, "--hours", 1, "--hardware", "cpux8", "--json")
  nominal = json.loads(out)["hardware"]["peak_flops_per_device"]
  assert rc == 0 and nominal == 5e10
  key = hardware_lib.cpu_flops_key(importlib.metadata.version("jax"), 8)
  cache = tmp_path / "chinchax" / "cpu_peak_flops.json"
  cache.parent.mkdir()
  cache.write_text(json.dumps({key: {"best": 1.6e12, "measurements": 3}}))
  rc, out, _ = _plan(capsys, "--hours", 1, "--hardware", "cpux8", "--json")
  plan = json.loads(out)
  assert rc == 0 and plan["hardware"]["peak_flops_per_device"] == 2e11
  assert "measured: best of 3" in plan["step_time_model"]
  rc, out, _ = _plan(capsys, "--hours", 1, "--hardware", "cpu", "--json")  # 1 device: none
  assert rc == 0 and json.loads(out)["hardware"]["peak_flops_per_device"] == nominal


def test_a_law_in_other_tokens_is_shown_or_withheld_not_both(capsys):
  rc, out, _ = _plan(capsys, "--hours", 1, "--hardware", "cpux8")
  assert rc == 0 and "in the law's units" in out, out  # the law's loss ranks the shapes
  assert "no predicted loss is given" not in out and "not this plan's predicted loss" in out


def test_write_config_makes_runs_on_a_fresh_clone(capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  rc, _, err = _plan(capsys, "--flops", "1e13", "--write-config", "runs/planned.py")
  assert rc == 0, err
  assert "def get_config" in (tmp_path / "runs" / "planned.py").read_text()
  (tmp_path / "f").write_text("")
  rc, _, err = _plan(capsys, "--flops", "1e13", "--write-config", "f/planned.py")
  assert rc == 2 and "'f' is not a directory" in err and err.count("\n") == 1, err
