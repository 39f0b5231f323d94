"""Microbatches and the chunked loss in the memory model, the planner and the AOT search.

Hand counts for the memory model's M and chunk terms; the planner's smallest fitting M
checked against the memory model at every smaller M; the three plans of issue-sized
budgets end without a memory warning; a plan that fits nowhere names the device count
that would; the compile search carries M (compiles stubbed; tests/test_aot.py compiles).
"""

import dataclasses
import importlib.util
import math

import pytest

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.cost import hardware as hardware_lib
from chinchax.cost import work
from chinchax.aot import hlo
from chinchax.aot import program as program_lib
from chinchax.aot import report as report_lib
from chinchax.aot import search as search_lib
from chinchax.aot import topology
from chinchax.cli import plan as plan_cli
from chinchax.planning import config_file
from chinchax.planning import layout
from chinchax.planning import planner

SHAPE = budget.ModelShape(vocab_size=128256, d_model=256, n_layers=2, n_heads=4, d_ff=512,
                          seq_len=1024, tie_embeddings=False)
BF16_FLASH = work.ExecutionProfile.from_names("bfloat16", "cudnn")


def test_memory_model_microbatch_terms_by_hand():
  n = budget.param_counts(SHAPE).total
  mesh = {"data": 2, "fsdp": 4, "tensor": 1}
  one = work.mesh_memory_per_device(SHAPE, 64, mesh=mesh, profile=BF16_FLASH)
  four = work.mesh_memory_per_device(SHAPE, 64, mesh=mesh, profile=BF16_FLASH, microbatches=4)
  rows = 64 / 8 / 4  # one microbatch's sequences per device
  layer = 2 * (4 * 256 + 4 * 256 + 3 * 512)  # bf16 forward tensors per token, no probabilities
  assert four.activations == rows * 1024 * 2 * layer
  # the bf16 logits and, the head being FSDP-sharded, their bf16 gradient: 4 bytes each
  assert four.working == max(rows * 1024 * 4 * 128256, rows * 1024 * layer)
  assert four.accumulation == 4 * n / 4 and one.accumulation == 0  # f32, over fsdp
  assert (four.state, four.gathered_weights) == (one.state, one.gathered_weights) == (
      16 * n / 4, 2 * n)  # remat none: every gathered layer stays live
  assert four.total == pytest.approx(one.state + one.gathered_weights + one.activations / 4
                                     + one.working / 4 + 4 * n / 4)
  with pytest.raises(work.StepTimeError, match="microbatches"):
    work.mesh_memory_per_device(SHAPE, 64, mesh=mesh, microbatches=0)


def test_memory_model_loss_chunk_by_hand():
  mesh = {"data": 1, "fsdp": 8, "tensor": 2}
  full = work.mesh_memory_per_device(SHAPE, 16, mesh=mesh, remat="full", profile=BF16_FLASH)
  chunked = work.mesh_memory_per_device(SHAPE, 16, mesh=mesh, remat="full", profile=BF16_FLASH,
                                        loss_chunk=128)
  rows = 16 / 8
  assert full.working == rows * 1024 * 4 * 128256 / 2  # logits + bf16 gradient, V over tensor
  data = work.mesh_memory_per_device(SHAPE, 16, mesh={"data": 8, "fsdp": 1, "tensor": 2},
                                     remat="full", profile=BF16_FLASH)
  assert data.working == rows * 1024 * 2 * 128256 / 2  # no FSDP: the bf16 logits alone
  layer = 2 * (4 * 256 + (4 * 256 + 3 * 512) / 2)
  # a recomputed layer's forward tensors (its gradients pass through: no probabilities here)
  assert chunked.working == max(rows * 128 * 4 * 128256 / 2, rows * 1024 * layer)
  assert chunked.activations == full.activations and chunked.state == full.state
  gpu = work.mesh_memory_per_device(SHAPE, 16, mesh=mesh, remat="full", loss_chunk=128,
                                    profile=work.ExecutionProfile.for_kind("gpu"))
  assert gpu.working == rows * 128 * 4 * 128256 / 2  # GPU as TPU: logits + bf16 gradient
  # A chunk longer than the sequence is the whole sequence.
  assert work.mesh_memory_per_device(SHAPE, 16, mesh=mesh, remat="full", profile=BF16_FLASH,
                                     loss_chunk=4096).working == full.working
  assert work.resolve_loss_chunk("auto", "gpu", 1024, 128256) == 512
  assert work.resolve_loss_chunk("auto", "cpu", 1024, 128256) == 0
  assert work.resolve_loss_chunk("auto", "tpu", 256, 128256) == 256
  assert work.resolve_loss_chunk("auto", "tpu", 1024, 257) == 0
  assert work.resolve_loss_chunk(4096, "tpu", 1024, 257) == 1024


