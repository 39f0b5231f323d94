"""train.compiler_options: parsing, what "auto" compiles to, refusals before any data."""

import pathlib

import jax
import jax.numpy as jnp
import pytest

from chinchax import config as config_lib
from chinchax import train as train_lib
from chinchax.train import compiler

YNN = "xla_cpu_experimental_ynn_fusion_type"


def _dot_program_text(options: dict) -> str:
  f = jax.jit(lambda x, w: jnp.tanh(x @ w) @ w.T, compiler_options=options)
  return f.lower(jnp.ones((256, 64)), jnp.ones((64, 128))).compile().as_text()


def test_parse_lists_and_empty_values():
  assert config_lib.parse_compiler_options("") == {}
  assert config_lib.parse_compiler_options(f" {YNN}= , xla_cpu_enable_fast_math=true") == {
      YNN: "", "xla_cpu_enable_fast_math": "true"}


@pytest.mark.parametrize("text, names", [
    ("fast_math=true", "'fast_math=true'"),
    ("xla_cpu_enable_fast_math", "'xla_cpu_enable_fast_math'"),
    ("XLA_CPU=1", "'XLA_CPU=1'"),
    (f"{YNN}=,{YNN}=", f"names {YNN} twice"),
])
def test_bad_lists_are_one_config_error(text, names):
  c = config_lib.base_config()
  c.train.compiler_options = text
  with pytest.raises(config_lib.ConfigError, match="train.compiler_options") as e:
    config_lib.validate(c)
  assert names in str(e.value)


def test_a_non_string_is_refused():
  with pytest.raises(config_lib.ConfigError, match="must be a string"):
    config_lib.parse_compiler_options(3)


def test_auto_compiles_dots_without_ynn_fusions_on_cpu():
  if "__ynn_fusion" not in _dot_program_text({}):
    pytest.skip("this XLA makes no YNNPACK dot fusions")
  options = compiler.resolve("auto", "cpu")
  assert options == {YNN: ""}
  assert "__ynn_fusion" not in _dot_program_text(options)
  assert compiler.resolve("", "cpu") == {}


def test_bool_values_are_read_in_any_case():
  assert compiler.resolve("xla_cpu_enable_fast_math=false", "cpu") == {
      "xla_cpu_enable_fast_math": False}
  assert compiler.resolve("xla_cpu_enable_fast_math=TRUE", "cpu") == {
      "xla_cpu_enable_fast_math": True}


def test_auto_leaves_an_option_that_xla_flags_sets(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 --{YNN}=dot")
  assert compiler.resolve("auto", "cpu") == {}


def test_program_and_summary_carry_the_options(tiny_config):
  tiny_config.budget.steps = 2
  tiny_config.train.update(compiler_options=f"{YNN}=", eval_every=2, log_every=1)
  summary = train_lib.train(tiny_config, devices=jax.devices()[:1], verbose=False)
  assert summary["compiler_options"] == {YNN: ""}


@pytest.mark.parametrize("text, says", [
    ("xla_no_such_option=1", "No such compile option: 'xla_no_such_option'"),
    (f"{YNN}=sometimes", "'sometimes' is not a valid enum value"),
])
def test_an_option_xla_refuses_stops_the_run_before_data(tiny_config, tmp_path, text, says):
  tiny_config.data.store_root = str(tmp_path / "stores")
  tiny_config.train.compiler_options = text
  with pytest.raises(config_lib.ConfigError, match="refused by XLA") as e:
    train_lib.train(tiny_config, devices=jax.devices()[:1], verbose=False)
  assert says in str(e.value)
  stores = tmp_path / "stores"
  assert not stores.exists() or not any(stores.iterdir())  # no store was built
  assert not pathlib.Path(tiny_config.workdir, "checkpoints").exists()


def test_a_config_saved_without_the_key_compiles_with_auto():
  import ml_collections
  from chinchax.model import sharding as sharding_lib
  c = config_lib.get_variant("tiny")
  c.train = ml_collections.ConfigDict({k: v for k, v in c.train.items()
                                       if k != "compiler_options"})
  spec = train_lib.resolve(c, 1)
  program = train_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh, jax.devices()[:1]))
  assert program.compiler_options == compiler.resolve("auto", "cpu")
