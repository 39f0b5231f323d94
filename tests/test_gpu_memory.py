"""The memory model on GPU: the elementwise ops' residuals (the RMSNorms' float32 tensors,
SwiGLU's sigmoid and silu) are recomputed under bf16, on GPU as on TPU; in the residuals JAX
keeps, and against the CUDA plugin's compile (deviceless; skipped without the plugin)."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from chinchax import config as config_lib
from chinchax.aot import search as search_lib
from chinchax.aot import topology
from chinchax.cost import budget
from chinchax.cost import work
from chinchax.model import transformer


def _saved(compute_dtype: str, capsys) -> list[str]:
  """The residuals autodiff keeps for one Block's backward without remat, as JAX prints them
  (``jax.ad_checkpoint.print_saved_residuals``), one line each."""
  import jax.ad_checkpoint
  cfg = transformer.ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, d_ff=96,
                                seq_len=16, compute_dtype=compute_dtype)
  graph, state = nnx.split(transformer.Block(cfg, nnx.Rngs(0)))
  sin, cos = transformer.rope_tables(16, cfg.head_dim, cfg.rope_theta)
  x = jnp.ones((2, 16, 32), jnp.dtype(compute_dtype))

  def loss(state, x):
    return nnx.merge(graph, state)(x, sin, cos).astype(jnp.float32).sum()

  capsys.readouterr()
  jax.ad_checkpoint.print_saved_residuals(loss, state, x)
  return capsys.readouterr().out.splitlines()


def test_bf16_block_keeps_no_float32_activations_for_its_backward(capsys):
  """Under bf16 the RMSNorms' float32 upcast and normalised stream and SwiGLU's sigmoid and
  silu are recomputed in the backward, not kept: every [B, T, D] or [B, T, d_ff] residual is
  bf16 (XLA's GPU compiler kept the float32 ones for every layer of a scanned stack without
  remat, 16·d_model + 4·d_ff bytes per token and layer). Float32 keeps its plain autodiff."""
  low = _saved("bfloat16", capsys)
  big = [r for r in low if r.split(" ")[0].endswith(("[2,16,32]", "[2,16,96]"))]
  assert big and all(r.startswith("bf16[") for r in big), low
  assert not any("sigmoid" in r or "logistic" in r for r in low), low
  f32 = _saved("float32", capsys)  # plain autodiff keeps the norm's rsqrt and the sigmoid
  assert any("rsqrt" in r for r in f32) and not any("rsqrt" in r for r in low), (f32, low)
  # the memory model counts no elementwise residuals on any platform
  shape = budget.ModelShape(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=160,
                            seq_len=32)
  mesh = {"data": 1, "fsdp": 8, "tensor": 1}
  layer = 2 * (4 * 64 + 4 * 4 * 16 + 3 * 160)  # bf16 forward tensors of one layer
  est = work.mesh_memory_per_device(shape, 16, mesh=mesh,
                                    profile=work.ExecutionProfile.for_kind("gpu"))
  assert est.activations == 16 * 32 / 8 * 2 * layer


@pytest.mark.skipif(not topology.cuda_plugin_available(),
                    reason="JAX's CUDA plugin not installed ('.[gpu-aot]')")
def test_gpu_estimate_meets_xla_without_remat():
  """A step whose memory is mostly the saved activations (8 × 512 tokens per device, 4
  scanned layers): the analytic total within 10% of XLA's (0.92 with CUDA plugin 0.10.2:
  XLA 199 MB a device, 315 MB while the elementwise residuals were kept in float32); an
  unrolled stack too."""
  c = config_lib.get_variant("tiny")
  c.model.update(d_model=256, n_heads=2, d_ff=704, n_layers=4, vocab_size=512, remat="none",
                 scan_layers=True)
  c.train.update(global_batch_size=64, seq_len=512)
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  rep, _ = search_lib.compile_cached(c, topology.parse_target("h100x8"), eval_step=False,
                                     cache_dir=None)
  assert rep["fits"], rep["train_step"]
  assert rep["run"]["attention"] in ("cudnn", "xla")
  assert rep["analytic_memory_ratio"] == pytest.approx(1.0, abs=0.1), rep["train_step"]["memory"]
  c.model.scan_layers = False
  rep, _ = search_lib.compile_cached(c, topology.parse_target("h100x8"), eval_step=False,
                                     cache_dir=None)
  assert rep["analytic_memory_ratio"] == pytest.approx(1.0, abs=0.15), rep["train_step"]["memory"]
