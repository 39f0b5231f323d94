"""The ladder's wsd plan: runs grouped by shape, trunk and branch steps by hand counts."""

import json

import jax
import pytest

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.cost import hparams as hparams_lib
from chinchax import train as train_lib
from chinchax import ladder
import chinchax.ladder.grid as grid
import chinchax.ladder.wsd as wsd

A = budget.ModelShape(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab_size=257, seq_len=32)
B = budget.ModelShape(d_model=48, n_layers=2, n_heads=2, d_ff=96, vocab_size=257, seq_len=32)


def _run(shape, steps, per_step=1):
  """A run whose D is exactly ``steps`` steps of ``per_step`` tokens (C = 6·N·D)."""
  n = budget.param_counts(shape).total
  C = 6.0 * n * steps * per_step
  hp = hparams_lib.fixed(n, C, shape.seq_len, hparams_lib.Base(3e-3, 1, 0.95, 50))
  return grid.LadderRun(run_id=f"{shape.d_model}_{steps}", C_budget=C, N_target=float(n),
                        shape=shape, hparams=hp)


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
  c.ladder.schedule = "wsd"
  runs = grid.plan_runs(c.ladder, base.train, spec0.model.vocab_size)
  plans = wsd.plan_shapes(runs, None, c.ladder.cooldown_fraction, base.train.warmup_steps)
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


def test_wsd_ladder_trains_each_shape_once_and_branches_cooldowns(tmp_path, small_corpus,
                                                                   store_root):
  """The tiny ladder on wsd: every run done; each cooldown started from its trunk's branch
  checkpoint and trained only its own decay steps; one LR and batch per shape."""
  c = config_lib.get_ladder_variant("tiny")
  c.workdir = str(tmp_path / "lad")
  c.ladder.update(schedule="wsd", n_budgets=2, c_min=1e9, c_max=3e9, fit=False, validate=False)
  c.train_config.data.update(source="files", paths=str(small_corpus / "*.txt"),
                             store_root=str(store_root), val_fraction=0.1)
  c.train_config.train.peak_flops_per_device = 1e9
  one = jax.devices()[:1]  # one device: the tiny models need no mesh, and compile faster
  ladder.run_ladder(c, devices=one)
  plan = ladder.prepare(c, devices=one, check_data=False)
  rows = plan.table.rows
  assert all(rows[r.run_id]["status"] == "done" for r in plan.runs)
  cooldowns = [(p, e) for p in plan.wsd_plans for e in p.cooldowns]
  assert cooldowns, "the grid has no shape at two budgets"
  for p, e in cooldowns:
    wd = tmp_path / "lad" / "runs" / e.run.run_id
    cfg = json.loads((wd / "config.json").read_text())
    assert cfg["init"]["step"] == e.branch_step
    steps = [json.loads(l)["step"] for l in (wd / "metrics.jsonl").read_text().splitlines()]
    assert min(steps) > e.branch_step and max(steps) == e.steps
    trunk, row = rows[p.trunk.run.run_id], rows[e.run.run_id]
    assert row["hparams"] == trunk["hparams"]
    assert row["D"] == e.steps * row["hparams"]["global_batch_size"] * e.run.shape.seq_len
