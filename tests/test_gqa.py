"""Grouped-query attention (model.n_kv_heads): equal to multi-head with repeated k/v heads,
counted by hand, exported with num_key_value_heads, sharded over tensor, refused when bad."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from chinchax import cli
from chinchax.model import attention
from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.model import sharding as sharding_lib
from chinchax import train as train_lib
from chinchax.checkpoint import CheckpointError
from chinchax.model.transformer import ModelConfig, Transformer, count_params
from chinchax.sample import cache as cache_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
CFG = dict(vocab_size=257, d_model=64, n_layers=2, n_heads=8, d_ff=128)


def _params(model):
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _tokens(B=2, T=24, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, 257, size=(B, T)), jnp.int32)


def test_n_kv_heads_equal_to_n_heads_is_the_multi_head_model_bitwise():
  base = Transformer(ModelConfig(**CFG), nnx.Rngs(params=3))
  full = Transformer(ModelConfig(**CFG, n_kv_heads=8), nnx.Rngs(params=3))
  a, b = jax.tree.leaves(_params(base)), jax.tree.leaves(_params(full))
  assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
  assert base.blocks[0].attn.wk_DHK.shape == (64, 8, 8)
  tokens = _tokens()
  np.testing.assert_array_equal(np.asarray(base(tokens)), np.asarray(full(tokens)))


@pytest.mark.parametrize("G", [1, 2, 4])
@pytest.mark.parametrize("docs", [False, True])
def test_grouped_attention_equals_repeated_kv_reference(G, docs):
  B, T, H, K = 2, 16, 8, 8
  q, k, v = (jax.random.normal(jax.random.key(i), (B, T, n, K)) for i, n in
             enumerate((H, G, G)))
  seg = jnp.asarray(np.cumsum(np.random.default_rng(G).random((B, T)) < 0.2, axis=1)) if docs else None
  got = attention.causal_attention(q, k, v, segment_ids_BT=seg)
  ref = attention.causal_attention(q, jnp.repeat(k, H // G, axis=2), jnp.repeat(v, H // G, axis=2),
                                   segment_ids_BT=seg)
  assert got.shape == (B, T, H, K)
  np.testing.assert_allclose(got, ref, atol=1e-6)


def test_splash_kernel_takes_grouped_kv():
  """The splash MHA kernel (Pallas interpreter) on a (2, 2, 2) mesh: 2 k/v heads against 4 query
  heads, both split over tensor, equal to the xla kernel with repeated k/v heads."""
  pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
  B, T, H, G, K = 4, 128, 4, 2, 8
  q, k, v = (jax.random.normal(jax.random.key(i), (B, T, n, K)) for i, n in enumerate((H, G, G)))
  mesh = sharding_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  put = lambda x, names: jax.device_put(x, jax.sharding.NamedSharding(
      mesh, sharding_lib.logical_to_spec(names, x.shape, mesh)))
  q = put(q, ("batch", "seq", "heads", "kv"))
  k, v = (put(x, ("batch", "seq", "kv_heads", "kv")) for x in (k, v))
  assert k.sharding.spec[2] == "tensor"
  got = jax.jit(lambda q, k, v: attention.splash_attention(q, k, v, interpret=True))(q, k, v)
  ref = attention.causal_attention(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2))
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=2e-6)


def test_gqa_model_equals_multi_head_model_with_repeated_kv_weights():
  gqa = Transformer(ModelConfig(**CFG, n_kv_heads=2), nnx.Rngs(params=0))
  mha = Transformer(ModelConfig(**CFG), nnx.Rngs(params=1))
  p = _params(gqa)
  for i in range(CFG["n_layers"]):
    attn = p["blocks"][i]["attn"]
    for name in ("wk_DHK", "wv_DHK"):
      assert attn[name].shape == (64, 2, 8)
      attn[name] = jnp.repeat(attn[name], 4, axis=1)  # head g serves query heads 4g … 4g+3
  nnx.update(mha, p)
  tokens = _tokens()
  np.testing.assert_allclose(gqa(tokens), mha(tokens), atol=1e-6)


def test_param_and_flop_counts_by_hand():
  cfg = ModelConfig(**CFG, n_kv_heads=2)
  shape = cfg.shape(32)
  # Per layer: q, o 2·64·64 = 8192; k, v 2·64·(2·8) = 2048; SwiGLU 3·64·128 = 24576;
  # norms 2·64 = 128 → 34944. Two layers + final norm 64 = 69952; embedding 257·64 = 16448.
  counts = budget.param_counts(shape)
  assert (counts.non_embedding, counts.embedding, counts.total) == (69952, 16448, 86400)
  assert count_params(Transformer(cfg, nnx.Rngs(params=0))) == counts
  # MFU count: 3 · (2 · (2·34816 matmul weights + 64·257 head) + 2 layers · 2·32·64 causal half).
  assert budget.matmul_flops_per_token(shape) == 3 * (2 * (2 * 34816 + 16448) + 2 * 2 * 32 * 64)
  assert shape.arch()["n_kv_heads"] == 2 and "n_kv_heads" not in ModelConfig(**CFG).shape(32).arch()
  assert budget.ModelShape.from_config({**shape.arch(), "seq_len": 32}, seq_len=32) == shape


def test_bad_n_kv_heads_is_one_error_line(capsys, tmp_path):
  c = config_lib.get_variant("tiny")
  c.model.update(n_heads=4, d_model=32, n_kv_heads=3)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  assert "model.n_kv_heads=3" in str(e.value) and "[1, 2, 4]" in str(e.value)
  assert "\n" not in str(e.value)
  c.model.n_kv_heads = 1  # multi-query: valid, but 1 kv head cannot split over tensor=2
  config_lib.validate(c)
  c.mesh.update(data=4, fsdp=1, tensor=2)
  with pytest.raises(config_lib.ConfigError, match=r"model.n_kv_heads=1 is not divisible by "
                                                   r"mesh.tensor=2"):
    config_lib.validate(c, n_devices=8)
  assert cli.main(["train", f"--config={REPO}/configs/train.py:tiny",
                   "--config.model.n_kv_heads=-2", f"--config.workdir={tmp_path}/run"]) != 0
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error:") and "n_kv_heads=-2" in err[0]


def _steps(config, devices, n=2):
  spec = train_lib.resolve(config, len(devices))
  program = train_lib.build_program(config, spec, sharding_lib.make_mesh(spec.mesh, devices))
  state = program.init_state()
  rng = np.random.default_rng(0)
  out = []
  for _ in range(n):
    batch = rng.integers(0, 257, (spec.global_batch_size, spec.seq_len + 1)).astype(np.int32)
    state, metrics = program.step(state, batch)
    out.append({k: float(v) for k, v in jax.device_get(metrics).items()})
  return out, state


def test_sharded_gqa_step_equals_unsharded():
  c = config_lib.get_variant("tiny")
  c.model.update(n_heads=4, n_kv_heads=2)
  one, _ = _steps(c, jax.devices()[:1])
  c.mesh.update(data=4, fsdp=1, tensor=2)
  eight, state = _steps(c, jax.devices()[:8])
  wk = state["params"]["blocks"][0]["attn"]["wk_DHK"]
  wk = wk[...] if isinstance(wk, nnx.Variable) else wk
  assert wk.shape == (32, 2, 8) and wk.sharding.spec[1] == "tensor"
  for a, b in zip(one, eight):
    assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], abs=1e-5)


def test_kv_cache_holds_the_grouped_heads():
  model = Transformer(ModelConfig(**CFG, n_kv_heads=2), nnx.Rngs(params=0))
  cache = cache_lib.init_cache(model, batch=2, positions=32)
  assert cache.k_LBSGK.shape == (2, 2, 32, 2, 8)
  tokens = _tokens(T=20)
  logits, _ = cache_lib.forward(model, tokens, cache, 0)
  np.testing.assert_allclose(logits, model(tokens), atol=1e-5)


def test_export_and_resume_guard_of_a_gqa_run(tiny_config, tmp_path, capsys):
  st = pytest.importorskip("safetensors.numpy")
  from chinchax.export import writer as export

  c = tiny_config
  c.model.update(n_heads=4, n_kv_heads=1)
  c.budget.steps = 2
  train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  out = tmp_path / "hf"
  assert cli.main(["export", c.workdir, "--out", str(out), "--verify"]) == 0
  said = capsys.readouterr().out
  hf = json.loads((out / "config.json").read_text())
  assert (hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]) == (4, 1, 8)
  tensors = st.load_file(str(out / "model.safetensors"))
  assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (1 * 8, 32)
  assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 8, 32)
  params, _ = export.load_params(c.workdir)
  tokens = np.random.default_rng(1).integers(0, 257, size=(2, 24))
  ref = export.chinchax_logits(params, export.model_config(export.load_run(c.workdir)), tokens)
  assert np.abs(export.numpy_forward(tensors, hf, tokens) - ref).max() < 1e-4
  assert "verify: ok: max" in said
  c.model.n_kv_heads = 2
  c.budget.steps = 4
  with pytest.raises(CheckpointError, match=r"model.n_kv_heads=1.*model.n_kv_heads=2"):
    train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  c.update_from_flattened_dict({"workdir": str(tmp_path / "continued"),
                                "train.init_from": c.workdir, "train.init_step": 2})
  with pytest.raises(CheckpointError, match=r"model.n_kv_heads=1.*model.n_kv_heads=2"):
    train_lib.train(c, devices=jax.devices()[:1], verbose=False)
