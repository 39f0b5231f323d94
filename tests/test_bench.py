"""`chinchax bench`: grid expansion and validation, a tiny sweep end to end, failures recorded,
the step-time fits, the attention fallback message, and the bare-JAX twin's equivalence."""

import importlib.util
import json
import math
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from chinchax.model import attention as attention_lib
from chinchax import bench
from chinchax.cost import budget
from chinchax import cli
from chinchax import config as config_lib
from chinchax import train as train_lib
from chinchax.bench import __main__ as bench_main
from chinchax.bench import isolate
from chinchax.cli import plan as plan_cli
from chinchax.cost import step_time
from chinchax.cost import work

REPO = pathlib.Path(__file__).resolve().parent.parent


def _tiny(tmp_path, **bench_kw):
  c = config_lib.get_bench_variant("tiny")
  c.workdir = str(tmp_path / "bench")
  c.bench.update(**bench_kw)
  return c


# ---------------------------------------------------------------------------- grid


def test_default_grid_has_enough_points_and_merges_duplicates():
  c = config_lib.get_bench_variant("default")
  points = bench.validate_bench(c)
  assert len(points) >= 12
  names = [p.name for p in points]
  assert len(names) == len(set(names))
  # s2 at batch 32 on dp is in the size sweep and is every other sweep's baseline: one point.
  base = next(p for p in points if p.name == "s2_b32_t128_xla_dp_none_float32")
  assert base.sweeps == ("size",)
  assert {p.mesh for p in points} >= {"dp", "fsdp", "tp", "2x2x2", "3x1x1"}
  assert {p.remat for p in points} == {"none", "full", "dots"}
  assert {p.compute_dtype for p in points} == {"float32", "bfloat16"}
  h200 = bench.validate_bench(config_lib.get_bench_variant("h200"))
  assert len(h200) == 8 and {p.attention for p in h200} == {"xla", "cudnn"}


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.sweeps.batch.update(models="t9"), "'t9', which is not in config.models"),
    (lambda c: c.sweeps.batch.update(mesh="2x2"), "mesh layout '2x2'"),
    (lambda c: c.sweeps.batch.update(global_batch_size="8,0"), "'0' is not a positive integer"),
    (lambda c: c.sweeps.batch.update(attention="flash"), "attention='flash'"),
    (lambda c: c.models.t1.update(n_heads=3), "bench point t1_b8_t32.*not divisible"),
    (lambda c: c.bench.update(fit_sweep="nope"), "bench.fit_sweep='nope'"),
    (lambda c: c.bench.update(fit_sweep="batch") or c.sweeps.batch.update(remat="none,full"),
     "varies remat"),
    (lambda c: c.bench.update(hardware="tpu-v99"), "bench.hardware='tpu-v99'"),
    (lambda c: c.bench.update(timed_steps=0), "bench.timed_steps=0"),
])
def test_bad_bench_config_is_one_clear_error(edit, match):
  c = config_lib.get_bench_variant("tiny")
  edit(c)
  with pytest.raises(config_lib.ConfigError, match=match):
    bench.validate_bench(c)


def test_parse_mesh():
  assert bench.parse_mesh("dp") == {"data": -1, "fsdp": 1, "tensor": 1}
  assert bench.parse_mesh("1x-1x2") == {"data": 1, "fsdp": -1, "tensor": 2}
  for bad in ("-1x-1x2", "0x8x1", "zz"):
    with pytest.raises(config_lib.ConfigError, match="mesh layout"):
      bench.parse_mesh(bad)


# ---------------------------------------------------------------------------- sweeps


