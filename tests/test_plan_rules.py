"""The planner's rules: compute-optimal allocation, the shape rule (plan and ladder presets),
batch, LR and warmup (chinchax.planning.allocate, .shapes, .batch).

Independent truth: closed forms computed here, published shapes (Chinchilla
Table A9), and the rules' documented bounds.
"""

import math
import warnings

import pytest

from chinchax.cost import budget
from chinchax.planning import allocate as allocate_lib
from chinchax.planning import batch as batch_lib
from chinchax.planning import shapes as shapes_lib


# ---------------------------------------------------------------- allocation


def test_epoch_allocation_closed_form_independent():
  """Epoch refit (Besiroglu et al. 2024) at C = 5.76e23, computed here from the README's numbers."""
  E, A, B, alpha, beta = 1.817, 482.01, 2085.43, 0.348, 0.366
  C = 5.76e23
  G = (alpha * A / (beta * B)) ** (1 / (alpha + beta))
  n = G * (C / 6) ** (beta / (alpha + beta))
  d = (C / 6) ** (alpha / (alpha + beta)) / G
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    alloc = allocate_lib.allocate(C, "epoch")
  assert alloc.N == pytest.approx(n, rel=1e-9)
  assert alloc.D == pytest.approx(d, rel=1e-9)
  assert alloc.N * alloc.D * 6 == pytest.approx(C, rel=1e-9)
  assert alloc.loss == pytest.approx(E + A / n ** alpha + B / d ** beta, rel=1e-9)
  # Also: the frontier minimises L along C = 6ND (a numerical check of the closed form).
  loss = lambda N: E + A / N ** alpha + B / (C / (6 * N)) ** beta
  assert loss(n) < loss(n * 1.05) and loss(n) < loss(n / 1.05)


def test_allocation_only_law_has_no_loss():
  alloc = allocate_lib.allocate(1.21e20, "chinchilla-approach1")
  assert alloc.loss is None
  assert 15 < alloc.tokens_per_param < 30


def test_fit_range_warning():
  far = allocate_lib.allocate(1e12, "epoch")
  assert far.warnings and "below" in far.warnings[0]
  inside = allocate_lib.allocate(1e20, "epoch")
  assert inside.warnings == ()
  assert allocate_lib.allocate(1e24, "epoch").warnings[0].count("above") == 1


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_allocate_rejects_bad_budget(bad):
  with pytest.raises(ValueError, match="positive"):
    allocate_lib.allocate(bad, "epoch")


def test_allocate_unknown_law():
  with pytest.raises(ValueError, match="unknown law"):
    allocate_lib.allocate(1e20, "no-such-law")


# ---------------------------------------------------------------- shapes


@pytest.mark.parametrize("n_target,vocab,seq_len,accelerator", [
    (1e5, 257, 128, False), (1e6, 257, 128, False), (1e7, 257, 256, False),
    (4e8, 32000, 2048, True), (7e9, 32000, 2048, True), (7e10, 32000, 2048, True)])
def test_propose_shapes_follow_the_rule(n_target, vocab, seq_len, accelerator):
  cands = shapes_lib.propose_shapes(n_target, vocab_size=vocab, seq_len=seq_len,
                                    accelerator=accelerator, k=4)
  assert 1 <= len(cands) <= 4
  q = 128 if accelerator else 16
  keys = set()
  for c in cands:
    s = c.shape
    keys.add((s.d_model, s.n_layers))
    assert s.d_model % q == 0 and s.d_ff % q == 0
    assert s.d_model % s.n_heads == 0 and s.head_dim % 2 == 0
    assert s.head_dim in ((64, 128) if accelerator else (16, 32, 64))
    assert abs(s.d_ff - 8 * s.d_model / 3) <= q / 2
    assert s.n_layers >= 2
    assert c.N == budget.param_counts(s).total  # exact N
    assert c.rel_error == pytest.approx(c.N / n_target - 1)
  assert len(keys) == len(cands)
  best = cands[0]
  tol = 0.05 if n_target >= 1e6 else 0.25  # tiny models: discrete depths
  assert abs(best.rel_error) < tol
  if n_target >= 1e6:
    assert 16 <= best.aspect_ratio <= 256


def test_propose_shapes_400m_matches_chinchilla_family():
  # Chinchilla Table A9 trains 425M as d_model 1280, 18 layers; the rule lands there too.
  best = shapes_lib.propose_shapes(4e8, vocab_size=32000, seq_len=2048, accelerator=True)[0]
  assert (best.shape.d_model, best.shape.n_layers, best.shape.head_dim) == (1280, 18, 128)


def test_propose_shapes_aspect_preference():
  wide = shapes_lib.propose_shapes(1e9, vocab_size=32000, seq_len=2048, accelerator=True,
                                   aspect_ratio=256)[0]
  deep = shapes_lib.propose_shapes(1e9, vocab_size=32000, seq_len=2048, accelerator=True,
                                   aspect_ratio=16)[0]
  assert wide.aspect_ratio > 2 * deep.aspect_ratio


