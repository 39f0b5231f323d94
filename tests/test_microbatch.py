"""Microbatches (train.microbatches) and the chunked loss (train.loss_chunk_size).

The truth each test holds them to is the unsplit step: one batch of B rows, the full
[B, T, V] logits, an uninterrupted run.
"""

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from chinchax import checkpoint as checkpoint_lib
from chinchax import cli
from chinchax import config as config_lib
from chinchax.model import transformer as model_lib
from chinchax.model import sharding as sharding_lib
from chinchax import train as train_lib
import chinchax.train.loss as loss_lib
import chinchax.train.spec as spec_lib
import chinchax.train.step as step_lib
import chinchax.train.trials as trials_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
B, T, V = 64, 16, 264
EOS = 256  # the bytes tokenizer's end-of-document id


def _config(mesh=(8, 1, 1), microbatches=1, chunk=0, **model):
  c = config_lib.get_variant("tiny")
  c.model.update(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab_size=V, **model)
  # Adam's eps 1e-6, not 1e-8: an update g/(|g| + eps) turns the float32 round-off of a
  # gradient element near 0 (|g| ~ 1e-8, a few per step here) into a change of order lr
  # (3e-5 after one step at eps 1e-8, whatever sums the gradient); test_gradients_*
  # compares the gradients themselves.
  c.train.update(global_batch_size=B, seq_len=T, microbatches=microbatches,
                 loss_chunk_size=str(chunk), z_loss=1e-4, eps=1e-6)
  c.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
  c.budget.update(mode="steps", steps=8)
  return c


def _batch(step: int, eos_every: int = 0) -> np.ndarray:
  """The step's batch int32 [B, T+1], a function of the step alone."""
  b = np.random.default_rng(step).integers(0, 256, (B, T + 1), dtype=np.int32)
  if eos_every:
    b[:, ::eos_every] = EOS
  return b


def _run(c, steps=8, devices=None, trials=(), eos_every=0):
  """(params as numpy leaves, last metrics) after ``steps`` steps of ``c``."""
  devices = devices or jax.devices()
  spec = spec_lib.resolve(c, len(devices))
  mesh = sharding_lib.make_mesh(spec.mesh, devices)
  program = (trials_lib.build_trials_program(c, spec, mesh, trials)[0] if trials
             else step_lib.build_program(c, spec, mesh))
  state = program.init_state()
  for s in range(steps):
    state, metrics = program.step(state, jax.device_put(_batch(s, eos_every),
                                                        program.batch_sharding))
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state["params"]))], metrics


