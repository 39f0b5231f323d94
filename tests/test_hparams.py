"""Per-size hyperparameter rules: published constants, rounding, clipping, min-steps, errors."""

from __future__ import annotations

import math

import pytest

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.cost import hparams
from chinchax import train as train_lib

BASE = hparams.Base(peak_lr=3e-3, global_batch_size=16, b2=0.95, warmup_steps=50)


def _ladder_train_config(seq_len=64):
  c = config_lib.base_ladder_config().train_config
  c.train.seq_len = seq_len
  return c


# DeepSeek LLM (arXiv 2401.02954) Sec. 3.1 eq. 1, worked by hand:
#   C = 1e20: eta = 0.3118 * 10^(-20/8)            = 0.3118 * 3.16228e-3 = 9.8600e-4
#             B   = 0.2920 * 10^(20*0.3271 = 6.542) = 0.2920 * 3.48337e6  = 1.01714e6 tokens
#   C = 1e17: eta = 0.3118 * 10^(-17/8 = -2.125)    = 0.3118 * 7.49894e-3 = 2.33817e-3
#             B   = 0.2920 * 10^(5.5607)            = 0.2920 * 3.63662e5  = 1.06189e5 tokens
@pytest.mark.parametrize("C, lr, b_tokens", [(1e20, 9.8600e-4, 1.01714e6),
                                             (1e17, 2.33817e-3, 1.06189e5)])
def test_deepseek_reproduces_eq1(C, lr, b_tokens):
  N = 1e9  # D = C / 6N is long enough for any batch at these budgets
  hp = hparams.hparams_for_run("deepseek", N, C, 4096, BASE, min_steps=20,
                               max_global_batch_size=10**6)
  assert hp.peak_lr == pytest.approx(lr, rel=1e-4)
  assert hp.batch_tokens == pytest.approx(b_tokens, rel=1e-4)
  assert hp.global_batch_size == round(b_tokens / 4096)  # 248 and 26 sequences of 4096
  assert hp.batch_clamp == ""
  assert hp.b2 == BASE.b2
  assert "2401.02954" in hp.sources["peak_lr"]
  # eq. 1 was fitted on 1e17-2e19 FLOPs: 1e20 lies outside it, 1e17 inside.
  assert ("extrapolated" in hp.sources["peak_lr"]) == (C > 2e19)


def test_deepseek_below_its_fitted_range_says_so():
  # C = 3e10, N = 8e4: D = 62,500 tokens; B = 0.2920 * 10^(10.4771*0.3271) = 780.6 tokens
  # -> round(780.6 / 64) = 12 sequences, 81 steps; eta = 0.3118 * 10^(-1.30964) = 0.3118 * 0.049019 = 0.015284.
  hp = hparams.hparams_for_run("deepseek", 8e4, 3e10, 64, BASE, min_steps=20)
  assert hp.peak_lr == pytest.approx(0.015284, rel=1e-4)
  assert (hp.global_batch_size, hp.steps) == (12, 81)
  assert hp.warmup_steps == 8  # base 50, capped at 81 // 10
  assert "extrapolated" in hp.sources["global_batch_size"]


def test_fixed_returns_the_base_values():
  hp = hparams.hparams_for_run("fixed", 2e4, 3e11, 64, BASE, min_steps=20)
  assert (hp.peak_lr, hp.global_batch_size, hp.b2, hp.warmup_steps) == (3e-3, 16, 0.95, 50)
  assert hp.steps == 2441  # round(3e11 / 1.2e5 / 1024) = round(2441.4)
  c = _ladder_train_config()
  out, hp2 = hparams.apply_to_config("fixed", c, 2e4, 3e11, min_steps=20)
  assert out.train.to_dict() == c.train.to_dict() and out is not c
  assert hp2 == hp


def test_batch_rounds_to_whole_sequences():
  kw = dict(tokens=1e9, seq_len=64, min_steps=20)
  assert hparams.batch_for_tokens(6431, **kw) == (100, "")  # 100.48 sequences
  assert hparams.batch_for_tokens(6433, **kw) == (101, "")  # 100.52 sequences


def test_batch_is_clipped_to_one_and_to_the_max():
  kw = dict(tokens=1e9, seq_len=64, min_steps=20)
  assert hparams.batch_for_tokens(10, **kw) == (1, "min")
  assert hparams.batch_for_tokens(1e6, **kw) == (hparams.MAX_GLOBAL_BATCH_SIZE, "max")
  assert hparams.batch_for_tokens(1e6, max_global_batch_size=300, **kw) == (300, "max")


def test_batch_shrinks_to_give_min_steps():
  # 100 sequences of 64 on 64,000 tokens is 10 steps; 20 steps need floor(64000 / 1280) = 50.
  gbs, clamp = hparams.batch_for_tokens(6400, tokens=64_000, seq_len=64, min_steps=20)
  assert (gbs, clamp) == (50, "min_steps")
  assert budget.steps_for_tokens(64_000, gbs * 64) == 20
  # Too short even at one sequence: 640 tokens are 10 steps of 64.
  assert hparams.batch_for_tokens(6400, tokens=640, seq_len=64, min_steps=20) == (1, "min_steps")


