"""The sampler's error type (its own module so every part of ``chinchax.sample`` can raise it)."""

from __future__ import annotations

from chinchax import errors


class SampleError(errors.UserError):
  """A ``chinchax sample`` request that cannot be met; the message names the bad value."""