def _max_diff(a, b):
  return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.mark.parametrize("mesh", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_microbatches_give_the_unsplit_params(mesh):
  ref, m_ref = _run(_config(mesh))
  for M in (2, 4, 8):
    params, m = _run(_config(mesh, microbatches=M))
    assert _max_diff(params, ref) < 1e-5, (mesh, M)
    # the metrics keep their meaning: the step's mean loss, the norm of the whole gradient
    for k in ("loss", "grad_norm", "z_loss"):
      assert float(m[k]) == pytest.approx(float(m_ref[k]), rel=1e-5), (mesh, M, k)


def test_microbatches_with_remat_and_scanned_layers():
  ref, _ = _run(_config(remat="full", scan_layers=True))
  params, _ = _run(_config(microbatches=4, remat="full", scan_layers=True))
  assert _max_diff(params, ref) < 1e-5


def test_microbatches_with_trials():
  def trials_run(M):
    c = _config(microbatches=M)
    c.train.lr_multipliers = "1,2"
    return _run(c, trials=trials_lib.parse_trials(c))

  ref, m_ref = trials_run(1)
  for M in (2, 4, 8):
    params, m = trials_run(M)
    assert params[0].shape[0] == 2 and _max_diff(params, ref) < 1e-5, M
    np.testing.assert_allclose(np.asarray(m["trial_loss"]), np.asarray(m_ref["trial_loss"]),
                               rtol=1e-5)


def test_document_masked_split_step_weighs_tokens_like_the_unsplit_one():
  ref, m_ref = _run(_config(document_mask=True), steps=3, eos_every=5)
  for M in (2, 8):
    params, m = _run(_config(microbatches=M, document_mask=True), steps=3, eos_every=5)
    assert float(m["loss"]) == pytest.approx(float(m_ref["loss"]), rel=1e-6)
    assert _max_diff(params, ref) < 1e-5


def _gradients(c, batch, devices=None):
  """(float32 gradient leaves, mean loss) of ``c``'s step at its init params on ``batch``."""
  devices = devices or jax.devices()
  spec = spec_lib.resolve(c, len(devices))
  mesh = sharding_lib.make_mesh(spec.mesh, devices)
  program = step_lib.build_program(c, spec, mesh)
  params = program.init_state()["params"]
  fn = step_lib.make_loss_and_grad(program.graphdef, c.train.z_loss, spec.microbatches,
                                   spec.loss_chunk_size, program.shardings["params"],
                                   spec.grad_reduce)
  grads, ce, _ = jax.jit(sharding_lib.under_mesh(fn, mesh))(
      params, jax.device_put(batch, program.batch_sharding))
  return [np.asarray(g) for g in jax.tree.leaves(jax.device_get(grads))], float(ce), program


@pytest.mark.parametrize("mesh", [(8, 1, 1), (2, 2, 2)])
def test_gradients_of_the_split_step_equal_the_unsplit_ones(mesh):
  ref, ce_ref, _ = _gradients(_config(mesh), _batch(0))
  scale = max(float(np.max(np.abs(g))) for g in ref)
  for M, chunk in ((2, 0), (8, 0), (4, 5)):
    got, ce, _ = _gradients(_config(mesh, microbatches=M, chunk=chunk), _batch(0))
    assert _max_diff(got, ref) <= 1e-6 * scale, (M, chunk)
    assert ce == pytest.approx(ce_ref, rel=1e-6)


def test_one_microbatch_is_the_plain_gradient_bitwise():
  """M = 1 and an unchunked loss: exactly value_and_grad of the mean loss."""
  c = _config()
  batch = _batch(0)
  got, ce, program = _gradients(c, batch)

  def loss(params):
    logits = nnx.merge(program.graphdef, params)(batch[:, :-1])
    ce, z2 = loss_lib.loss_terms(logits, batch[:, 1:])
    return ce + 1e-4 * z2, ce

  params = program.init_state()["params"]
  (_, want_ce), want = jax.jit(sharding_lib.under_mesh(
      jax.value_and_grad(loss, has_aux=True), program.mesh))(params)
  assert ce == float(want_ce)
  assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(got, jax.tree.leaves(want)))


def _collectives_of_tokens(hlo: str) -> list[str]:
  """Collectives moving int32 tokens in compiled HLO, except the embedding lookup's own."""
  out = []
  for line in hlo.splitlines():
    if re.search(r"= s32\[[^\]]*\][^ ]* (all-gather|all-to-all|collective-permute)", line) \
        and "_take" not in line:
      out.append(line.strip()[:200])
  return out


@pytest.mark.parametrize("mesh", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_the_split_keeps_each_devices_rows(mesh):
  spec = spec_lib.resolve(_config(mesh, microbatches=4), 8)
  m = sharding_lib.make_mesh(spec.mesh)
  batch_sh = sharding_lib.batch_sharding(m)
  split = jax.jit(sharding_lib.under_mesh(lambda b: step_lib.split_microbatches(b, 4), m),
                  in_shardings=batch_sh)
  compiled = split.lower(jax.ShapeDtypeStruct((B, T + 1), jnp.int32, sharding=batch_sh)).compile()
  hlo = compiled.as_text()
  assert not re.search(r"all-gather|all-to-all|collective-permute|all-reduce", hlo), hlo
  # microbatch m holds rows m, M+m, …; each device keeps its rows
  out = split(jax.device_put(_batch(0), batch_sh))
  np.testing.assert_array_equal(np.asarray(out)[1], _batch(0)[1::4])
  if mesh == (2, 2, 2):  # in the whole step: no collective moves tokens but the lookup's own
    program = step_lib.build_program(_config(mesh, microbatches=4), spec, m)
    assert _collectives_of_tokens(program.lower().compile().as_text()) == []


@pytest.mark.parametrize("chunk", [1, 4, 5, 16, 40])
def test_chunked_loss_equals_the_full_loss_and_gradient(chunk):
  k = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k[0], (3, T, 24), jnp.float32)
  head = 0.3 * jax.random.normal(k[1], (24, 4000), jnp.float32)
  targets = jax.random.randint(k[2], (3, T), 0, 4000)
  weights = jnp.arange(1.0, 4.0)

  def full(x, head):
    ce, z2 = loss_lib.row_sums(model_lib.project(x, head), targets)
    return jnp.sum(weights * (ce + 0.1 * z2))

  def chunked(x, head):
    ce, z2 = loss_lib.chunked_row_sums(x, head, targets, min(chunk, T))
    return jnp.sum(weights * (ce + 0.1 * z2))

  (want, gw), (got, gg) = (jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(x, head)
                           for f in (full, chunked))
  assert abs(float(got - want)) <= 1e-6 * abs(float(want))
  for a, b in zip(gg, gw):
    assert float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)) <= 1e-6


