"""The export's error type (its own module so every part of ``chinchax.export`` can raise it)."""

from __future__ import annotations

from chinchax import errors


class ExportError(errors.UserError):
  """The workdir cannot be exported as asked; the message names what is wrong."""


class HFCheckpointError(errors.UserError):
  """An HF directory given as ``train.init_from=hf:DIR`` cannot start a chinchax run; the
  message names the file, key or tensor at fault and what would be valid."""
