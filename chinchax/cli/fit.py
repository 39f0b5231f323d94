"""``chinchax fit``: Approaches 1–3 with bootstrap intervals on a results table."""

from __future__ import annotations

from analysis import cli as analysis_cli


def main(argv: list[str]) -> int:
  """See ``chinchax fit --help``."""
  return analysis_cli.main(argv)