def test_tiny_sweep_writes_table_summary_plots_and_uses_the_train_step(tmp_path, monkeypatch):
  calls = []
  real = train_lib.build_program

  def spy(*args, **kw):
    calls.append(args)
    return real(*args, **kw)

  monkeypatch.setattr(train_lib, "build_program", spy)
  c = _tiny(tmp_path)
  out = bench.run_bench(c, verbose=False)
  rows = {r["name"]: r for r in out["rows"]}
  assert len(calls) == 2  # both measured points ran chinchax train's jitted step
  ok = [r for r in rows.values() if r["status"] == "ok"]
  assert len(ok) == 2
  for r in ok:
    assert r["timed_steps"] == 2 and len(r["step_times_s"]) == 2
    assert r["step_time_min_s"] <= r["step_time_s"] <= r["step_time_max_s"]
    assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / r["step_time_s"])
    flops = budget.matmul_flops_per_token(budget.ModelShape(
        d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab_size=257,
        seq_len=r["seq_len"])) * r["tokens_per_step"]
    assert r["model_flops_per_step"] == pytest.approx(flops)
    assert r["mfu"] == pytest.approx(flops / r["step_time_s"] / r["peak_flops"])
    assert r["xla_flops"] > 0 and r["xla_bytes_accessed"] > 0
    assert r["memory_peak_bytes"] > 0 and r["compile_s"] > 0
    assert math.isfinite(r["loss_last"])
  bad = rows["t1_b8_t32_xla_3x1x1_none_float32"]
  assert bad["status"] == "invalid" and "3×1×1" in bad["error"]
  wd = tmp_path / "bench"
  lines = (wd / "results.jsonl").read_text().splitlines()
  assert len(lines) == 3
  header = (wd / "results.csv").read_text().splitlines()[0].split(",")
  assert header[:3] == ["name", "sweeps", "status"] and "step_time_spread" in header
  summary = (wd / "summary.md").read_text()
  assert "t1_b16_t32_xla_dp_none_float32 | ok" in summary and "invalid" in summary
  for png in ("tokens_per_s_vs_batch.png", "mfu_vs_size.png", "memory_vs_batch.png"):
    assert (wd / png).read_bytes()[:4] == b"\x89PNG"
  meta = json.loads((wd / "bench.json").read_text())
  assert meta["points"] == 3 and meta["ok"] == 2


def test_oversized_point_is_recorded_oom_without_running():
  c = bench.point_config(config_lib.get_bench_variant("tiny"),
                         bench.Point("t1", 8, 32, "xla", "dp", "none", "float32"))
  row = bench.measure_point(c, warmup_steps=1, timed_steps=1, memory_limit_gb=1e-6)
  assert row["status"] == "oom"
  assert "over the 1e-06 GB limit (bench.memory_limit_gb); not run" in row["error"]
  assert row["compiled_memory_bytes"] > 1e3 and "step_time_s" not in row


def test_cli_isolated_point_recorded(tmp_path, capsys):
  wd = tmp_path / "iso"
  rc = cli.main(["bench", "--config", f"{REPO}/configs/bench.py:tiny", f"--config.workdir={wd}",
                 "--config.bench.isolate=True", "--config.sweeps.batch.global_batch_size=8"])
  assert rc == 0
  rows = [json.loads(l) for l in (wd / "results.jsonl").read_text().splitlines()]
  assert [r["status"] for r in rows] == ["ok", "invalid"]
  assert rows[0]["memory_source"] == "compiled memory_analysis"  # CPU keeps no memory_stats
  assert "[1/2] t1_b8_t32_xla_dp_none_float32: ok" in capsys.readouterr().out


def test_crashed_child_is_a_failed_row(tmp_path):
  # A child that dies is a failed row, not a failed bench.
  job = {"kind": "point", "config": {"mesh": {}}}
  row = isolate.run_child(job, 120, tmp_path, "broken")
  assert row["status"] == "crashed" and "exit status 1" in row["error"]


def test_child_entry_takes_only_a_job(capsys):
  assert bench_main.main(["--config", "configs/bench.py:tiny"]) == 2
  assert "usage: python -m chinchax.bench --child IN.json OUT.json" in capsys.readouterr().err


def test_cli_rejects_bad_config_before_work(tmp_path, capsys):
  rc = cli.main(["bench", "--config", f"{REPO}/configs/bench.py:tiny",
                 f"--config.workdir={tmp_path}", "--config.sweeps.batch.mesh=4x4"])
  assert rc == 2
  assert "error: mesh layout '4x4'" in capsys.readouterr().err
  assert not (tmp_path / "results.jsonl").exists()


# ---------------------------------------------------------------------------- step-time fit


