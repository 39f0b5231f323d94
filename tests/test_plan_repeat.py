"""``chinchax plan --unique-tokens``: the data-constrained optimum (chinchax.planning.constrained).

Independent truth: a brute-force grid over N of the repetition law at C = 6ND, and the
unconstrained closed form (Chinchilla eq. 4) where the limit does not bind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json

import numpy as np
import pytest

from chinchax import cli
from chinchax.laws import parametric as laws
from chinchax.laws import repeat as lr
from chinchax.planning import constrained

BASE = laws.PUBLISHED_LAWS["chinchilla-approach3"]
C = 1e21


def run_cli(*argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = cli.main(["plan", *[str(a) for a in argv]])
  return rc, out.getvalue(), err.getvalue()


def _brute_force(law, U, C):
  """argmin over a fine grid of ln N (1e5 points over 8 decades) of the law at D = C / 6N."""
  n = np.exp(np.linspace(np.log(1e5), np.log(1e13), 100_001))
  loss = law.loss(n, C / (6 * n), U)
  i = int(np.argmin(loss))
  return n[i], float(loss[i])


@pytest.mark.parametrize("law", [
    lr.MuennighoffLaw(base=BASE, R_D_star=lr.MUENNIGHOFF_R_D_STAR,
                      R_N_star=lr.MUENNIGHOFF_R_N_STAR),
    lr.OverfitLaw(base=BASE, P=0.05),
], ids=["muennighoff", "overfit"])
@pytest.mark.parametrize("U", [2e9, 2e10])
def test_optimum_matches_brute_force_grid(law, U):
  n_grid, loss_grid = _brute_force(law, U, C)
  n, d = lr.DataLimitedLaw(law, U).optimal_allocation(C)
  assert n * d * 6 == pytest.approx(C, rel=1e-12)
  assert float(law.loss(n, d, U)) <= loss_grid + 1e-9
  assert n == pytest.approx(n_grid, rel=2e-3)


def test_ample_unique_data_gives_the_unconstrained_plan():
  n_u, d_u = BASE.optimal_allocation(C)   # Chinchilla eq. 4, closed form
  for law in (lr.MuennighoffLaw(base=BASE, R_D_star=15.4, R_N_star=5.3),
              lr.OverfitLaw(base=BASE, P=0.05)):
    block = constrained.data_limited(C, 1.5 * d_u, law, "test")
    assert block["constrained"]["N"] == pytest.approx(n_u, rel=1e-6)
    assert block["constrained"]["D"] == pytest.approx(d_u, rel=1e-6)
    assert block["loss_lost"] == pytest.approx(0.0, abs=1e-9)
    assert block["constrained"]["epochs"] < 1


def test_scarce_data_trains_more_epochs_and_loses_loss():
  n_u, d_u = BASE.optimal_allocation(C)
  U = d_u / 20
  for law in (lr.MuennighoffLaw(base=BASE, R_D_star=15.4, R_N_star=5.3),
              lr.OverfitLaw(base=BASE, P=0.05)):
    block = constrained.data_limited(C, U, law, "test")
    c = block["constrained"]
    assert c["epochs"] > 1
    assert abs(c["N"] / n_u - 1) > 0.01      # a different N than Chinchilla's
    assert c["loss"] >= block["unconstrained"]["loss"]
    assert block["loss_lost"] > 0
    # The constrained plan beats training Chinchilla's (N, D) on the same U tokens.
    assert c["loss"] <= block["unconstrained"]["loss_with_limit"] + 1e-12


def test_cli_published_constants_json_and_written_config(tmp_path):
  path = tmp_path / "planned.py"
  rc, out, err = run_cli("--flops", 1e19, "--unique-tokens", 1e8, "--law",
                         "chinchilla-approach3", "--write-config", path)
  assert rc == 0, err
  assert "data limit" in out and "published R_D* = 15.39, R_N* = 5.31" in out
  assert "lost to it" in out
  spec = importlib.util.spec_from_file_location("planned", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  cfg = mod.get_config()
  assert cfg.data.allow_repeat is True and cfg.data.unique_tokens == 100_000_000
  assert cfg.data.unique_order == "shuffled"  # a uniform sample, as the repeat ladder fits
  rc, out, err = run_cli("--flops", 1e19, "--unique-tokens", 1e8, "--law",
                         "chinchilla-approach3", "--json")
  d = json.loads(out)["data_limit"]
  assert d["unique_tokens"] == 1e8 and d["constrained"]["epochs"] > 1


def test_cli_fitted_repeat_block_is_used(tmp_path):
  fit = tmp_path / "fit.json"
  b = {k: getattr(BASE, k) for k in ("E", "A", "B", "alpha", "beta")}
  fit.write_text(json.dumps({**b, "repeat": {"status": "ok", "form": "overfit",
                                             "overfit": {"params": {"P": 0.05}, "base": b}}}))
  rc, out, err = run_cli("--flops", 1e19, "--unique-tokens", 1e8, "--law", fit, "--json")
  assert rc == 0, err
  d = json.loads(out)["data_limit"]
  assert d["form"] == "overfit" and "fitted in" in d["note"]
  want = constrained.data_limited(1e19, 1e8, lr.OverfitLaw(base=BASE, P=0.05), "")
  assert d["constrained"]["N"] == pytest.approx(want["constrained"]["N"], rel=1e-9)


@pytest.mark.parametrize("value,match", [
    ("0", "got '0'"), ("-3e9", "got '-3e9'"), ("lots", "got 'lots'"), ("inf", "got 'inf'")])
def test_bad_unique_tokens_is_one_error_line(tmp_path, value, match):
  path = tmp_path / "never.py"
  rc, out, err = run_cli("--flops", 1e19, "--unique-tokens", value, "--write-config", path)
  assert rc == 2 and out == ""
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: --unique-tokens") and match in lines[0]
  assert not path.exists()


def test_unique_tokens_needs_a_flop_budget_and_a_loss_law():
  rc, _, err = run_cli("--hours", 1, "--hardware", "v5p-8", "--unique-tokens", 1e9)
  assert rc == 2 and "--unique-tokens plans a --flops budget" in err
  rc, _, err = run_cli("--flops", 1e19, "--unique-tokens", 1e9, "--law", "chinchilla-approach1")
  assert rc == 2 and "needs a law that predicts loss" in err


def test_a_flat_law_keeps_the_base_split():
  """Saturated terms (tiny R_D*, R_N*) make the loss flat in N past U's sizes: the plan keeps
  the base law's N_opt (the nearest grid point) instead of an arbitrary end of the flat."""
  law = lr.MuennighoffLaw(base=BASE, R_D_star=0.01, R_N_star=0.01)
  n_u, d_u = BASE.optimal_allocation(C)
  n, d = lr.DataLimitedLaw(law, d_u / 1000).optimal_allocation(C)
  grid = np.exp(np.log(n_u) + np.linspace(-4, 4, 801) * np.log(10))
  assert n == pytest.approx(grid[np.argmin(np.abs(np.log(grid / n_u)))], rel=1e-12)
  assert abs(np.log(n / n_u)) <= np.log(10) / 200


