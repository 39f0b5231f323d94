"""``chinchax <verb>``: train, plan, fit.

  chinchax train [--config configs/train.py:VARIANT] [--config.model.d_model=128 ...]
  chinchax plan  --flops 1e21 | --hours 48 --hardware v5p-128 | --dollars 5000 --hardware h100x8
  chinchax fit   RESULTS [--approach 1|2|3|all] [--out DIR]

Errors in the user's input (config, data, checkpoint mismatch) print one line
``error: ...`` and exit with status 2 before any expensive work.
"""

from __future__ import annotations

import os
import pathlib
import sys

VERBS = ("train", "plan", "fit")
_REPO_CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "train.py"


def _usage() -> str:
  return __doc__.split("\n\n")[0] + "\n\nverbs: " + ", ".join(VERBS)


def setup_cpu_devices(n: int) -> None:
  """Exposes ``n`` virtual CPU devices (only before JAX's backend starts; no-op for 0)."""
  if n > 0:
    import jax
    jax.config.update("jax_num_cpu_devices", n)


def train_main(argv: list[str]) -> int:
  """``chinchax train``: absl flags with an ml_collections config file and dotted overrides."""
  from absl import app, flags
  from ml_collections import config_flags

  default = str(_REPO_CONFIG) if _REPO_CONFIG.exists() else None
  fv = flags.FlagValues()
  full_argv = ["chinchax-train"] + argv
  config_flags.DEFINE_config_file("config", default=default, flag_values=fv,
                                  help_string="config file, e.g. configs/train.py:tiny",
                                  lock_config=True, sys_argv=full_argv)
  try:
    fv(full_argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  config = fv.config
  if config is None:
    print("error: no config given; use --config configs/train.py:VARIANT", file=sys.stderr)
    return 2
  from chinchax import checkpoint as checkpoint_lib
  from chinchax import config as config_lib
  from chinchax.data import sources as sources_lib
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  setup_cpu_devices(config.mesh.num_cpu_devices)
  from chinchax import train as train_lib
  try:
    train_lib.train(config)
  except (config_lib.ConfigError, sources_lib.DataError, checkpoint_lib.CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


def main(argv: list[str] | None = None) -> int:
  """Entry point of the ``chinchax`` command."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(_usage())
    return 0 if argv else 2
  verb, rest = argv[0], argv[1:]
  if verb == "train":
    return train_main(rest)
  if verb == "plan":
    from chinchax import plan
    return plan.main(rest)
  if verb == "fit":
    from analysis import cli as analysis_cli
    return analysis_cli.main(rest)
  print(f"error: unknown verb {verb!r}; known: {', '.join(VERBS)}\n\n{_usage()}", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
