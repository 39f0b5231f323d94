"""Ahead-of-time compilation: target names, HLO collectives, real TPU/GPU compiles, the CLI.

The compile tests use libtpu's compile-only description of a 4-chip v5e slice (no TPU
present) and run one after another in this process (libtpu takes a per-process lock).
"""

import json
import subprocess
import sys

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

needs_libtpu = pytest.mark.skipif(not topology.libtpu_available(),
                                  reason="libtpu not installed (pip install -e '.[tpu]')")
needs_cuda_plugin = pytest.mark.skipif(not topology.cuda_plugin_available(),
                                       reason="JAX's CUDA plugin not installed ('.[gpu-aot]')")


@pytest.mark.parametrize("spec, topo, devices", [
    ("v5e-4", "v5e:2x2", 4), ("v5e-16", "v5e:4x4", 16), ("v6e-256", "v6e:16x16", 256),
    ("v5e-8", "v5e:2x4", 8), ("v5p-8", "v5p:2x2x1", 4), ("v5p-128", "v5p:4x4x4", 64),
    ("v4-32", "v4:2x2x4", 32), ("v5p-1024", "v5p:8x8x8", 512), ("h100x8", "1x1x8", 8),
    ("h200x16", "1x2x8", 16)])
def test_target_names(spec, topo, devices):
  t = topology.parse_target(spec)
  assert (t.topology, t.n_devices) == (topo, devices)


def test_target_memory_and_slices():
  v4 = topology.parse_target("v4-8")  # 4 chips, each TensorCore a device: 16 GiB each
  assert v4.n_devices == 8 and v4.memory_per_device == pytest.approx(2 ** 35 / 2)
  two = topology.parse_target("v5e-16", num_slices=2)
  assert two.n_devices == 32 and two.num_slices == 2


@pytest.mark.parametrize("spec, kw, words", [
    ("v5e-12", {}, "not 12"), ("v5p-24", {}, r"v5p-24 \(12 chips\) is not one"), ("cpu", {}, "chinchax train"),
    ("h100x12", {}, "hosts of 8"), ("h100x8", {"num_slices": 2}, "TPU targets"),
    ("v5e-4", {"num_slices": 0}, "positive integer"), ("l4x2", {}, "no device description")])
def test_target_errors(spec, kw, words):
  with pytest.raises(topology.AotError, match=words):
    topology.parse_target(spec, **kw)


def test_unknown_target_lists_the_names():
  with pytest.raises(hardware_lib.HardwareError, match="known accelerators"):
    topology.parse_target("v9-8")


_HLO = """HloModule m

%body (p: (s32[], bf16[8,4])) -> (s32[], bf16[8,4]) {
  %p = (s32[], bf16[8,4]) parameter(0)
  %ag = bf16[8,4]{1,0} all-gather(%x), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}
  %ars = f32[2,4]{1,0} fusion(%y), kind=kCustom, calls=%all-reduce-scatter.1
  ROOT %t = (s32[], bf16[8,4]) tuple(%i, %ag)
}

%all-reduce-scatter.1 (a: f32[8,4]) -> f32[2,4] {
  %ar = f32[8,4]{1,0} all-reduce(%a), replica_groups=[1,4]<=[4], to_apply=%add
  ROOT %ds = f32[2,4]{1,0} dynamic-slice(%ar, %o, %o), dynamic_slice_sizes={2,4}
}

%cond (p: (s32[], bf16[8,4])) -> pred[] {
  ROOT %lt = pred[] compare(%a, %b), direction=LT
}

ENTRY %main (a: f32[16]) -> f32[16] {
  %w = (s32[], bf16[8,4]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  %s = (f32[16]{0}, f32[16]{0}) all-reduce-start(%a, %b), replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0','axis_1'}, to_apply=%add
  %d = (f32[16]{0}, f32[16]{0}) all-reduce-done(%s)
  %cp = (bf16[4]{0}, bf16[4]{0}, u32[], u32[]) collective-permute-start(%b), source_target_pairs={{0,1},{1,0}}
  ROOT %r = f32[16]{0} copy(%a)
}
"""


