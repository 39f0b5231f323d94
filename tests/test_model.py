"""Model: parameter counts against the shape formula, logical names, causality, dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from chinchax.cost import budget
from chinchax.model import sharding
from chinchax.model.transformer import ModelConfig, Transformer, count_params

LOGICAL = {"batch", "seq", "embed", "norm", "heads", "kv_heads", "kv", "mlp", "vocab"}


@pytest.mark.parametrize("tied", [True, False])
def test_param_counts_match_shape_formula(tied):
  cfg = ModelConfig(vocab_size=257, d_model=48, n_layers=3, n_heads=3, d_ff=128, tie_embeddings=tied)
  model = Transformer(cfg, nnx.Rngs(params=0))
  built = count_params(model)
  assert built == budget.param_counts(cfg.shape(64))
  # Hand count: per layer 4·48·48 + 3·48·128 + 2·48 = 27,744; + final norm 48.
  assert built.non_embedding == 3 * 27_744 + 48
  assert built.embedding == 257 * 48 * (1 if tied else 2)


def test_every_parameter_has_logical_names():
  cfg = ModelConfig(vocab_size=257, d_model=32, n_layers=2, n_heads=2, d_ff=64, tie_embeddings=False)
  _, params = nnx.split(Transformer(cfg, nnx.Rngs(params=0)), nnx.Param)
  leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
  assert len(leaves) == 2 * 9 + 3
  for v in leaves:
    names = v.get_metadata()["out_sharding"]
    assert len(names) == v.ndim and set(names) <= LOGICAL, names
    sharding.logical_to_spec(tuple(names))  # every name has a rule


def test_causal_and_shapes():
  cfg = ModelConfig(vocab_size=257, d_model=32, n_layers=2, n_heads=4, d_ff=64)
  model = Transformer(cfg, nnx.Rngs(params=1))
  tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 257)
  logits = model(tokens)
  assert logits.shape == (2, 16, 257) and logits.dtype == jnp.float32
  changed = tokens.at[:, 10].set((tokens[:, 10] + 1) % 257)
  logits2 = model(changed)
  np.testing.assert_array_equal(logits[:, :10], logits2[:, :10])
  assert not np.allclose(logits[:, 10:], logits2[:, 10:])


def test_bf16_compute_keeps_fp32_params_and_gives_bf16_logits():
  cfg = ModelConfig(vocab_size=257, d_model=32, n_layers=1, n_heads=2, d_ff=64, compute_dtype="bfloat16")
  model = Transformer(cfg, nnx.Rngs(params=0))
  logits = model(jnp.zeros((1, 8), jnp.int32))
  assert logits.dtype == jnp.bfloat16  # the loss upcasts inside (chinchax.train.loss)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  ref = Transformer(ModelConfig(vocab_size=257, d_model=32, n_layers=1, n_heads=2, d_ff=64),
                    nnx.Rngs(params=0))(jnp.zeros((1, 8), jnp.int32))
  np.testing.assert_allclose(logits, ref, atol=5e-2)


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_policies_give_same_gradients(remat):
  base = dict(vocab_size=257, d_model=32, n_layers=2, n_heads=2, d_ff=64)
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 257)

  def grads(cfg):
    graphdef, params = nnx.split(Transformer(cfg, nnx.Rngs(params=0)), nnx.Param)
    f = lambda p: jnp.mean(nnx.merge(graphdef, p)(tokens) ** 2)
    return jax.tree.leaves(jax.jit(jax.grad(f))(params))  # one compile, not op-by-op eager

  for a, b in zip(grads(ModelConfig(**base)), grads(ModelConfig(**base, remat=remat))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_rules_table_skips_indivisible_dims():
  mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 4})
  assert sharding.logical_to_spec(("vocab", "embed"), (257, 64), mesh) == jax.sharding.PartitionSpec(None, "fsdp")
  assert sharding.logical_to_spec(("embed", "mlp"), (64, 128), mesh) == jax.sharding.PartitionSpec("fsdp", "tensor")
  with pytest.raises(KeyError, match="'experts' has no rule"):
    sharding.logical_to_spec(("experts",))


def _stacked_like(loop_params, scan_model):
  """The loop model's parameters in the scanned model's layout (blocks stacked on axis 0)."""
  state = nnx.state(scan_model, nnx.Param)
  flat_loop = dict(nnx.to_flat_state(loop_params))
  new = {}
  for path, var in nnx.to_flat_state(state):
    if path[0] == "blocks":
      layers = sorted(k for k in loop_params["blocks"].keys())
      value = jnp.stack([flat_loop[("blocks", i) + path[1:]][...] for i in layers])
    else:
      value = flat_loop[path][...]
    assert value.shape == var[...].shape, path
    new[path] = var.replace(value)
  return nnx.from_flat_state(new)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scan_layers_computes_the_same_function(remat):
  """Stacked + nnx.scan vs Python loop: same logits and gradients for the same weights."""
  base = dict(vocab_size=61, d_model=32, n_layers=3, n_heads=4, d_ff=64, remat=remat,
              tie_embeddings=False)
  loop = Transformer(ModelConfig(**base), nnx.Rngs(params=0))
  scan = Transformer(ModelConfig(**base, scan_layers=True), nnx.Rngs(params=1))
  assert count_params(scan) == count_params(loop)
  g_loop, p_loop = nnx.split(loop, nnx.Param)
  g_scan, _ = nnx.split(scan, nnx.Param)
  p_scan = _stacked_like(p_loop, scan)
  tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, 61)
  forward = lambda g: jax.jit(lambda p: nnx.merge(g, p)(tokens))
  np.testing.assert_allclose(forward(g_scan)(p_scan), forward(g_loop)(p_loop), rtol=1e-5,
                             atol=1e-5)

  def grad(graphdef):
    return jax.jit(jax.grad(
        lambda p: jnp.mean(jax.nn.log_softmax(nnx.merge(graphdef, p)(tokens))[..., 0])))

  grads_loop = grad(g_loop)(p_loop)
  grads_scan = grad(g_scan)(p_scan)
  want = _stacked_like(grads_loop, scan)
  for a, b in zip(jax.tree.leaves(grads_scan), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_scan_layers_stacks_with_a_layers_axis():
  cfg = ModelConfig(vocab_size=61, d_model=32, n_layers=3, n_heads=2, d_ff=64, scan_layers=True)
  _, params = nnx.split(Transformer(cfg, nnx.Rngs(params=0)), nnx.Param)
  leaves = jax.tree.leaves(params["blocks"], is_leaf=lambda x: isinstance(x, nnx.Variable))
  assert len(leaves) == 9
  for v in leaves:
    names = v.get_metadata()["out_sharding"]
    assert names[0] == "layers" and v.shape[0] == 3 and len(names) == v.ndim
    assert sharding.logical_to_spec(tuple(names))[0] is None  # layers are never split
  # Layers are initialised independently, not copies of one another.
  wq = params["blocks"]["attn"]["wq_DHK"][...]
  assert not np.allclose(wq[0], wq[1])


@pytest.mark.parametrize("scan_layers", [False, True])
def test_document_mask_keeps_attention_inside_each_document(scan_layers):
  """With document_mask, positions after an EOS do not see the document before it; without, they
  do. A window without EOS computes exactly the causal model."""
  kw = dict(vocab_size=257, d_model=32, n_layers=2, n_heads=4, d_ff=64, scan_layers=scan_layers)
  plain = Transformer(ModelConfig(**kw), nnx.Rngs(params=3))
  masked = Transformer(ModelConfig(**kw, document_mask=True, eos_id=256), nnx.Rngs(params=3))
  a = np.array(jax.random.randint(jax.random.key(1), (2, 24), 0, 256))
  a[:, 9] = 256  # document 0 is positions 0-9 (EOS included), document 1 starts at 10
  b = a.copy()
  b[:, :9] = (b[:, :9] + 17) % 256  # other text in document 0
  la, lb = np.asarray(masked(jnp.asarray(a))), np.asarray(masked(jnp.asarray(b)))
  np.testing.assert_array_equal(la[:, 10:], lb[:, 10:])
  assert np.abs(la[:, :10] - lb[:, :10]).max() > 1e-3
  pa, pb = np.asarray(plain(jnp.asarray(a))), np.asarray(plain(jnp.asarray(b)))
  assert np.abs(pa[:, 10:] - pb[:, 10:]).max() > 1e-3
  no_eos = jnp.asarray(np.where(a == 256, 5, a))
  np.testing.assert_array_equal(np.asarray(masked(no_eos)), np.asarray(plain(no_eos)))


def test_small_init_rule_matches_its_formula_and_reaches_the_params():
  """SmallInit (Nguyen & Salazar 2019): std sqrt(2/(5 d)); GPT-2's 0.02 is that at d ≈ 1000."""
  from chinchax import config as config_lib
  from chinchax.model import transformer as model_lib
  from chinchax.train import spec as spec_lib
  assert model_lib.init_std("small", 0.02, 28) == pytest.approx(0.11952, rel=1e-4)
  assert model_lib.init_std("small", 0.02, 1000) == pytest.approx(0.02)
  assert model_lib.init_std("fixed", 0.05, 28) == 0.05
  with pytest.raises(ValueError, match="model.init='xavier'"):
    model_lib.init_std("xavier", 0.02, 28)
  c = config_lib.base_config()
  c.model.update(init="small", d_model=32, n_heads=2, d_ff=64, n_layers=2)
  cfg = spec_lib.resolve(c, 1).model
  assert cfg.init_std == pytest.approx((2 / (5 * 32)) ** 0.5)
  params = Transformer(cfg, nnx.Rngs(params=0))
  w = np.asarray(params.blocks[0].mlp.w_up_DF[...])
  assert np.std(w) == pytest.approx(cfg.init_std, rel=0.1)
  c.model.init = "xavier"
  with pytest.raises(config_lib.ConfigError, match="model.init"):
    config_lib.validate(c)
