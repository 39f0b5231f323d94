"""The CPU collective timeouts a default run (8 virtual CPU devices) starts with: long enough for
a loaded host, real XLA flags (an unknown one aborts the backend), and a user's own value kept."""

import os
import subprocess
import sys

from chinchax.runtime import jax_settings as runtime

_SCRIPT = """
import os
from chinchax.runtime import jax_settings as runtime
runtime.setup_cpu_devices(8)
print(os.environ["XLA_FLAGS"])
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("d",))
x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))
print(float(jax.jit(lambda v: v.sum())(x)))  # an all-reduce across the 8 device threads
"""


def test_default_run_gets_long_collective_timeouts_and_a_user_value_wins():
  user = "--xla_cpu_collective_call_terminate_timeout_seconds=7"
  env = dict(os.environ, XLA_FLAGS=user, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]  # every flag is one XLA knows
  flags, total = out.stdout.split("\n")[:2]
  assert float(total) == 28.0
  assert user in flags and "terminate_timeout_seconds=3600" not in flags
  for name, value in runtime.CPU_COLLECTIVE_FLAGS.items():
    if name not in user:
      assert f"--{name}={value}" in flags
  assert runtime.CPU_COLLECTIVE_FLAGS["xla_cpu_collective_call_terminate_timeout_seconds"] >= 600


def test_set_xla_flags_adds_only_what_is_missing():
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --a_flag=1"}
  runtime.set_xla_flags({"a_flag": 2, "b_flag": 3}, env)
  assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8 --a_flag=1 --b_flag=3"