def test_hlo_collectives_by_hand():
  s = hlo.collectives(_HLO, n_devices=4)
  # the loop body's all-gather (bf16[8,4] = 64 B, group 4) and reduce-scatter fusion
  # (f32[2,4] = 32 B, its all-reduce's group 4) run 12 times; the async pair once.
  assert s.count == {"all-gather": 12, "reduce-scatter": 12, "all-reduce": 1, "all-to-all": 0,
                     "collective-permute": 1}
  assert s.operand_bytes["all-gather"] == 12 * 64 / 4
  assert s.wire_bytes["all-gather"] == 12 * 64 * 3 / 4
  assert s.operand_bytes["reduce-scatter"] == 12 * 32 * 4
  assert s.wire_bytes["reduce-scatter"] == 12 * 32 * 3
  assert s.operand_bytes["all-reduce"] == 2 * 64  # both 64-byte operands of the tuple
  assert s.wire_bytes["all-reduce"] == 2 * (2 * 64) * 3 / 4  # group = 2 × 2 mesh axes
  assert s.operand_bytes["collective-permute"] == 8  # the result half of the tuple
  assert s.unknown_trip_loops == 0


def test_group_sizes():
  assert hlo.group_size("replica_groups={{0,1},{2,3}}", 8) == 2
  assert hlo.group_size("replica_groups=[2,4]<=[8]", 8) == 4
  assert hlo.group_size("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}", 8) == 2
  assert hlo.group_size("replica_groups={}", 8) == 8


def test_mesh_memory_by_hand():
  shape = budget.ModelShape(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=128,
                            seq_len=32, tie_embeddings=True)
  n = budget.param_counts(shape).total
  prof = work.ExecutionProfile(2, True, False)
  est = work.mesh_memory_per_device(shape, 8, mesh={"data": 1, "fsdp": 4, "tensor": 1},
                                    remat="full", profile=prof)
  tokens = 8 * 32 / 4
  exps = 2 * 4 * 32  # bf16 [n_heads, T] exponentials per token
  layer = 2 * (4 * 64 + 4 * 4 * 16 + 3 * 128) + exps  # bf16 tensors and exponentials
  assert est.state == 16 * n / 4
  assert est.activations == tokens * 2 * 2 * 64  # each layer's bf16 input
  # the loss's bf16 logits and the sharded head's bf16 gradient; a recomputed layer and the
  # exponentials' gradient
  assert est.working == tokens * max(4 * 256, layer + exps)
  # bf16 weights of one layer of the two (scanned, cast one at a time) and of the rest
  assert est.gathered_weights == 2 * (n - budget.layer_matmul_params(shape))
  none = work.mesh_memory_per_device(shape, 8, mesh={"data": 4, "fsdp": 1, "tensor": 1},
                                     profile=prof)
  assert none.state == 16 * n and none.activations == tokens * 2 * layer
  assert none.gathered_weights == 2 * n
  tp = work.mesh_memory_per_device(shape, 8, mesh={"data": 2, "fsdp": 1, "tensor": 2},
                                   remat="full", profile=prof)
  assert tp.state == 16 * n / 2 and tp.working == (8 * 32 / 2) * max(
      4 * 256 / 2, 2 * (4 * 64 + (4 * 4 * 16 + 3 * 128) / 2) + 2 * exps / 2)
  assert tp.activations == (8 * 32 / 2) * 2 * (2 * 64 + 2 * 64)  # the input held twice
  # splash (TPU): no probabilities; the kernel keeps its [B, H, T, K] copies of q, k, v and the
  # output and its float32 logsumexp padded to 128 lanes, per token and layer
  splash = work.mesh_memory_per_device(shape, 8, mesh={"data": 4, "fsdp": 1, "tensor": 1},
                                       profile=work.ExecutionProfile.from_names("bfloat16",
                                                                                "splash"))
  kernel = 2 * (2 * 4 * 16 + 2 * 4 * 16) + 4 * 128 * 4
  assert splash.activations == tokens * 2 * (2 * (4 * 64 + 4 * 4 * 16 + 3 * 128) + kernel)
  assert work.ExecutionProfile.for_kind("tpu", seq_len=2048).splash_residuals
  assert not work.ExecutionProfile.for_kind("tpu", seq_len=100).splash_residuals  # xla there
  assert not work.ExecutionProfile.for_kind("gpu").splash_residuals
  from chinchax.model import attention  # the planner's TPU profile is what auto runs there
  for t in (100, 128, 1000, 1024, 2048):
    runs_splash = attention.resolve_impl("auto", "tpu", "bfloat16", seq_len=t) == "splash"
    assert runs_splash == work.ExecutionProfile.for_kind("tpu", seq_len=t).splash_residuals, t
  # float32 compute: plain autodiff keeps the scores beside the probabilities without remat,
  # and a recomputed layer's backward holds its tensors and their gradients
  f32 = work.ExecutionProfile(4, True, False)
  layer32 = 4 * (4 * 64 + 4 * 4 * 16 + 3 * 128) + 4 * 4 * 32
  none32 = work.mesh_memory_per_device(shape, 8, mesh={"data": 4, "fsdp": 1, "tensor": 1},
                                       profile=f32)
  assert none32.activations == tokens * 2 * (layer32 + 4 * 4 * 32)
  full32 = work.mesh_memory_per_device(shape, 8, mesh={"data": 4, "fsdp": 1, "tensor": 1},
                                       remat="full", profile=f32)
  assert full32.working == tokens * max(4 * 256, 2 * layer32)
  with pytest.raises(work.StepTimeError, match="remat"):
    work.mesh_memory_per_device(shape, 8, mesh={"data": 1}, remat="some")


