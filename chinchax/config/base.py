"""The base of the config checks: :class:`ConfigError` and the two checks every section uses.

Kept apart from :mod:`chinchax.config.checks` (which re-exports them) so that the section
checks can be split by job without import cycles.
"""

from __future__ import annotations

import math

from chinchax import errors


class ConfigError(errors.UserError):
  """A config value is invalid; the message names the value and what is valid."""


def check_choice(value, choices, name: str) -> None:
  """Raises :class:`ConfigError` unless ``value`` is one of ``choices`` (``name``: the knob)."""
  if value not in choices:
    raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def check_positive(value, name: str, *, allow_zero: bool = False, integer: bool = False) -> None:
  """Raises :class:`ConfigError` unless ``value`` is a finite number (an int with ``integer``,
  never a bool) above 0 (or equal to 0 with ``allow_zero``); ``name``: the knob."""
  ok_type = isinstance(value, int) and not isinstance(value, bool) if integer else (
      isinstance(value, (int, float)) and not isinstance(value, bool))
  if not ok_type or (isinstance(value, float) and not math.isfinite(value)):
    raise ConfigError(f"{name}={value!r} must be a finite {'integer' if integer else 'number'}")
  if value < 0 or (value == 0 and not allow_zero):
    raise ConfigError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")
