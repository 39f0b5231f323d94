"""chinchax plan --aot: a plan that does not fit moves to the fastest layout that does.

The compiles are stubbed (a real search of a 78M plan on v5e-4 takes minutes here);
tests/test_aot.py compiles for real. The stub's memory rule: remat=full fits, and more
fsdp is faster.
"""

import importlib.util

import pytest

from chinchax.cost import hardware as hardware_lib
from chinchax.aot import plancheck
from chinchax.aot import search as search_lib
from chinchax.aot import topology
from chinchax.planning import config_file
from chinchax.planning import planner


def _report(config, fits):
  return {"fits": fits,
          "run": {"remat": config.model.remat, "scan_layers": bool(config.model.scan_layers),
                  "mesh": {"data": config.mesh.data, "fsdp": config.mesh.fsdp,
                           "tensor": config.mesh.tensor}},
          "train_step": {"memory": {"total": 10e9 if fits else 90e9}},
          "headroom_fraction": 0.4 if fits else -4.0,
          "roofline": {"step_s": 1.0 / max(1, config.mesh.fsdp), "bound": "hbm"}}


@pytest.fixture
def stub(monkeypatch):
  calls = []

  def compile_cached(config, target, **kw):
    calls.append((config.model.remat, config.mesh.data, config.mesh.fsdp, config.mesh.tensor))
    return _report(config, config.model.remat == "full"), False

  monkeypatch.setattr(search_lib, "compile_cached", compile_cached)
  monkeypatch.setattr(topology, "check_available", lambda t: None)
  return calls


def _plan():
  return planner.plan_flops(1e18, "epoch", hardware=hardware_lib.parse_hardware("v5e-4"))


def test_a_plan_that_does_not_fit_moves_and_writes_its_layout(stub, tmp_path):
  plan = _plan()
  result = plancheck.check_plan(plan, cache_dir=None)
  assert result["moved"] and result["fits"]
  assert plan.layout == {"remat": "full", "scan_layers": True,
                         "mesh": {"data": 1, "fsdp": 4, "tensor": 1}, "microbatches": 1}
  assert any("does not fit v5e-4; moved to remat=full mesh=1×4×1" in w for w in plan.warnings)
  assert plan.to_dict()["layout"] == plan.layout
  path = config_file.write_config(plan, tmp_path / "planned.py", n_devices=4)
  spec = importlib.util.spec_from_file_location("planned", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  assert (c.model.remat, c.model.scan_layers) == ("full", True)
  assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor) == (1, 4, 1)
  assert c.train.microbatches == 1
  assert (c.model.d_model, c.train.global_batch_size) == (plan.chosen.shape.d_model,
                                                          plan.batch.global_batch_size)


def test_a_plan_that_fits_stays_as_planned(stub, monkeypatch):
  monkeypatch.setattr(search_lib, "compile_cached",
                      lambda config, target, **kw: (_report(config, True), False))
  plan = _plan()
  result = plancheck.check_plan(plan, cache_dir=None)
  assert result["fits"] and not result["moved"] and plan.layout is None
  assert "fits" in plancheck.render_check(result)


def test_no_layout_fits_is_said(stub, monkeypatch):
  monkeypatch.setattr(search_lib, "compile_cached",
                      lambda config, target, **kw: (_report(config, False), False))
  plan = _plan()
  result = plancheck.check_plan(plan, cache_dir=None)
  assert not result["fits"] and plan.layout is None
  assert any("does not fit v5e-4 in any layout" in w for w in plan.warnings)


def test_aot_needs_an_accelerator_target():
  plan = planner.plan_flops(1e18, "epoch")
  with pytest.raises(topology.AotError, match="--hardware"):
    plancheck.check_plan(plan)
  plan = planner.plan_flops(1e12, "epoch", hardware=hardware_lib.parse_hardware("cpu"))
  with pytest.raises(topology.AotError, match="chinchax train"):
    plancheck.check_plan(plan)


def test_an_unwritable_config_path_is_said_before_compiling(stub, tmp_path):
  from chinchax.cli import plan as plan_cli
  from chinchax.planning.errors import PlanError
  (tmp_path / "a_file").write_text("")
  with pytest.raises(PlanError, match="is not a directory"):
    plan_cli.main(["--flops", "1e18", "--hardware", "v5e-4", "--aot",
                   "--write-config", str(tmp_path / "a_file" / "x.py")])
  assert stub == []  # nothing was compiled