def _synthetic_rows(t0=2e-3, s_per_flop=2e-11, s_per_byte=3e-10, noise=0.0):
  prof = work.ExecutionProfile.for_kind("cpu")
  rng = np.random.default_rng(0)
  rows = []
  for d, L, gbs in [(32, 2, 8), (64, 2, 8), (96, 2, 8), (64, 4, 8), (128, 2, 8), (32, 2, 32),
                    (64, 2, 32), (96, 2, 32), (64, 4, 32), (128, 2, 32)]:
    shape = budget.ModelShape(d_model=d, n_layers=L, n_heads=4, d_ff=3 * d, vocab_size=257,
                              seq_len=128)
    f = work.step_flops(shape, gbs, n_devices=8, profile=prof)
    b = work.bytes_per_step(shape, gbs, n_devices=8, profile=prof)
    t = (t0 + s_per_flop * f + s_per_byte * b) * (1 + noise * rng.standard_normal())
    rows.append({"name": f"d{d}_l{L}_b{gbs}", "sweeps": "size", "status": "ok",
                 "d_model": d, "n_layers": L, "n_heads": 4, "d_ff": 3 * d, "vocab_size": 257,
                 "seq_len": 128, "global_batch_size": gbs, "attention": "xla",
                 "compute_dtype": "float32", "n_devices": 8, "step_time_s": t,
                 "xla_flops": f * 1.1, "xla_bytes_accessed": b * 0.8})
  return rows


def test_step_time_fit_heldout_and_plan_loads_it(tmp_path):
  rows = _synthetic_rows()
  rows.append({**rows[0], "name": "other", "sweeps": "mesh"})  # not in the fit sweep
  rows.append({**rows[1], "name": "failed", "status": "oom"})
  path = tmp_path / "step_time.json"
  fit = bench.fit_step_time(rows, sweep="size", n_heldout=4, hardware_spec="cpux8", path=path)
  assert fit["n_points"] == 10 and len(fit["heldout_points"]) == 4
  res = fit["heldout"]
  assert set(res) == {"flops_only", "flops_and_bytes", "xla_flops_only", "xla_flops_and_bytes"}
  for key in res:
    assert len(res[key]["errors"]) == 4
  # The data are exactly linear in FLOPs and bytes: those fits are exact out of sample, and
  # dropping the bytes term costs accuracy.
  assert res["flops_and_bytes"]["mean_abs_error"] < 1e-3
  assert res["xla_flops_and_bytes"]["mean_abs_error"] < 1e-3
  assert res["flops_only"]["mean_abs_error"] > 10 * res["flops_and_bytes"]["mean_abs_error"]
  model = step_time.load_step_time_model(path)
  assert model.fallback.n_devices == 8 and len(model.table) == 10
  shape = budget.ModelShape(d_model=80, n_layers=3, n_heads=4, d_ff=240, vocab_size=257,
                            seq_len=128)
  prof = work.ExecutionProfile.for_kind("cpu")
  want = 2e-3 + 2e-11 * work.step_flops(shape, 16, n_devices=8, profile=prof) + 3e-10 * \
      work.bytes_per_step(shape, 16, n_devices=8, profile=prof)
  assert model.predict(shape, 16) == pytest.approx(want, rel=1e-3)
  assert plan_cli.main(["--hours", "0.1", "--hardware", "cpux8", "--step-time-model",
                        str(path), "--json"]) == 0


def test_step_time_fit_skips_with_too_few_points(tmp_path):
  rows = _synthetic_rows()[:5]
  fit = bench.fit_step_time(rows, sweep="size", n_heldout=4, hardware_spec="cpux8", path=None)
  assert "heldout" not in fit and "cannot hold out 4" in fit["skipped"]
  assert "at least 3" in bench.fit_step_time(rows[:2], sweep="size", n_heldout=4,
                                             hardware_spec="cpu")["skipped"]


def test_heldout_indices_are_interior_and_distinct():
  assert bench.heldout_indices(10, 4) == [1, 3, 6, 8]
  for n in range(7, 20):
    idx = bench.heldout_indices(n, 4)
    assert len(set(idx)) == 4 and 0 not in idx and n - 1 not in idx


# ---------------------------------------------------------------------------- attention, bare JAX