def test_too_short_run_is_flagged_and_refused():
  hp = hparams.hparams_for_run("deepseek", 1e4, 6e4 * 64 * 5, 64, BASE, min_steps=20)  # D = 320
  assert hp.short and hp.global_batch_size == 1 and hp.steps == 5
  with pytest.raises(config_lib.ConfigError, match=r"only 5 step\(s\).*ladder.min_steps=20"):
    hparams.apply_to_config("deepseek", _ladder_train_config(), 1e4, 6e4 * 64 * 5, min_steps=20)


def test_porian_warmup_is_n_tokens_capped_at_ten_percent():
  # N = 2e4, C = 3e11: D = 2.5e6 tokens, 16 x 64 = 1024 tokens/step -> 2441 steps;
  # warmup ceil(2e4 / 1024) = 20 steps (< 244); batch unchanged -> b2 unchanged.
  hp = hparams.hparams_for_run("porian", 2e4, 3e11, 64, BASE, min_steps=20)
  assert (hp.peak_lr, hp.global_batch_size, hp.b2) == (3e-3, 16, 0.95)
  assert (hp.steps, hp.warmup_steps) == (2441, 20)
  # N = 8e4, C = 3e10: D = 62,500; 100 steps need floor(62500 / 6400) = 9 sequences
  # (576 tokens/step, round(108.5) = 109 steps); b2 = 1 - 0.05 * 576/1024 = 0.971875;
  # warmup ceil(8e4 / 576) = 139 steps, capped at 109 // 10 = 10.
  hp = hparams.hparams_for_run("porian", 8e4, 3e10, 64, BASE, min_steps=100)
  assert (hp.global_batch_size, hp.batch_clamp, hp.steps) == (9, "min_steps", 109)
  assert hp.b2 == pytest.approx(0.971875)
  assert hp.warmup_steps == 10


def test_porian_power_laws_when_given_a_fit():
  fit = hparams.PowerLawFit(lr_coef=1.0, lr_exponent=-0.5, batch_coef=64.0, batch_exponent=0.5)
  # N = 1e4: peak_lr = 1e4^-0.5 = 0.01; batch = 64 * 100 = 6400 tokens = 100 sequences of 64;
  # b2 = 1 - 0.05 * 6400/1024 = 0.6875 -> clipped up to the base's 0.95.
  # N = 4e4: peak_lr = 0.005; batch = 12,800 tokens = 200 sequences.
  hp = hparams.porian(1e4, 1e13, 64, BASE, min_steps=20, fit=fit)
  assert (hp.peak_lr, hp.global_batch_size, hp.b2) == (pytest.approx(0.01), 100, 0.95)
  hp = hparams.porian(4e4, 1e13, 64, BASE, min_steps=20, fit=fit)
  assert (hp.peak_lr, hp.global_batch_size) == (pytest.approx(0.005), 200)


def test_b2_for_batch_is_larger_for_smaller_batches_within_bounds():
  assert hparams.b2_for_batch(1024, 1024, 0.95) == 0.95
  assert hparams.b2_for_batch(256, 1024, 0.95) == pytest.approx(0.9875)
  assert hparams.b2_for_batch(1, 1024, 0.95) == hparams.B2_MAX
  assert hparams.b2_for_batch(4096, 1024, 0.95) == 0.95


def test_unknown_rule_is_one_config_error():
  with pytest.raises(config_lib.ConfigError, match=r"ladder.hparams='mup'.*fixed, deepseek, porian"):
    hparams.hparams_for_run("mup", 2e4, 3e11, 64, BASE)
  with pytest.raises(config_lib.ConfigError, match="known: fixed, deepseek, porian"):
    hparams.apply_to_config("Fixed", _ladder_train_config(), 2e4, 3e11)
  hparams.check_rule(config_lib.base_ladder_config().ladder.hparams)


@pytest.mark.parametrize("rule", list(hparams.RULES))
def test_the_trainer_sees_what_the_rule_says(rule):
  """An independent check: chinchax.train.resolve of the new config gives the rule's steps,
  batch and warmup (the trainer's own 10% cap leaves a rule's warmup alone)."""
  c = _ladder_train_config()
  C = 3e10
  c.budget.update(mode="flops", flops=C, n_kind="total")
  N = train_lib.resolve(c, 1, backend="cpu").n_params
  out, hp = hparams.apply_to_config(rule, c, N, C, min_steps=20)
  spec = train_lib.resolve(out, 1, backend="cpu")
  assert spec.global_batch_size == hp.global_batch_size
  assert spec.steps == hp.steps >= 20
  assert spec.warmup_steps == min(hp.warmup_steps, budget.max_warmup_steps(spec.steps))
  if rule != "fixed":
    assert spec.warmup_steps == hp.warmup_steps
  assert out.train.peak_lr == hp.peak_lr and out.train.b2 == hp.b2


def test_every_rule_keeps_warmup_under_the_cap_and_batch_in_range():
  for rule in ("deepseek", "porian"):
    for N in (5e3, 2e4, 8e4):
      for C in (3e10, 3e11, 3e12):
        hp = hparams.hparams_for_run(rule, N, C, 64, BASE, min_steps=20)
        assert 1 <= hp.global_batch_size <= hparams.MAX_GLOBAL_BATCH_SIZE
        assert hp.warmup_steps <= budget.max_warmup_steps(hp.steps)
        assert hp.steps >= 20 and math.isfinite(hp.peak_lr) and 0 < hp.b2 < 1
