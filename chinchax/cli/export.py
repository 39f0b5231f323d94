"""``chinchax export``: a trained run as HF Llama safetensors."""

from __future__ import annotations

from chinchax import export as export_lib


def main(argv: list[str]) -> int:
  """See ``chinchax export --help``."""
  return export_lib.main(argv)
