"""L(N, D) vs L(N, D, aspect): the leave-one-out choice on runs from a known law, and its use."""

import numpy as np
import pytest

from analysis.isotime import aspect_law
from chinchax.laws import parametric as laws
from chinchax.planning import allocate

PLAIN = laws.ParametricLaw(name="truth", E=1.25, A=160.0, B=2000.0, alpha=0.62, beta=0.66)


def _runs(seed: int, P: float, noise: float = 0.003):
  """27 runs like an IsoTime grid: 3 N levels × depths 1, 2, 4 × 3 token counts."""
  rng = np.random.default_rng(seed)
  N, D, aspect = [], [], []
  for n in (1e4, 3e4, 1e5):
    for depth in (1, 2, 4):
      d_model = np.sqrt(n / (12 * depth))
      for d in (3e5, 1e6, 3e6):
        N.append(n * rng.uniform(0.9, 1.1))
        D.append(d * rng.uniform(0.8, 1.25))
        aspect.append(d_model / depth)
  N, D, aspect = map(np.asarray, (N, D, aspect))
  truth = laws.AspectLaw(name="t", E=PLAIN.E, A=PLAIN.A, B=PLAIN.B, alpha=PLAIN.alpha,
                         beta=PLAIN.beta, P=P, kappa=2.0)
  loss = truth.loss_shape(N, D, aspect) * np.exp(rng.normal(0, noise, len(N)))
  return N, D, aspect, loss


def test_a_shape_dependent_truth_chooses_the_aspect_law():
  N, D, aspect, loss = _runs(0, P=0.08)
  law, info = aspect_law.choose_law(N, D, aspect, loss, PLAIN)
  assert info["form"] == "aspect" and isinstance(law, laws.AspectLaw)
  f = info["forms"]
  assert f["aspect"]["loo_median_abs_rel_error"] < f["plain"]["loo_median_abs_rel_error"]
  # the fitted term matches the truth's over the runs' aspect ratios (within 0.02 nats)
  truth_term = 0.08 * (aspect / 64.0) ** 2.0
  assert np.max(np.abs(law.aspect_term(aspect) - truth_term)) < 0.02


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_shape_free_truth_invents_no_shape_effect(seed):
  N, D, aspect, loss = _runs(seed, P=0.0)
  law, info = aspect_law.choose_law(N, D, aspect, loss, PLAIN)
  if info["form"] == "aspect":  # kept only if it earns it; then it must be negligible
    assert np.max(law.aspect_term(aspect)) < 0.01  # under 2× the runs' 0.3% noise (~0.006 nats)
  else:
    assert not isinstance(law, laws.AspectLaw)
  assert law.loss(1e5, 3e6) == pytest.approx(PLAIN.loss(1e5, 3e6), rel=0.01)


def test_aspect_term_round_trips_and_prices_shapes_in_planning():
  d = {"E": 1.2, "A": 100.0, "B": 1000.0, "alpha": 0.5, "beta": 0.5,
       "aspect_term": {"P": 0.05, "kappa": 2.0, "aspect0": 64.0}}
  law = laws.law_from_dict(d)
  assert isinstance(law, laws.AspectLaw)
  base = 1.2 + 100.0 / 1e4 ** 0.5 + 1000.0 / 1e6 ** 0.5
  assert law.loss(1e4, 1e6) == pytest.approx(base)
  assert law.loss_shape(1e4, 1e6, 128.0) == pytest.approx(base + 0.05 * 4.0)
  assert allocate.law_loss(law, 1e4, 1e6, aspect=128.0) == pytest.approx(base + 0.2)
  assert allocate.law_loss(law, 1e4, 1e6) == pytest.approx(base)
  with pytest.raises(ValueError, match="P >= 0"):
    laws.law_from_dict({**d, "aspect_term": {"P": -1.0, "kappa": 2.0}})
