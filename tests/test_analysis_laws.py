"""Tests of chinchax.laws.parametric: the parametric law, its closed-form frontier, published laws."""

import json

import numpy as np
import pytest
import scipy.optimize

from chinchax.laws import parametric as laws


def test_loss_formula_and_broadcasting():
  law = laws.ParametricLaw("t", E=1.5, A=400.0, B=800.0, alpha=0.3, beta=0.25)
  assert law.loss(1e9, 2e10) == pytest.approx(1.5 + 400.0 / 1e9 ** 0.3 + 800.0 / 2e10 ** 0.25)
  out = law.loss(np.array([[1e8], [1e9]]), np.array([1e9, 1e10, 1e11]))
  assert out.shape == (2, 3)
  assert np.all(np.diff(out, axis=0) < 0) and np.all(np.diff(out, axis=1) < 0)


@pytest.mark.parametrize("name", ["chinchilla-approach3", "chinchilla-approach3-unrounded", "epoch"])
def test_closed_form_frontier_is_the_numeric_minimum(name):
  """N_opt = G (C/6)^a minimises L(N, C/(6N)) (Chinchilla eq. 4 / App. D.2)."""
  law = laws.get_law(name)
  for C in (1e19, 5.76e23, 1e26):
    res = scipy.optimize.minimize_scalar(lambda x: law.loss(np.exp(x), C / (6 * np.exp(x))),
                                         bounds=(np.log(1e6), np.log(1e15)), method="bounded",
                                         options={"xatol": 1e-10})
    n_opt, d_opt = law.optimal_allocation(C)
    assert n_opt == pytest.approx(np.exp(res.x), rel=1e-4)
    assert 6 * n_opt * d_opt == pytest.approx(C, rel=1e-12)
    assert law.optimal_loss(C) == pytest.approx(res.fun, rel=1e-9)


def test_exponents_and_G():
  law = laws.get_law("chinchilla-approach3-unrounded")
  assert law.a == pytest.approx(0.2849083 / (0.33917084 + 0.2849083))
  assert law.a + law.b == pytest.approx(1.0)
  # Chinchilla Table 2: Approach 3 gives a = 0.46, b = 0.54.
  assert round(law.a, 2) == 0.46 and round(law.b, 2) == 0.54
  # Epoch refit: a = 0.513 (Besiroglu et al. 2024).
  assert laws.get_law("epoch").a == pytest.approx(0.513, abs=0.001)
  G = (0.33917084 * 406.401018 / (0.2849083 * 410.722827)) ** (1 / (0.33917084 + 0.2849083))
  assert law.G == pytest.approx(G)


def test_chinchilla_gopher_budget_projections():
  """Chinchilla: at Gopher's 5.76e23 FLOPs, Approach 3 gives ~40B params, Approach 2 63B."""
  n3, _ = laws.get_law("chinchilla-approach3-unrounded").optimal_allocation(5.76e23)
  assert n3 == pytest.approx(40e9, rel=0.03)
  n2, _ = laws.get_law("chinchilla-approach2").optimal_allocation(5.76e23)
  assert n2 == pytest.approx(63e9, rel=1e-9)


@pytest.mark.parametrize("N,C,D", laws.CHINCHILLA_TABLE3[:4])
def test_approach1_reproduces_table3(N, C, D):
  """Chinchilla Table 3 rows 400M/1B/10B/67B: tokens within 5%, params within 5%."""
  law = laws.get_law("chinchilla-approach1")
  n_opt, d_opt = law.optimal_allocation(C)
  assert law.a == 0.5
  assert d_opt == pytest.approx(D, rel=0.05)
  assert n_opt == pytest.approx(N, rel=0.05)


def test_power_law_allocation_has_no_loss():
  law = laws.get_law("chinchilla-approach1")
  assert law.loss is None and not law.has_loss
  with pytest.raises(NotImplementedError, match="no loss"):
    law.optimal_loss(1e20)
  n, d = law.optimal_allocation(np.array([1e20, 1e22]))
  assert n.shape == (2,) and np.allclose(6 * n * d, [1e20, 1e22])
  assert law.b == pytest.approx(0.5)


def test_published_laws_are_complete():
  for key in ("chinchilla-approach1", "chinchilla-approach2", "chinchilla-approach3",
              "chinchilla-approach3-unrounded", "epoch"):
    assert laws.PUBLISHED_LAWS[key].name == key
    assert laws.PUBLISHED_LAWS[key].source
  r = laws.get_law("chinchilla-approach3")
  assert (r.E, r.A, r.B, r.alpha, r.beta) == (1.69, 406.4, 410.7, 0.34, 0.28)
  e = laws.get_law("epoch")
  assert (e.E, e.A, e.B, e.alpha, e.beta) == (1.817, 482.01, 2085.43, 0.348, 0.366)


def test_get_law_unknown_name_lists_valid_names():
  with pytest.raises(ValueError) as info:
    laws.get_law("chinchila")
  assert "'chinchila'" in str(info.value)
  for key in laws.PUBLISHED_LAWS:
    assert key in str(info.value)


def test_get_law_from_fit_json(tmp_path):
  flat = tmp_path / "law.json"
  flat.write_text(json.dumps({"E": 1.9, "A": 300.0, "B": 900.0, "alpha": 0.31, "beta": 0.29}))
  law = laws.get_law(str(flat))
  assert isinstance(law, laws.ParametricLaw)
  assert (law.E, law.A, law.B, law.alpha, law.beta) == (1.9, 300.0, 900.0, 0.31, 0.29)
  # A report with Approach 3 skipped falls back to its Approach-2 power law.
  rep = tmp_path / "fit.json"
  rep.write_text(json.dumps({"approach3": {"status": "skipped", "reason": "x"},
                             "approach2": {"status": "ok", "k_N": 0.1, "a": 0.49}}))
  law2 = laws.get_law(str(rep))
  assert isinstance(law2, laws.PowerLawAllocation) and law2.a == 0.49
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"foo": 1}))
  with pytest.raises(ValueError, match="no law found"):
    laws.get_law(str(bad))


def test_invalid_parameters_are_rejected():
  with pytest.raises(ValueError, match="alpha"):
    laws.ParametricLaw("x", E=1.0, A=1.0, B=1.0, alpha=-0.1, beta=0.3)
  with pytest.raises(ValueError, match="a must lie"):
    laws.PowerLawAllocation("x", k_N=0.1, a=1.2)
  with pytest.raises(ValueError, match="C must be"):
    laws.get_law("epoch").optimal_allocation(-1.0)