def _tiny(**mesh):
  """A small run whose every dimension is a multiple of 128 (TPU pads arrays to 128 lanes)."""
  c = config_lib.get_variant("tiny")
  c.model.update(d_model=256, n_heads=2, d_ff=512)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  c.mesh.update(**mesh)
  return c


def _compile(config, spec, **kw):
  """A compile in its own process (the test process never loads libtpu)."""
  return search_lib.compile_cached(config, topology.parse_target(spec), cache_dir=kw.pop(
      "cache_dir", None), **kw)[0]


@needs_libtpu
def test_tpu_compile_fsdp_gathers_params_and_dp_all_reduces():
  args = {}
  for fsdp in (1, 2, 4):
    c = _tiny(data=4 // fsdp, fsdp=fsdp)
    rep = _compile(c, "v5e-4", eval_step=fsdp == 4)
    t = rep["train_step"]
    assert rep["fits"], t
    col = {k: t["collectives"][k]["count"] for k in hlo.KINDS}
    if fsdp == 1:
      assert col["all-reduce"] > 0 and col["all-gather"] == 0 and col["reduce-scatter"] == 0
    if fsdp == 4:
      assert col["all-gather"] > 0 and col["reduce-scatter"] > 0
      assert rep["eval_step"] is not None and rep["eval_step"]["fits"]
    n = rep["run"]["N"]
    batch = 4 * c.train.global_batch_size * (c.train.seq_len + 1) / 4
    # float32 parameters + AdamW m and v, sharded over fsdp; the device's rows of the batch
    args[fsdp] = (t["memory"]["argument"], 12 * n / fsdp + batch)
  assert args[1][0] > args[2][0] > args[4][0]
  for got, hand in args.values():
    assert got == pytest.approx(hand, rel=0.05)


@needs_libtpu
def test_tpu_compile_that_does_not_fit_reports_by_how_much():
  rep = _compile(config_lib.get_variant("125m"), "v5e-4", eval_step=False)
  oom = rep["train_step"]["oom"]
  assert not rep["fits"] and oom["required"] > oom["available"] > 1e10
  assert rep["headroom_bytes"] < 0
  assert any("remat" in s for s in rep["suggestions"])
  assert "DOES NOT FIT" in report_lib.render(rep)


@needs_libtpu
def test_compile_cache_and_report(tmp_path):
  c = _tiny(data=4)
  target = topology.parse_target("v5e-4")
  rep, cached = search_lib.compile_cached(c, target, eval_step=False, cache_dir=tmp_path)
  assert not cached and rep["fits"] and rep["roofline"]["step_s"] > 0
  assert rep["xla_over_analytic_flops"] == pytest.approx(1.0, abs=0.35)
  again, cached = search_lib.compile_cached(c, target, eval_step=False, cache_dir=tmp_path)
  assert cached and again["train_step"]["memory"] == rep["train_step"]["memory"]
  c.model.remat = "full"  # another program: another fingerprint
  assert search_lib.fingerprint(c, target, False) != next(tmp_path.glob("*.json")).stem


@needs_libtpu
def test_microbatched_program_is_compared_with_what_xla_counts():
  """XLA's cost analysis counts the microbatch loop's body once: its FLOPs and bytes are
  compared with the analytic count of one microbatch (through one scanned layer), so the
  ratios stay near 1 at M = 2 (they read about 1/M against the whole step's count), and the
  roofline scales XLA's bytes back to the step."""
  c = _tiny(data=4)
  c.train.microbatches = 2
  rep = _compile(c, "v5e-4", eval_step=False)
  assert rep["fits"], rep["train_step"]
  assert rep["xla_over_analytic_flops"] == pytest.approx(1.0, abs=0.35), rep["flops_compared"]
  assert "one microbatch of 2" in rep["flops_compared"]
  assert "one microbatch of 2" in rep["roofline"]["hbm_bytes_source"]


def test_the_compile_cache_key_follows_chinchax_source(monkeypatch):
  """Another chinchax (its model or report code changed) misses the cache: the fingerprint
  holds a digest of the package's source, which a changed file changes."""
  c, target = _tiny(data=4), topology.parse_target("v5e-4")
  digest = search_lib.source_digest()
  assert len(digest) == 16 and digest == search_lib.source_digest()
  before = search_lib.fingerprint(c, target, False)
  monkeypatch.setattr(search_lib, "source_digest", lambda: "0" * 16)
  assert search_lib.fingerprint(c, target, False) != before


def test_a_compiler_crash_is_a_report(monkeypatch):
  def crashed(*a, **kw):
    return subprocess.CompletedProcess(a[0], -11, stdout="", stderr="")

  monkeypatch.setattr(search_lib.subprocess, "run", crashed)
  rep, _ = search_lib.compile_cached(_tiny(data=4), topology.parse_target("v5e-4"),
                                     cache_dir=None)
  assert rep["fits"] is False and "SIGSEGV" in rep["train_step"]["error"]
  assert "failed to compile" in report_lib.render(rep) and rep["suggestions"]


@needs_cuda_plugin
def test_gpu_compile_without_a_gpu():
  rep = _compile(_tiny(data=8), "h100x8", eval_step=False)
  t = rep["train_step"]
  assert rep["fits"] and t["xla_flops"] is None
  assert t["collectives"]["all-reduce"]["count"] > 0
  assert any("analytic" in n for n in rep["notes"]) and rep["roofline"]["step_s"] > 0


def test_variants_keep_the_run_and_rank(monkeypatch):
  c = _tiny(data=-1)
  target = topology.parse_target("v5e-4")
  vs = search_lib.variants(c, target)
  assert {(v.model.remat, v.mesh.data, v.mesh.fsdp, v.mesh.tensor) for v in vs} >= {
      ("none", 4, 1, 1), ("full", 1, 4, 1), ("dots", 1, 2, 2), ("full", 2, 2, 1)}
  assert all(v.train.global_batch_size == 8 and v.model.d_model == 256 for v in vs)
  assert len(vs) == len({(v.model.remat, v.mesh.data, v.mesh.fsdp, v.mesh.tensor) for v in vs})

  def fake(config, target, **kw):  # fits only with remat=full; faster with more fsdp
    fits = config.model.remat == "full"
    return ({"fits": fits, "run": {"mesh": dict(config.mesh)},
             "train_step": {"memory": {"total": 1e9}}, "headroom_fraction": 0.5 if fits else -1,
             "roofline": {"step_s": 1.0 / config.mesh.fsdp, "bound": "hbm"}}, False)

  monkeypatch.setattr(search_lib, "compile_cached", fake)
  monkeypatch.setattr(topology, "check_available", lambda t: None)
  rows = search_lib.search(c, target, cache_dir=None)
  n_fit = sum(v.model.remat == "full" for v in vs)
  assert [r["fits"] for r in rows] == [True] * n_fit + [False] * (len(rows) - n_fit)
  assert len(rows) > len(vs)  # a variant that does not fit is compiled again at the next M
  assert {r["microbatches"] for r in rows} == {1, 2}  # batch 8 over 4 devices: M = 1 or 2
  assert all(r["remat"] == "full" for r in rows[:n_fit])
  assert rows[0]["mesh"]["fsdp"] == 4 and "mesh.fsdp=4" in search_lib.render(rows, target)


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "chinchax.cli", "compile", *args],
                        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, words", [
    (("--topology", "v5e-12"), "not 12"),
    (("--topology", "v5e-4", "--config.mesh.data=3", "--config.mesh.fsdp=1"), "4"),
    (("--topology", "v5e-4", "--config=configs/train.py:tiny", "--config.mesh.data=-1",
      "--config.train.global_batch_size=6"), "global_batch_size"),
    (("--slices", "2"), "--topology"),
    (("--topology", "v5e-4", "--out", "/tmp"), "must name a file"),
    (("--topology", "v5e-4", "--out", ""), "must name a file"),
])
def test_cli_bad_input_is_one_line(args, words):
  r = _cli(*args)
  assert r.returncode == 2, r.stderr
  err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(err) == 1 and words in err[0], r.stderr
  assert "Traceback" not in r.stderr


