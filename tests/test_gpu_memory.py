"""The memory model on GPU: without remat XLA keeps what the elementwise ops save (the RMSNorms'
float32 tensors, SwiGLU's sigmoid and silu), which TPU's compiler recomputes; by hand, and
against the CUDA plugin's compile (deviceless; skipped without the plugin)."""

import pytest

from chinchax import config as config_lib
from chinchax.aot import search as search_lib
from chinchax.aot import topology
from chinchax.cost import budget
from chinchax.cost import work


def test_gpu_keeps_the_elementwise_residuals_without_remat_only():
  shape = budget.ModelShape(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=160,
                            seq_len=32)
  gpu = work.ExecutionProfile.for_kind("gpu", scanned=True)
  tpu = work.ExecutionProfile.for_kind("tpu", scanned=True)
  mesh = {"data": 1, "fsdp": 8, "tensor": 1}
  tokens = 16 * 32 / 8
  # bf16 forward tensors of one layer (flash attention: no probabilities)
  layer = 2 * (4 * 64 + 4 * 4 * 16 + 3 * 160)
  elementwise = 2 * 2 * (4 * 64) + 2 * 2 * 160  # two norms × (x, x/rms) f32; sigmoid, silu bf16
  est = work.mesh_memory_per_device(shape, 16, mesh=mesh, profile=gpu)
  assert est.activations == tokens * 2 * (layer + elementwise)
  for remat in ("dots", "full"):  # remat recomputes them either way
    assert (work.mesh_memory_per_device(shape, 16, mesh=mesh, remat=remat, profile=gpu)
            .activations == work.mesh_memory_per_device(
                shape, 16, mesh=mesh, remat=remat,
                profile=work.ExecutionProfile(2, False, True, logits_bytes=8)).activations)
  assert not tpu.elementwise_residuals
  assert not work.ExecutionProfile.for_kind("gpu").elementwise_residuals  # a Python loop's


@pytest.mark.skipif(not topology.cuda_plugin_available(),
                    reason="JAX's CUDA plugin not installed ('.[gpu-aot]')")
def test_gpu_estimate_meets_xla_without_remat():
  """A step whose memory is mostly the saved activations (8 × 512 tokens per device, 4
  scanned layers): the analytic total within 10% of XLA's (0.94 here; 1.75× short of it
  before the elementwise residuals were counted); an unrolled stack keeps less."""
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
