"""The ladder's wsd plan: runs grouped by shape, trunk and branch steps by hand counts."""

import pytest

from chinchax import budget
from chinchax import config as config_lib
from chinchax import train as train_lib
import chinchax.ladder.grid as grid
import chinchax.ladder.wsd as wsd

A = budget.ModelShape(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab_size=257, seq_len=32)
B = budget.ModelShape(d_model=48, n_layers=2, n_heads=2, d_ff=96, vocab_size=257, seq_len=32)


def _run(shape, steps, per_step=1):
  """A run whose D is exactly ``steps`` steps of ``per_step`` tokens (C = 6·N·D)."""
  n = budget.param_counts(shape).total
  return grid.LadderRun(run_id=f"{shape.d_model}_{steps}", C_budget=6.0 * n * steps * per_step,
                        N_target=float(n), shape=shape)


def test_groups_by_shape_with_hand_counted_branch_steps():
  runs = [_run(A, 250), _run(B, 60), _run(A, 100), _run(A, 400)]
  plans = wsd.plan_shapes(runs, tokens_per_step=1, cooldown_fraction=0.2, warmup_steps=50)
  assert [p.shape for p in plans] == [A, B]
  a, b = plans
  assert (a.trunk.run.run_id, a.trunk.steps, a.trunk.branch_step) == ("32_400", 400, 320)
  assert [(c.run.run_id, c.steps, c.branch_step) for c in a.cooldowns] == [
      ("32_100", 100, 80), ("32_250", 250, 200)]
  assert a.save_steps == (80, 200)
  assert a.warmup_steps == 10  # the cap of the shortest run of the shape: 100 // 10
  assert a.trained_steps == 400 + 20 + 50
  assert (b.trunk.steps, b.trunk.branch_step, b.cooldowns, b.save_steps) == (60, 48, (), ())
  assert b.warmup_steps == 6
  n_a, n_b = (budget.param_counts(s).total for s in (A, B))
  assert wsd.trained_flops(plans, 1) == pytest.approx(6 * n_a * 470 + 6 * n_b * 60, rel=1e-12)
  assert wsd.cosine_flops(runs, 1) == pytest.approx(6 * n_a * 750 + 6 * n_b * 60, rel=1e-12)
  assert wsd.depends_on(plans, runs[0]) == ("32_400", 200)
  assert wsd.depends_on(plans, runs[3]) is None


def test_configs_resolve_to_the_planned_steps_and_schedules(tmp_path):
  """On the tiny ladder every run's wsd config resolves to the planned steps and decay start."""
  c = config_lib.get_ladder_variant("tiny")
  base = c.train_config
  spec0 = train_lib.resolve(base, 1, backend="cpu")
  per_step = base.train.global_batch_size * base.train.seq_len
  runs = grid.plan_runs(c.ladder, spec0.model.vocab_size, base.train.seq_len)
  plans = wsd.plan_shapes(runs, per_step, c.ladder.cooldown_fraction, base.train.warmup_steps)
  assert len(plans) < len(runs)  # shapes recur across budgets
  for r in runs:
    plan, entry = wsd.find(plans, r.run_id)
    cfg = wsd.run_config(base, plans, r, tmp_path)
    spec = train_lib.resolve(cfg, 1, backend="cpu")
    assert (spec.steps, spec.decay_start_step) == (entry.steps, entry.branch_step), r.run_id
    assert spec.warmup_steps == plan.warmup_steps == cfg.train.warmup_steps
    assert cfg.train.schedule == "wsd"
    if entry is plan.trunk:
      assert cfg.train.init_from == "" and cfg.train.save_steps == ",".join(
          map(str, plan.save_steps))
    else:
      assert cfg.train.init_from == str(tmp_path / "runs" / plan.trunk.run.run_id)
      assert cfg.train.init_step == entry.branch_step < plan.trunk.branch_step
      assert entry.branch_step in plan.save_steps


def test_ready_waits_for_the_branch_checkpoint(tmp_path):
  runs = [_run(A, 100), _run(A, 400)]
  plans = wsd.plan_shapes(runs, 1, 0.2, 50)
  assert wsd.ready(plans, runs[1], tmp_path)  # the trunk
  assert not wsd.ready(plans, runs[0], tmp_path)
  (tmp_path / "runs" / "32_400" / "checkpoints" / "80").mkdir(parents=True)
  assert wsd.ready(plans, runs[0], tmp_path)


@pytest.mark.parametrize("knob,value,words", [
    ("schedule", "step", "ladder.schedule='step' is not one of 'cosine', 'wsd'"),
    ("cooldown_fraction", 0.0, "ladder.cooldown_fraction=0.0 must lie in (0, 0.9]"),
    ("cooldown_fraction", 1.0, "ladder.cooldown_fraction=1.0 must lie in (0, 0.9]"),
])
def test_bad_ladder_knobs(knob, value, words):
  c = config_lib.get_ladder_variant("tiny")
  c.ladder[knob] = value
  with pytest.raises(config_lib.ConfigError) as e:
    grid.validate_ladder(c.ladder)
  assert words in str(e.value)