def test_missing_libtpu_is_named(monkeypatch):
  monkeypatch.setattr(topology, "libtpu_available", lambda: False)
  with pytest.raises(topology.AotError, match=r"pip install -e \"\.\[tpu\]\""):
    program_lib.compile_run(_tiny(data=4), topology.parse_target("v5e-4"))


@needs_libtpu
def test_cli_json(tmp_path):
  out = tmp_path / "r.json"
  r = _cli("--topology", "v5e-8", "--config=configs/train.py:tiny", "--config.mesh.data=-1",
           "--no-eval", "--no-cache", "--json", "--out", str(out))
  assert r.returncode == 0, r.stderr
  rep = json.loads(r.stdout)
  assert rep["fits"] and rep["target"]["topology"] == "v5e:2x4"
  assert json.loads(out.read_text())["train_step"]["memory"] == rep["train_step"]["memory"]
  assert "TPU_WORKER_HOSTNAMES" not in r.stderr and "TPU_ACCELERATOR_TYPE" not in r.stderr


def test_trip_count_from_the_loop_condition():
  text = _HLO.replace(', backend_config={"known_trip_count":{"n":"12"}}', "").replace(
      "ROOT %lt = pred[] compare(%a, %b), direction=LT",
      "%c = s32[] constant(7)\n  ROOT %lt = pred[] compare(%a, %c), direction=LT")
  s = hlo.collectives(text, n_devices=4)
  assert s.count["all-gather"] == 7 and s.unknown_trip_loops == 0
  s = hlo.collectives(_HLO.replace(', backend_config={"known_trip_count":{"n":"12"}}', ""), 4)
  assert s.count["all-gather"] == 1 and s.unknown_trip_loops == 1


