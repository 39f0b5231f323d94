"""chinchax plan --kv-heads-ratio: grouped-query shapes, counted and written as they train."""

import contextlib
import importlib.util
import io
import json

from chinchax.cost import budget
from chinchax import cli
from chinchax.planning import planner
from chinchax.planning import shapes


def _run(*argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = cli.main(["plan", *[str(a) for a in argv]])
  return rc, out.getvalue(), err.getvalue()


def test_kv_heads_split_the_query_heads_evenly():
  assert [shapes.kv_heads_for(32, r) for r in (1, 2, 4, 8, 32, 64)] == [32, 16, 8, 4, 1, 1]
  assert shapes.kv_heads_for(12, 5) == 2  # the largest divisor of 12 not above 12 / 5
  assert shapes.groups_evenly(20, 4) and not shapes.groups_evenly(19, 4)
  assert shapes.groups_evenly(2, 4)  # the ratio reaches n_heads: multi-query


def test_grouped_plan_counts_the_smaller_kv_projections_by_hand():
  mha = planner.plan_flops(1e21, "chinchilla-approach3", vocab_size=32000)
  gqa = planner.plan_flops(1e21, "chinchilla-approach3", vocab_size=32000, kv_heads_ratio=4)
  s = gqa.chosen.shape
  assert s.n_heads % 4 == 0 and s.kv_heads * 4 == s.n_heads and mha.chosen.shape.kv_heads == \
      mha.chosen.shape.n_heads
  # Hand count: per layer q and o are d·d each, k and v d·(n_kv_heads·head_dim) each, the
  # SwiGLU MLP 3·d·d_ff, two RMSNorm scales d; tied embeddings V·d and a final norm d.
  d, hd = s.d_model, s.d_model // s.n_heads
  per_layer = 2 * d * d + 2 * d * s.kv_heads * hd + 3 * d * s.d_ff + 2 * d
  assert gqa.N == s.n_layers * per_layer + 32000 * d + d == budget.param_counts(s).total
  # Both plans aim at the same N*; the grouped one gets there with more width or depth.
  assert abs(gqa.N / gqa.allocation.N - 1) < 0.05 and abs(mha.N / mha.allocation.N - 1) < 0.05
  dense_twin = budget.param_counts(budget.ModelShape(**{**s.arch(), "n_kv_heads": 0},
                                                     seq_len=s.seq_len)).total
  assert dense_twin > gqa.N


def test_written_config_trains_the_grouped_shape(tmp_path):
  target = tmp_path / "planned.py"
  rc, out, err = _run("--flops", 1e12, "--hardware", "cpu", "--kv-heads-ratio", 2,
                      "--write-config", target)
  assert rc == 0, err
  spec = importlib.util.spec_from_file_location("planned", target)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  m = mod.get_config().model
  assert m.n_kv_heads * 2 == m.n_heads
  assert f"n_kv_heads {m.n_kv_heads}" in out
  rc, out, _ = _run("--flops", 1e12, "--hardware", "cpu", "--kv-heads-ratio", 2, "--json")
  assert json.loads(out)["shape"]["n_kv_heads"] == m.n_kv_heads


def test_bad_ratio_is_one_line(tmp_path):
  target = tmp_path / "planned.py"
  rc, out, err = _run("--flops", 1e20, "--kv-heads-ratio", 0, "--write-config", target)
  assert rc == 2 and out == "" and not target.exists()
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1 and "--kv-heads-ratio must be an integer >= 1" in lines[0], lines