def test_chunked_train_step_never_holds_the_whole_logits():
  c0, c4 = _config((1, 1, 1)), _config((1, 1, 1), chunk=5)
  one = jax.devices()[:1]
  for c, has_full in ((c0, True), (c4, False)):
    spec = spec_lib.resolve(c, 1)
    program = step_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh, one))
    assert (f"f32[{B},{T},{V}]" in program.lower().compile().as_text()) == has_full
  ref, m_ref = _run(c0, steps=3, devices=one)
  params, m = _run(c4, steps=3, devices=one)
  assert float(m["loss"]) == pytest.approx(float(m_ref["loss"]), rel=1e-6)
  assert _max_diff(params, ref) < 1e-5
  # with microbatches too, on a sharded mesh
  params, _ = _run(_config((2, 2, 2), microbatches=2), steps=3)
  chunked, _ = _run(_config((2, 2, 2), microbatches=2, chunk=6), steps=3)
  assert _max_diff(chunked, params) < 1e-5


def test_loss_chunk_size_resolution():
  assert loss_lib.resolve_chunk_size("auto", "cpu", 2048, 128_256) == 0
  assert loss_lib.resolve_chunk_size("auto", "gpu", 2048, 128_256) == 512
  assert loss_lib.resolve_chunk_size("auto", "tpu", 256, 50_304) == 256
  assert loss_lib.resolve_chunk_size("auto", "tpu", 2048, 32_000) == 0
  assert loss_lib.resolve_chunk_size("300", "cpu", 256, 512) == 256
  with pytest.raises(config_lib.ConfigError, match=r"loss_chunk_size='-3'"):
    loss_lib.resolve_chunk_size("-3", "cpu", 256, 512)


def test_the_run_prints_its_microbatches_and_chunk():
  c = _config(microbatches=4, chunk=5)
  text = spec_lib.describe(spec_lib.resolve(c, 8), c, 8)
  assert f"global_batch_size={B} = 4 microbatch(es) x {B // 4} rows" in text
  assert "loss in chunks of 5 positions" in text


def _final_params(workdir, c):
  spec = train_lib.resolve(c, 1)
  program = step_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh, jax.devices()[:1]))
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", 10 ** 9, 1, ())
  state = ckpt.restore_latest(program.abstract_state, program.shardings)
  ckpt.wait_and_close()
  return [np.asarray(x) for x in jax.tree.leaves(state["params"])]


def _losses(workdir):
  rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_resume_with_other_microbatches_equals_the_uninterrupted_run(tiny_config, tmp_path):
  c = tiny_config
  c.budget.steps = 12
  c.train.update(log_every=1, eval_every=100)
  c.workdir = str(tmp_path / "ref")
  train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  c.workdir = str(tmp_path / "split")
  c.train.stop_after_s = 1e-9  # stops (checkpointed) after the first timed step
  first = train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  assert first["stopped_by_time"] and first["microbatches"] == 1
  c.train.update(stop_after_s=0.0, microbatches=4)
  s = train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  assert s["resumed"] and s["steps"] == 12 and s["microbatches"] == 4
  ref, got = _losses(tmp_path / "ref"), _losses(tmp_path / "split")
  assert sorted(got) == sorted(ref)
  for step in ref:
    assert got[step] == pytest.approx(ref[step], rel=1e-5), step
  assert _max_diff(_final_params(tmp_path / "split", c), _final_params(tmp_path / "ref", c)) < 1e-5


@pytest.mark.parametrize("flags, needle", [
    (["--config.train.microbatches=3"], "train.microbatches=3 does not split"),
    (["--config.train.microbatches=0"], "train.microbatches=0"),
    (["--config.train.microbatches=2"], "use one of 1"),  # 8 rows / 2 < 8 devices
    (["--config.train.loss_chunk_size=many"], "train.loss_chunk_size='many'"),
])
def test_bad_microbatches_are_one_error_line(capsys, tmp_path, small_corpus, flags, needle):
  argv = ["train", f"--config={REPO}/configs/train.py:tiny", f"--config.workdir={tmp_path}/run",
          f"--config.data.store_root={tmp_path}/stores", "--config.mesh.num_cpu_devices=0",
          "--config.data.source=files", f"--config.data.paths={small_corpus}/*.txt"]
  rc = cli.main(argv + flags)
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 2 and len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
  assert not (tmp_path / "run").exists()