def _fake_run(spec, remat="none", total=1e9, mesh=None):
  """A CompiledRun as compile_run would return it, with a made-up memory analysis."""
  target = topology.parse_target(spec)
  c = _tiny(data=-1)
  c.model.remat = remat
  if mesh:
    c.mesh.update(**mesh)
  run_spec = program_lib.check_config(c, target)
  coll = hlo.CollectiveSummary({k: 0 for k in hlo.KINDS}, {k: 0.0 for k in hlo.KINDS},
                               {k: 0.0 for k in hlo.KINDS})
  mem = {"argument": 0.0, "output": 0.0, "alias": 0.0, "temp": total, "generated_code": 0.0,
         "total": total}
  train = program_lib.ProgramResult("train_step", 1.0, True, mem, None, None, coll)
  return program_lib.CompiledRun(target, run_spec, train, None, {})


def test_compiled_but_over_hbm_does_not_fit():
  rep = report_lib.summarize(_fake_run("h100x8", total=211e9))
  assert rep["fits"] is False and rep["headroom_bytes"] < 0 and rep["suggestions"]
  assert any("does not check HBM" in n for n in rep["notes"])
  assert report_lib.summarize(_fake_run("h100x8", total=1e9))["fits"] is True


def test_roofline_counts_recompute_and_a_v4_device_is_half_a_chip():
  none = report_lib.summarize(_fake_run("v5p-8"))["roofline"]
  full = report_lib.summarize(_fake_run("v5p-8", remat="full"))["roofline"]
  assert full["compute_s"] == pytest.approx(none["compute_s"] * 4 / 3)
  dots = report_lib.summarize(_fake_run("v5p-8", remat="dots"))["roofline"]
  assert none["compute_s"] < dots["compute_s"] < full["compute_s"]
  # v4-8: 4 chips seen as 8 TensorCore devices; each has half a chip's peak FLOP/s
  v4 = report_lib.summarize(_fake_run("v4-8"))
  acc = topology.parse_target("v4-8").accelerator
  assert v4["roofline"]["compute_s"] == pytest.approx(
      v4["analytic"]["flops"] / (acc.peak_flops / 2))


def test_multi_slice_traffic_is_flagged():
  rep = report_lib.summarize(_fake_run("h100x16", mesh={"data": 8, "fsdp": 1, "tensor": 2}))
  assert any("data-center network" in n for n in rep["notes"])