def test_attention_switch_falls_back_with_a_message(capsys):
  assert attention_lib.resolve_impl("cudnn", "cpu", "float32") == "xla"
  err = capsys.readouterr().err
  assert err.startswith("warning: attention='cudnn' needs an NVIDIA GPU")
  assert "falling back to 'xla'" in err
  assert attention_lib.resolve_impl("splash", "gpu", "bfloat16") == "xla"
  assert ("warning: attention='splash' (Pallas splash attention) needs a TPU, the backend is "
          "'gpu'; falling back to 'xla'") in capsys.readouterr().err
  assert attention_lib.resolve_impl("auto", "cpu", "float32") == "xla"
  assert attention_lib.resolve_impl("auto", "gpu", "bfloat16") == "cudnn"
  with pytest.raises(ValueError, match="'flash' is not one of"):
    attention_lib.resolve_impl("flash", "cpu", "float32")


def test_splash_kernel_matches_xla_attention_sharded_in_interpret_mode():
  """The TPU kernel run by the Pallas interpreter, per shard of a (2, 2, 2) mesh, with grads."""
  from jax.sharding import NamedSharding
  from chinchax.model import sharding as sharding_lib
  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(x, (4, 128, 2, 8), jnp.float32) for x in keys)
  mesh = sharding_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  sh = NamedSharding(mesh, sharding_lib.logical_to_spec(("batch", "seq", "heads", "kv")))

  def loss(impl):
    def f(q, k, v):
      if impl == "splash":
        out = attention_lib.splash_attention(q, k, v, interpret=True)
      else:
        out = attention_lib.causal_attention(q, k, v, impl="xla")
      return jnp.sum(jnp.sin(out)), out
    return f

  (_, want), g_want = jax.value_and_grad(loss("xla"), argnums=(0, 1, 2), has_aux=True)(q, k, v)
  args = [jax.device_put(x, sh) for x in (q, k, v)]
  (_, got), g_got = jax.jit(jax.value_and_grad(loss("splash"), argnums=(0, 1, 2),
                                               has_aux=True))(*args)
  assert got.sharding.spec == sh.spec
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)
  for a, b in zip(g_got, g_want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
  with pytest.raises(ValueError, match="multiple of 128"):
    x = jnp.zeros((1, 192, 2, 8))
    attention_lib.splash_attention(x, x, x, interpret=True)


def _load_bare():
  spec = importlib.util.spec_from_file_location("bare_jax", REPO / "benchmarks" / "bare_jax.py")
  mod = importlib.util.module_from_spec(spec)
  sys.modules["bare_jax"] = mod  # dataclasses look their module up there
  spec.loader.exec_module(mod)
  return mod


def test_bare_jax_twin_matches_chinchax_step_for_step():
  from chinchax.model import sharding as sharding_lib
  bare = _load_bare()
  cfg = bare.BareConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, seq_len=16,
                        global_batch_size=4, warmup_steps=1, decay_steps=10)
  c = bare.chinchax_config(cfg)
  spec = train_lib.resolve(c, 1)
  device = jax.devices()[0]
  mesh = sharding_lib.make_mesh(spec.mesh, [device])
  program = train_lib.build_program(c, spec, mesh)
  cx_state, cx_step = program.init_state(), program.step
  state = bare.init_state(bare.params_from_chinchax(
      nnx.to_pure_dict(jax.device_get(cx_state["params"]))))
  bare_step = jax.jit(bare.make_train_step(cfg))
  batch_sh = sharding_lib.batch_sharding(mesh)
  rng = np.random.default_rng(0)
  for _ in range(4):  # through warm-up into the cosine, past the clipping threshold
    b = rng.integers(0, 257, (4, 17), dtype=np.int32)
    cx_state, cm = cx_step(cx_state, train_lib.global_batch(batch_sh, b, 4))
    state, bm = bare_step(state, jnp.asarray(b))
    for k in ("loss", "grad_norm", "lr"):
      assert float(bm[k]) == pytest.approx(float(cm[k]), rel=2e-5, abs=1e-8), k
  cx_params = bare.params_from_chinchax(
      nnx.to_pure_dict(jax.device_get(cx_state["params"])))
  for a, b in zip(jax.tree.leaves(cx_params), jax.tree.leaves(state["params"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
