"""``chinchax prepare``: builds (or resumes) the token store of ``config.data``.

Example:
  chinchax prepare --config.data.source=files --config.data.paths='corpus/*.txt' \\
    --config.data.tokenizer=bpe --config.data.bpe_vocab_size=8192
"""

from __future__ import annotations

from chinchax import config as config_lib
from chinchax.cli import flags as flags_lib
from chinchax.data import builder as builder_lib


def main(argv: list[str]) -> int:
  """Builds the store; Ctrl-C keeps finished shards and exits with status 130 (rerun to resume).

  Raises:
    UserError: bad flags or config, an unreadable or empty corpus.
  """
  config = flags_lib.parse_config(argv, flags_lib.config_file("train.py"), "prepare")
  if config is None:
    return 0
  config_lib.validate(config)
  builder_lib.run_prepare(config)  # Ctrl-C: chinchax.cli prints the one line and exits 130
  return 0