def test_step_bytes_and_recompute_with_microbatches():
  n = budget.param_counts(SHAPE).total
  b1 = work.bytes_per_step(SHAPE, 64, n_devices=8, profile=BF16_FLASH)
  b8 = work.bytes_per_step(SHAPE, 64, n_devices=8, profile=BF16_FLASH, microbatches=8)
  assert work.param_bytes_per_step(1) == work.PARAM_BYTES_PER_STEP == 40
  assert b8 - b1 == (16 * 8 + 24 - 40) * n  # the weights read by every microbatch
  per_token = budget.executed_matmul_flops_per_token(SHAPE, causal_skip=True)
  assert work.recompute_factor(SHAPE, causal_skip=True, loss_chunk=512) == pytest.approx(
      1 + 2 * 256 * 128256 / per_token)
  assert work.recompute_factor(SHAPE, "full") == pytest.approx(4 / 3)


def _hw(spec):
  return hardware_lib.parse_hardware(spec)


def test_planner_picks_the_smallest_fitting_microbatches_and_writes_them(tmp_path):
  plan = planner.plan_flops(1e21, hardware=_hw("h100x8"))
  fit, shape, B = plan.fit, plan.chosen.shape, plan.batch.global_batch_size
  assert B == 1024 and fit.fits and fit.microbatches > 1
  assert B == fit.microbatches * fit.microbatch_size
  prof = work.ExecutionProfile.for_kind("gpu")
  cap = 0.85 * 80e9  # the H100's 80 GB less the 15% headroom
  mesh = {"data": 1, "fsdp": 8, "tensor": 1}
  ok = [m for m in range(1, B + 1) if B % m == 0 and (B // m) % 8 == 0]
  mem = {m: work.mesh_memory_per_device(shape, B, mesh=mesh, remat=fit.remat, profile=prof,
                                        microbatches=m).total for m in ok}
  assert mem[fit.microbatches] <= cap
  assert all(mem[m] > cap for m in ok if m < fit.microbatches)
  assert fit.remat == "none"  # accumulation costs no FLOPs: no recompute while some M fits
  path = config_file.write_config(plan, tmp_path / "planned.py", n_devices=8)
  spec = importlib.util.spec_from_file_location("planned", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  assert (c.train.microbatches, c.train.global_batch_size) == (fit.microbatches, B)
  assert (c.model.remat, c.mesh.data, c.mesh.fsdp) == ("none", 1, -1)
  config_lib.validate(c, n_devices=8)


def test_remat_only_when_no_microbatching_fits():
  # One 2048-token sequence of this 5.4B shape without remat needs more than a v5e's 16 GB
  # beside its states (its bf16 weights alone are 10.9 GB), so the planner must recompute;
  # with remat it fits at some M.
  shape = budget.ModelShape(vocab_size=257, d_model=3072, n_layers=48, n_heads=24, d_ff=8192,
                            seq_len=2048)
  hw = _hw("v5e-256")
  fit = layout.choose_layout(shape, 512, hw)
  m_none, fits_none = layout.smallest_microbatches(
      shape, 512, {"data": 1, "fsdp": 256, "tensor": 1}, remat="none", loss_chunk=0,
      profile=work.ExecutionProfile.for_kind("tpu"), capacity=hw.accelerator.memory_bytes)
  assert not fits_none and m_none == 2  # 512 rows over 256 devices: M = 1 or 2
  assert fit.fits and fit.remat in ("dots", "full")


@pytest.mark.parametrize("argv", [["--flops", "1e21", "--hardware", "h100x8"],
                                  ["--dollars", "5000", "--hardware", "h100x8"],
                                  ["--hours", "48", "--hardware", "v5p-128"]])
def test_the_issue_plans_end_without_a_memory_warning(argv, capsys):
  assert plan_cli.main(argv) == 0
  out = capsys.readouterr().out
  assert "memory         global batch G" in out and "fits with 15% kept free" in out
  assert "exceeds" not in out and "nothing fits" not in out
  plan = plan_cli.run(plan_cli._parser().parse_args(argv))
  assert plan.fit.fits and not any("memory" in w for w in plan.warnings)
  assert plan.fit.memory.total <= 0.85 * plan.hardware.accelerator.memory_bytes


def test_a_plan_that_fits_nowhere_names_the_device_count():
  hw = _hw("h100")
  plan = planner.plan_flops(1e23, hardware=hw)  # ~1e10 parameters on one 80 GB GPU
  assert not plan.fit.fits
  warning = next(w for w in plan.warnings if "nothing fits" in w)
  n = int(warning.split("the smallest device count that would fit is ")[1].split()[0])
  shape, B = plan.chosen.shape, plan.batch.global_batch_size
  prof = work.ExecutionProfile.for_kind("gpu")

  def total(k):  # remat full, one sequence per device per microbatch, FSDP over k
    m = 2 if B > k else 1
    return work.mesh_memory_per_device(shape, k * m, mesh={"data": 1, "fsdp": k, "tensor": 1},
                                       remat="full", profile=prof, microbatches=m).total

  assert total(n) <= 0.85 * 80e9 < total(n - 1)
  assert 16 * plan.N / 80e9 > 1  # the model states alone exceed one device


def test_the_step_time_of_a_plan_counts_its_microbatches():
  hw = _hw("h100x8")
  plan = planner.plan_flops(1e21, hardware=hw)
  model = planner.step_time_lib.RooflineStepTime(hw)
  shape, B, M = plan.chosen.shape, plan.batch.global_batch_size, plan.fit.microbatches
  assert plan.step_time_s == pytest.approx(model.predict(shape, B, microbatches=M))
  # A bandwidth-bound step (a small model on many chips) gets slower with every microbatch.
  tiny = budget.ModelShape(vocab_size=257, d_model=512, n_layers=4, n_heads=4, d_ff=1536,
                           seq_len=128)
  roofline = planner.step_time_lib.RooflineStepTime(_hw("v5e-256"))
  assert roofline.predict(tiny, 256, microbatches=4) > roofline.predict(tiny, 256)


# ---------------------------------------------------------------- compile search


def _c125m():
  c = config_lib.get_variant("125m")
  c.train.update(global_batch_size=512, seq_len=1024)
  c.mesh.update(data=-1, fsdp=1, tensor=1)
  # XLA attention keeps a bf16 [B, H, T, T] buffer per layer, so remat=none needs microbatches
  # at this batch (32 sequences per device)
  c.model.attention = "xla"
  return c


def test_search_variants_carry_the_smallest_analytic_microbatches():
  target = topology.parse_target("v5e-16")
  vs = search_lib.variants(_c125m(), target)
  assert vs[0].train.microbatches == 1  # the given layout first, as given
  none = [v for v in vs[1:] if v.model.remat == "none"]
  assert none and all(v.train.microbatches > 1 for v in none)
  for v in none:
    spec = program_lib.check_config(v, target)
    prof = report_lib.profile_of(spec.model)
    choices = layout.microbatch_choices(512, spec.mesh["data"] * spec.mesh["fsdp"])
    mem = {m: work.mesh_memory_per_device(spec.shape(), 512, mesh=spec.mesh, profile=prof,
                                          microbatches=m).total for m in choices}
    cap = 0.85 * target.memory_per_device
    assert mem[v.train.microbatches] <= cap
    assert all(mem[m] > cap for m in choices if m < v.train.microbatches)


def test_search_tries_the_next_microbatches_and_prints_them(monkeypatch):
  target = topology.parse_target("v5e-16")
  compiled = []

  def fake(config, target, **kw):  # XLA needs twice the analytic M to fit
    c = config.copy_and_resolve_references()
    c.train.microbatches = 1
    _, m_ana = search_lib.microbatch_options(c, target)
    fits = config.train.microbatches >= 2 * m_ana
    compiled.append(config.train.microbatches)
    return ({"fits": fits, "run": {"mesh": dict(config.mesh)},
             "train_step": {"memory": {"total": 1e9}}, "headroom_fraction": 0.5 if fits else -1,
             "roofline": {"step_s": float(config.train.microbatches), "bound": "compute"}}, False)

  monkeypatch.setattr(search_lib, "compile_cached", fake)
  monkeypatch.setattr(topology, "check_available", lambda t: None)
  rows = search_lib.search(_c125m(), target, cache_dir=None)
  n_variants = len(search_lib.variants(_c125m(), target))
  assert len(rows) > n_variants  # the retries at the next M
  best = rows[0]
  assert best["fits"] and best["microbatches"] == min(r["microbatches"] for r in rows
                                                      if r["fits"])
  text = search_lib.render(rows, target)
  assert f"--config.train.microbatches={best['microbatches']}" in text


def test_report_counts_the_compiled_microbatches():
  target = topology.parse_target("v5p-8")
  c = config_lib.get_variant("tiny")
  c.model.update(d_model=256, n_heads=2, d_ff=512)
  c.mesh.update(data=-1, fsdp=1, tensor=1)
  c.train.microbatches = 2
  spec = program_lib.check_config(c, target)
  mem = {"argument": 0.0, "output": 0.0, "alias": 0.0, "temp": 1e9, "generated_code": 0.0,
         "total": 1e9}
  coll = hlo.CollectiveSummary({k: 0 for k in hlo.KINDS}, {k: 0.0 for k in hlo.KINDS},
                               {k: 0.0 for k in hlo.KINDS})
  train = program_lib.ProgramResult("train_step", 1.0, True, mem, 1e12, 1e9, coll)
  run = program_lib.CompiledRun(target, spec, train, None, {}, microbatches=2, loss_chunk=0)
  rep = report_lib.summarize(run)
  assert (rep["run"]["microbatches"], rep["run"]["microbatch_size"]) == (
      2, spec.global_batch_size // 2)
  est = work.mesh_memory_per_device(spec.shape(), spec.global_batch_size, mesh=spec.mesh,
                                    profile=report_lib.profile_of(spec.model), microbatches=2)
  assert rep["analytic"]["memory"]["total"] == est.total
  # XLA counts the microbatch loop's body once: its bytes (1e9 here) scaled by the analytic
  # step over the analytic bytes of one microbatch through what the body holds
  shape, b, n = spec.shape(), spec.global_batch_size, target.n_devices
  counted = dataclasses.replace(shape, n_layers=1) if spec.model.scan_layers else shape
  prof = report_lib.profile_of(spec.model)
  want = 1e9 * (work.bytes_per_step(shape, b, n_devices=n, profile=prof, microbatches=2)
                / work.bytes_per_step(counted, b // 2, n_devices=n, profile=prof))
  acc = target.accelerator
  assert rep["roofline"]["hbm_s"] * acc.hbm_bandwidth / report_lib.devices_per_chip(run) == \
      pytest.approx(want)
  assert "one microbatch of 2" in rep["roofline"]["hbm_bytes_source"]
  assert f"= M 2 × microbatch {spec.global_batch_size // 2}" in report_lib.render(rep)
  assert math.isfinite(rep["roofline"]["step_s"])
