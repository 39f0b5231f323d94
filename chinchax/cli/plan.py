"""``chinchax plan``: a FLOP, time or dollar budget → shape, tokens, batch, steps, loss."""

from __future__ import annotations

from chinchax import plan as plan_lib


def main(argv: list[str]) -> int:
  """See ``chinchax plan --help``."""
  return plan_lib.main(argv)
