"""One gradient reduction per step (train.grad_reduce) and the 16-bit numerics of the loss and
attention.

Truths: the unsplit step's gradients (microbatches M = 1), the collectives XLA compiles for 8
virtual CPU devices counted per step from the optimized HLO (``chinchax.aot.hlo``, loops times
their trip counts), and plain autodiff of the same float32 arithmetic.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chinchax import config as config_lib
from chinchax.aot import hlo as hlo_lib
from chinchax.cost import work
from chinchax.model import attention as attention_lib
from chinchax.model import transformer as model_lib
from chinchax.model import sharding as sharding_lib
import chinchax.train.loss as loss_lib
import chinchax.train.spec as spec_lib
import chinchax.train.step as step_lib

B, T, V = 64, 16, 264


def _config(mesh, microbatches=1, grad_reduce="auto"):
  c = config_lib.get_variant("tiny")
  c.model.update(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab_size=V)
  c.train.update(global_batch_size=B, seq_len=T, microbatches=microbatches, z_loss=1e-4,
                 grad_reduce=grad_reduce)
  c.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
  return c


def _program(c):
  spec = spec_lib.resolve(c, jax.device_count())
  return step_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh)), spec


def _gradient_collectives(c):
  """{kind: (executions per step, operand bytes per step)} of the compiled train step."""
  program, _ = _program(c)
  summary = hlo_lib.collectives(program.lower().compile().as_text(), jax.device_count())
  assert summary.unknown_trip_loops == 0
  return {k: (summary.count[k], summary.operand_bytes[k]) for k in ("all-reduce",
                                                                    "reduce-scatter")}


@pytest.mark.parametrize("mesh,grad_reduce", [((8, 1, 1), "auto"), ((1, 8, 1), "step"),
                                              ((2, 4, 1), "step")])
def test_gradient_collectives_do_not_grow_with_microbatches(mesh, grad_reduce):
  one = _gradient_collectives(_config(mesh, 1, grad_reduce))
  for M in (4, 8):
    got = _gradient_collectives(_config(mesh, M, grad_reduce))
    for kind in one:
      count, nbytes = got[kind]
      assert count <= max(one[kind][0], 1) and nbytes <= 1.05 * one[kind][1], (M, kind, got, one)
  assert sum(b for _, b in one.values()) > 0  # the gradients are reduced at all


def _partitioned_gradient_collectives(c, dump_dir):
  """(executions, operand bytes) of the train step's all-reduces and reduce-scatters as XLA's
  SPMD partitioner leaves them, and the bytes of those in bfloat16; the program that pass
  writes, since XLA:CPU then widens every bfloat16 all-reduce to float32 (a TPU or GPU reduces
  bfloat16 as it is)."""
  program, _ = _program(c)
  # A hit in a persistent compilation cache (one an earlier in-process command turned on) would
  # skip XLA's passes, and with them the dump: off for this compile. JAX decides once per
  # process whether the cache is used, so that decision is reset around it.
  from jax._src import compilation_cache
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    program.lower().compile({"xla_dump_to": str(dump_dir), "xla_dump_hlo_as_text": True,
                             "xla_dump_hlo_pass_re": "spmd-partitioning"})
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()
  text, = [p.read_text() for p in dump_dir.glob("*train_step*after_spmd-partitioning*")]
  summary = hlo_lib.collectives(text, jax.device_count())
  assert summary.unknown_trip_loops == 0
  count = summary.count["all-reduce"] + summary.count["reduce-scatter"]
  nbytes = summary.operand_bytes["all-reduce"] + summary.operand_bytes["reduce-scatter"]
  bf16 = sum(hlo_lib.shape_bytes(m.group(1)) for m in re.finditer(
      r"= (bf16\[[0-9,]*\]\S*) all-reduce\(", text))
  return count, nbytes, bf16


@pytest.mark.parametrize("mesh,M", [((8, 1, 1), 4), ((1, 8, 1), 8)])
def test_bf16_gradients_are_reduced_once_per_step_in_bf16(mesh, M, tmp_path):
  """Under bfloat16 compute the step's one reduction sends each matrix's and embedding's
  gradient once in bfloat16 (hand count: 2 bytes per such parameter) and no more bytes, in
  no more collectives, than the unsplit step (M = 1)."""
  def config(m):
    c = _config(mesh, m, "step")
    c.model.compute_dtype = "bfloat16"
    return c

  program, _ = _program(config(1))
  roles = jax.tree_util.tree_leaves_with_path(program.abstract_state["params"])
  matrices = sum(int(np.prod(x.shape)) for path, x in roles if model_lib.param_role(path) != "norm")
  one = _partitioned_gradient_collectives(config(1), tmp_path / "one")
  got = _partitioned_gradient_collectives(config(M), tmp_path / "many")
  assert got[2] == 2 * matrices, (got, one, matrices)
  assert got[0] <= one[0] and got[1] <= 1.05 * one[1], (got, one)


def test_norm_scales_are_neither_gathered_nor_reduced_alone():
  """On fsdp the norm scales (the only [d_model] = f32[32] parameters here) are replicated: no
  all-gather brings one in at a use, and their gradients travel in the all-reduces of the
  matrices' gradients (XLA's combiner merges them) rather than in collectives of their own."""
  program, _ = _program(_config((1, 8, 1)))
  text = program.lower().compile().as_text()
  ops = [(m.group(1), m.group(2)) for m in re.finditer(
      r"= (\(.*?\)|\S+) (all-gather|all-reduce)(?:-start)?\(", text)]
  norm = re.compile(r"f32\[32\]\{0\}")
  assert not [s for s, op in ops if op == "all-gather" and norm.search(s)]
  norm_reduces = [s for s, op in ops if op == "all-reduce" and norm.search(s)]
  assert norm_reduces and all(re.search(r"f32\[\d+,\d+", s) for s in norm_reduces), norm_reduces


def test_per_microbatch_reduction_grows_with_microbatches():
  """The other setting, for contrast: M reductions of the whole gradient per step."""
  one = _gradient_collectives(_config((8, 1, 1), 1, "microbatch"))["all-reduce"]
  four = _gradient_collectives(_config((8, 1, 1), 4, "microbatch"))["all-reduce"]
  assert four[0] == 4 * one[0] and four[1] > 3 * one[1]


def _gradients(c, batch):
  program, spec = _program(c)
  params = program.init_state()["params"]
  fn = step_lib.make_loss_and_grad(program.graphdef, c.train.z_loss, spec.microbatches,
                                   spec.loss_chunk_size, program.shardings["params"],
                                   spec.grad_reduce)
  grads, ce, z2 = jax.jit(sharding_lib.under_mesh(fn, program.mesh))(
      params, jax.device_put(batch, program.batch_sharding))
  return [np.asarray(g) for g in jax.tree.leaves(jax.device_get(grads))], float(ce), float(z2)


@pytest.mark.parametrize("mesh", [(8, 1, 1), (1, 8, 1), (2, 2, 2)])
def test_one_reduction_per_step_gives_the_unsplit_gradients(mesh):
  batch = np.random.default_rng(0).integers(0, 256, (B, T + 1), dtype=np.int32)
  ref, ce_ref, z2_ref = _gradients(_config(mesh), batch)
  scale = max(float(np.max(np.abs(g))) for g in ref)
  for M in (2, 8):
    got, ce, z2 = _gradients(_config(mesh, M, "step"), batch)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(got, ref)) <= 1e-6 * scale, M
    assert ce == pytest.approx(ce_ref, rel=1e-6) and z2 == pytest.approx(z2_ref, rel=1e-6)


def test_grad_reduce_auto_and_its_memory():
  assert work.resolve_grad_reduce("auto", {"data": 16, "fsdp": 1}) == "step"
  assert work.resolve_grad_reduce("auto", {"data": 1, "fsdp": 16}) == "microbatch"
  from chinchax.cost import budget
  shape = budget.ModelShape(vocab_size=32000, d_model=768, n_layers=12, n_heads=12, d_ff=2048,
                            seq_len=1024)
  n = budget.param_counts(shape).total
  kw = dict(mesh={"data": 1, "fsdp": 16, "tensor": 1}, remat="full", microbatches=4)
  per_mb = work.mesh_memory_per_device(shape, 256, **kw)
  per_step = work.mesh_memory_per_device(shape, 256, grad_reduce="step", **kw)
  assert per_step.accumulation == 8 * n and per_mb.accumulation == 4 * n / 16
  assert per_step.gathered_weights == 2 * n  # all the bf16 weights, gathered once per step
  with pytest.raises(config_lib.ConfigError, match="train.grad_reduce"):
    _program(_config((8, 1, 1), 2, "sometimes"))


def _logits_grad(fn, logits, targets):
  def loss(x):
    ce, z2 = fn(x, targets)
    return jnp.sum(ce) + 1e-2 * jnp.sum(z2)
  return jax.jit(jax.grad(loss))


def test_bf16_loss_gradient_is_the_float32_one_in_one_bf16_buffer():
  B_, T_, V_ = 4, 64, 4096
  logits = jax.random.normal(jax.random.PRNGKey(0), (B_, T_, V_)).astype(jnp.bfloat16) * 3
  targets = jax.random.randint(jax.random.PRNGKey(1), (B_, T_), 0, V_)

  def plain(x, t):  # autodiff of the float32 arithmetic
    log_z, tgt = loss_lib._terms_f32(x, t)
    return jnp.sum(log_z - tgt, axis=1), jnp.sum(log_z ** 2, axis=1)

  got = _logits_grad(loss_lib.row_sums, logits, targets)
  ref = _logits_grad(plain, logits, targets)
  g, r = got(logits), ref(logits)
  assert g.dtype == jnp.bfloat16
  # the same float32 values, each rounded once to bf16 (fused differently): within one bf16 ulp
  np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32),
                             rtol=2.0 ** -7 + 1e-6, atol=0)
  ce, z2 = loss_lib.row_sums(logits, targets)
  ce_ref, z2_ref = plain(logits, targets)
  np.testing.assert_array_equal(ce, ce_ref)
  # XLA's temporaries (CPU): at most one float32 [B, T, V] and a few [B, T] vectors; autodiff holds
  # two float32 [B, T, V].
  spec = jax.ShapeDtypeStruct(logits.shape, logits.dtype)
  temp = lambda f: f.lower(spec).compile().memory_analysis().temp_size_in_bytes
  assert temp(got) <= 4 * logits.size + 16 * B_ * T_ < 8 * logits.size <= temp(ref)


def test_bf16_attention_is_the_float32_one_within_bf16_round_off():
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(k1, (2, 32, 4, 16))
  k, v = jax.random.normal(k2, (2, 32, 2, 16)), jax.random.normal(k3, (2, 32, 2, 16))

  def f(q, k, v):
    return jnp.sum(jnp.sin(attention_lib.causal_attention(q, k, v).astype(jnp.float32)))

  ref = jax.grad(f, (0, 1, 2))(q, k, v)
  bf = lambda x: x.astype(jnp.bfloat16)
  got = jax.grad(f, (0, 1, 2))(bf(q), bf(k), bf(v))
  for r, g in zip(ref, got):
    assert g.dtype == jnp.bfloat16
    # bf16 keeps 8 bits: 2^-8 relative, summed over T = 32 keys
    assert float(jnp.max(jnp.abs(r - g.astype(jnp.float32)))) <= 0.02 * float(jnp.max(jnp.abs(r)))
  out = attention_lib.causal_attention(bf(q), bf(k), bf(v))
  np.testing.assert_allclose(np.asarray(out, np.float32),
                             attention_lib.causal_attention(q, k, v), atol=3e-2)
