"""XLA compiler options of a run's jitted programs (``train.compiler_options``).

``"auto"`` (the default) is chinchax's choice for the backend, ``""`` XLA's own
defaults, anything else an explicit ``name=value,name=value`` list of XLA
``DebugOptions`` fields, passed to ``jax.jit(..., compiler_options=...)``.

On CPU, ``auto`` turns off XLA's YNNPACK dot fusions
(``xla_cpu_experimental_ynn_fusion_type=``), so that dots compile to XLA's own
kernels. Measured on the default ladder's 26 programs (2 transformer layers,
d_model 8…68, 704…3,328 tokens a step, float32, each on one pinned core of a
2-core AMD EPYC with AVX2): their summed step time fell from 843 to 734 s
(0.87×); the largest gained most (d_model 52 at 36×64 tokens: 106.8 → 74.9
ms/step, d_model 68: 143 → 130), the d_model 8…20 ones moved by −12…+25%
each and by −2% summed (179 → 176 s). On a 2-core AVX-512 Xeon (Sapphire Rapids) the
jitted step of d_model 52 at 36×64 tokens went from 47.5 to 32.4 ms, d_model
128 was unchanged, and d_model 8 and 32 were 0.8 ms slower each. Where XLA
does not know the option (another JAX version) or ``XLA_FLAGS`` already sets
it, ``auto`` leaves it alone.
"""

from __future__ import annotations

import functools
import os

import jax

from chinchax import config as config_lib

AUTO = config_lib.COMPILER_OPTIONS_AUTO
# chinchax's options per backend for "auto": {platform: {option: value}}.
AUTO_OPTIONS = {"cpu": {"xla_cpu_experimental_ynn_fusion_type": ""}}


@functools.lru_cache(maxsize=None)
def _accepted(platform: str, items: tuple[tuple[str, str | bool], ...]) -> str | None:
  """None if XLA for ``platform`` compiles a trivial program with these options, else its error."""
  device = jax.local_devices(backend=platform)[0]
  try:
    jax.jit(lambda x: x + 1, compiler_options=dict(items)).lower(
        jax.ShapeDtypeStruct((), jax.numpy.float32,
                             sharding=jax.sharding.SingleDeviceSharding(device))).compile()
  except jax.errors.JaxRuntimeError as e:
    return str(e).splitlines()[0].rstrip(".")
  return None


def _typed(value: str) -> str | bool:
  """A flag-style value for XLA's option parser: true / false in any case → bool (XLA reads
  a string bool only as "True" / "False"), anything else as written."""
  return {"true": True, "false": False}.get(value.lower(), value)


def resolve(text: str, platform: str | None = None) -> dict[str, str | bool]:
  """The options the run's programs are compiled with, checked against this XLA.

  Args:
    text: ``train.compiler_options``.
    platform: the backend of the run's devices (default ``jax.default_backend()``).
  Returns:
    {option: value} for ``jax.jit(compiler_options=...)``: for ``"auto"``, the
    entries of :data:`AUTO_OPTIONS` for ``platform`` that this XLA accepts and
    ``XLA_FLAGS`` does not set; otherwise the parsed list (true / false as bools).
  Raises:
    ConfigError: a malformed list (``config.parse_compiler_options``), or an
      option name or value this XLA rejects (its message quoted), found by
      compiling a one-op program (tens of ms) before any data is read.
  """
  platform = platform or jax.default_backend()
  if text == AUTO:
    flags = os.environ.get("XLA_FLAGS", "")
    return {k: v for k, v in AUTO_OPTIONS.get(platform, {}).items()
            if f"--{k}" not in flags and _accepted(platform, ((k, v),)) is None}
  options = {k: _typed(v) for k, v in config_lib.parse_compiler_options(text).items()}
  if options:
    error = _accepted(platform, tuple(sorted(options.items())))
    if error is not None:
      raise config_lib.ConfigError(
          f"train.compiler_options={text!r} is refused by XLA on {platform}: {error}; fix or "
          f"drop the option ({AUTO!r} = chinchax's defaults, '' = XLA's)")
  return options