@pytest.mark.parametrize("kw", [dict(n_target=0), dict(n_target=-5), dict(vocab_size=0),
                                dict(seq_len=0), dict(k=0)])
def test_propose_shapes_rejects_bad_input(kw):
  args = dict(n_target=1e6, vocab_size=257, seq_len=128, k=5)
  args.update(kw)
  with pytest.raises(ValueError):
    shapes_lib.propose_shapes(args.pop("n_target"), accelerator=False, **args)


# ---------------------------------------------------------------- batch, LR


def test_batch_and_lr_rules():
  # DeepSeek LLM eq. 1 at C = 1e19: B = 0.292·C^0.3271 ≈ 4.0e5 tokens, eta = 0.3118·C^-0.125.
  C = 1e19
  assert batch_lib.batch_size_tokens(C) == pytest.approx(0.2920 * C ** 0.3271)
  assert batch_lib.peak_learning_rate(C) == pytest.approx(0.3118 * C ** -0.125)
  assert batch_lib.batch_size_tokens(1e26) == batch_lib.BATCH_TOKENS_CAP
  assert batch_lib.peak_learning_rate(1e10) == batch_lib.PEAK_LR_RANGE[1]
  N = 1e8
  D = C / (6 * N)
  bp = batch_lib.plan_batch(D, N=N, seq_len=2048, C=C, batch_multiple=8)
  assert bp.global_batch_size % 8 == 0
  assert bp.tokens == bp.steps * bp.global_batch_size * 2048
  assert abs(bp.tokens / D - 1) < 0.01
  # Batch within a factor √2 of the rule (power-of-two rounding).
  assert 0.7 < bp.tokens_per_step / batch_lib.batch_size_tokens(C) < 1.42
  assert bp.warmup_steps == min(math.ceil(N / bp.tokens_per_step), bp.steps // 10)


def test_plan_batch_keeps_min_steps():
  bp = batch_lib.plan_batch(200 * 128 * 4, N=1e5, seq_len=128, C=1e18)
  assert bp.steps >= batch_lib.MIN_STEPS
  assert bp.global_batch_size >= 1


def test_warmup_rule_is_about_n_tokens_capped_at_ten_percent():
  assert batch_lib.warmup_steps(1e6, 1000, 50_000) == 1000  # ceil(N / tokens_per_step)
  assert batch_lib.warmup_steps(1e6, 1000, 5_000) == 500  # 10% of the steps
  assert budget.max_warmup_steps(99) == 9
  assert budget.steps_for_tokens(2.5e6, 1_000_000) == 2


# ---------------------------------------------------------------- the ladder's preset


# (N*, vocab 257, seq_len 128) → the ladder preset's shape (d_model, n_layers, n_heads, d_ff),
# its N, and the next one when that N is already taken in the budget.
LADDER_PINNED = [
    (3e3, (8, 2, 2, 20), 3568, (12, 2, 2, 32), 6600),
    (2e4, (24, 2, 2, 64), 20112, (28, 2, 2, 76), 26376),
    (1e5, (60, 2, 2, 160), 102120, (56, 2, 2, 148), 89488),
    (1e6, (200, 2, 2, 532), 1010800, (196, 2, 2, 524), 974904),
]


def _hand_count(d_model, n_layers, d_ff, vocab=257):
  """Tied embedding V·d, per layer q, k, v, o (4·d²), SwiGLU (3·d·d_ff), two norms; final norm."""
  return vocab * d_model + n_layers * (4 * d_model ** 2 + 3 * d_model * d_ff + 2 * d_model) + d_model


def _ladder(n, exclude=frozenset()):
  c = shapes_lib.propose_shapes(n, vocab_size=257, seq_len=128,
                                rule=shapes_lib.PRESETS["ladder"], k=1, exclude=exclude)[0]
  s = c.shape
  return (s.d_model, s.n_layers, s.n_heads, s.d_ff), c.N


@pytest.mark.parametrize("n,first,n_first,second,n_second", LADDER_PINNED)
def test_ladder_preset_shapes_are_pinned(n, first, n_first, second, n_second):
  for (d, L, _, f), count in ((first, n_first), (second, n_second)):
    assert _hand_count(d, L, f) == count
  assert _ladder(n) == (first, n_first)
  assert _ladder(n, frozenset({n_first})) == (second, n_second)


def test_presets_share_the_d_ff_rule():
  for rule in shapes_lib.PRESETS.values():
    for d in range(rule.min_width, 40 * rule.quantum, rule.quantum):
      d_ff = shapes_lib.d_ff_for(d, rule=rule)
      assert d_ff % rule.quantum == 0 and abs(d_ff - 8 * d / 3) <= rule.quantum / 2
