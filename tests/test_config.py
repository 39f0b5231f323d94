"""Config validation: each bad value gives one clear ConfigError naming it."""

import pytest

from chinchax import config as config_lib
from chinchax.config import ConfigError


def _cfg(**overrides):
  c = config_lib.get_variant("tiny")
  for dotted, value in overrides.items():
    section, _, key = dotted.partition("__")
    if key:
      c[section][key] = value
    else:
      c[section] = value
  return c


def test_defaults_are_valid():
  for name in ("default", "tiny", "small", "125m"):
    config_lib.validate(config_lib.get_variant(name), n_devices=8 if name != "125m" else 8)


@pytest.mark.parametrize("overrides, needle", [
    ({"model__d_model": 30, "model__n_heads": 4}, "d_model=30 is not divisible by model.n_heads=4"),
    ({"train__seq_len": 1}, "train.seq_len=1"),
    ({"budget__mode": "steps", "budget__steps": 0}, "budget.steps=0"),
    ({"budget__mode": "flops", "budget__flops": -1.0}, "budget.flops=-1.0"),
    ({"budget__mode": "tokens_per_param", "budget__tokens_per_param": 0.0}, "budget.tokens_per_param=0.0"),
    ({"budget__mode": "chinchilla"}, "budget.mode='chinchilla' is not one of"),
    ({"model__compute_dtype": "float8"}, "model.compute_dtype='float8'"),
    ({"model__attention": "flash"}, "model.attention='flash'"),
    ({"data__source": "hub"}, "data.source='hub'"),
    ({"data__source": "files", "data__paths": ""}, "needs data.paths"),
    ({"train__peak_lr": 0.0}, "train.peak_lr=0.0"),
    ({"train__b2": 1.0}, "train.b2=1.0"),
])
def test_bad_values_name_themselves(overrides, needle):
  with pytest.raises(ConfigError, match=None) as e:
    config_lib.validate(_cfg(**overrides))
  assert needle in str(e.value)


def test_mesh_fill_and_product():
  c = config_lib.get_variant("tiny")
  c.mesh.update(data=-1, fsdp=4, tensor=1)
  assert config_lib.resolve_mesh_shape(c.mesh, 8) == {"data": 2, "fsdp": 4, "tensor": 1}
  c.mesh.update(data=2, fsdp=2, tensor=1)
  with pytest.raises(ConfigError, match=r"2×2×1 = 4 but there are 8 devices"):
    config_lib.validate(c, n_devices=8)
  c.mesh.update(data=-1, fsdp=3, tensor=1)
  with pytest.raises(ConfigError, match="multiply to 3, which does not divide the 8"):
    config_lib.validate(c, n_devices=8)
  c.mesh.update(data=-1, fsdp=-1, tensor=1)
  with pytest.raises(ConfigError, match="only one mesh axis may be -1"):
    config_lib.validate(c, n_devices=8)


def test_batch_must_divide_data_parallel_size():
  c = config_lib.get_variant("tiny")
  c.train.global_batch_size = 12
  c.mesh.update(data=2, fsdp=4, tensor=1)
  with pytest.raises(ConfigError, match=r"global_batch_size=12 is not divisible by the data-parallel size data×fsdp = 2×4 = 8"):
    config_lib.validate(c, n_devices=8)
  c.mesh.update(data=-1, fsdp=1, tensor=2)  # dp = 4 divides 12
  config_lib.validate(c, n_devices=8)


def test_unknown_variant():
  with pytest.raises(ConfigError, match="unknown config variant 'huge'"):
    config_lib.get_variant("huge")