def test_data_limit_losses_follow_the_plans_loss_rules():
  """The data-limit block prints no loss above ln of the vocabulary (withheld, as the frontier
  loss is), and labels possible ones in the law's units when the plan trains other tokens."""
  law = lr.MuennighoffLaw(base=BASE, R_D_star=lr.MUENNIGHOFF_R_D_STAR,
                          R_N_star=lr.MUENNIGHOFF_R_N_STAR)
  tiny = constrained.data_limited(1e12, 1e5, law, "")
  assert tiny["constrained"]["loss"] > np.log(32_000)  # impossible in the law's own tokens
  rc, out, err = run_cli("--flops", 1e12, "--unique-tokens", 1e5, "--law", "chinchilla-approach3")
  assert rc == 0, err
  block = out[out.index("  data limit"):out.index("  shape")]
  assert "frontier loss withheld" in out
  assert f"{tiny['constrained']['loss']:.4f}" not in block
  assert f"{tiny['unconstrained']['loss']:.4f}" not in block
  assert "loss withheld (above ln of the vocabulary" in block and "lost to it   withheld" in block
  big = constrained.data_limited(1e20, 1e9, law, "")
  rc, out, err = run_cli("--flops", 1e20, "--unique-tokens", 1e9, "--law", "chinchilla-approach3")
  assert rc == 0, err  # the byte-level plan does not train Chinchilla's tokens
  assert f"loss {big['constrained']['loss']:.4f} in the law's units" in out
  assert f"lost to it   {big['loss_lost']:+.4f} in the law's units" in out


def test_write_config_refuses_unique_tokens_below_one_batch(tmp_path):
  """A U below one batch of the plan (global_batch_size × seq_len + 1 tokens) is a config that
  train refuses: plan says so and writes nothing; one token more is written."""
  path = tmp_path / "planned.py"
  rc, out, _ = run_cli("--flops", 1e12, "--unique-tokens", 100, "--json")
  plan = json.loads(out)
  need = plan["global_batch_size"] * plan["seq_len"] + 1  # hand count: B windows of T + 1 tokens
  rc, out, err = run_cli("--flops", 1e12, "--unique-tokens", need - 1, "--write-config", path)
  lines = err.strip().splitlines()
  assert rc == 2 and len(lines) == 1 and not path.exists(), err
  assert lines[0].startswith(f"error: --unique-tokens {need - 1:,} cannot train the plan")
  assert f"need at least {need:,} tokens" in lines[0]
  rc, _, err = run_cli("--flops", 1e12, "--unique-tokens", need, "--write-config", path)
  assert rc == 0 and path.exists(), err
