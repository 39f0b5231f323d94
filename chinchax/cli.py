"""``chinchax <verb>``: train, ladder, plan, fit, prepare, export, bench.

  chinchax train  [--config configs/train.py:VARIANT] [--config.model.d_model=128 ...]
  chinchax ladder [--config configs/ladder.py:VARIANT] [--config.ladder.c_max=3e12 ...]
  chinchax plan  --flops 1e21 | --hours 48 --hardware v5p-128 | --dollars 5000 --hardware h100x8
  chinchax fit   RESULTS [--approach 1|2|3|all] [--out DIR]
  chinchax prepare [--config configs/train.py:VARIANT] [--config.data.tokenizer=bpe ...]
  chinchax export WORKDIR --format safetensors [--out DIR] [--step N]
  chinchax bench [--config configs/bench.py:VARIANT] [--config.bench.timed_steps=10 ...]

Errors in the user's input (config, data, checkpoint mismatch, multi-process
start-up) print one line ``error: ...`` and exit with status 2 before any
expensive work. A run stopped by SIGTERM saves a checkpoint at the next step
boundary and exits with status 75 (relaunch to resume; ``chinchax.distributed``).
"""

from __future__ import annotations

import os
import re
import pathlib
import sys

VERBS = ("train", "ladder", "plan", "fit", "prepare", "export", "bench")
_REPO_CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "train.py"


def _usage() -> str:
  return __doc__.strip()


def setup_cpu_devices(n: int) -> None:
  """Exposes ``n`` virtual CPU devices (only before JAX's backend starts; no-op for 0)."""
  if n > 0:
    import jax
    jax.config.update("jax_num_cpu_devices", n)


def setup_compilation_cache(path: str) -> None:
  """Turns on JAX's persistent compilation cache at ``path`` (no-op for "").

  Restarts, resumed runs and ladder runs of a repeated shape then skip XLA
  compilation, which dominates short runs on CPU.
  """
  if path:
    import jax
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _parse_config(argv: list[str], default: pathlib.Path, prog: str):
  """Parses ``--config FILE[:VARIANT]`` plus dotted overrides; returns the config or None.

  ``-h``/``--help`` prints usage and the file's variants; any parsing problem
  (unknown key, wrong type, missing file, unknown variant, stray argument)
  prints one ``error:`` line and returns None.
  """
  from absl import flags
  from ml_collections import config_flags

  if any(a in ("-h", "--help", "-help", "--helpfull") for a in argv):
    doc = ""
    if default.exists():
      import ast
      doc = ast.get_docstring(ast.parse(default.read_text())) or ""
    print(f"usage: chinchax {prog.split('-', 1)[1]} [--config {default.relative_to(default.parent.parent)}"
          f":VARIANT] [--config.SECTION.KNOB=VALUE ...]\n\n{doc}\n\nEvery knob, its default and "
          f"a one-line comment: chinchax/config.py.")
    return None
  for i, a in enumerate(argv):  # a missing config file: say so before absl's lazy loader does
    value = a.split("=", 1)[1] if a.startswith("--config=") else (
        argv[i + 1] if a == "--config" and i + 1 < len(argv) else None)
    if value is not None and not os.path.isfile(value.split(":", 1)[0]):
      print(f"error: config file {value.split(':', 1)[0]!r} does not exist (from {os.getcwd()}); "
            f"e.g. --config {default}:VARIANT", file=sys.stderr)
      return None
  fv = flags.FlagValues()
  full_argv = [prog] + argv
  try:
    config_flags.DEFINE_config_file("config", default=str(default) if default.exists() else None,
                                    flag_values=fv, lock_config=True, sys_argv=full_argv,
                                    help_string=f"config file, e.g. {default.name}:VARIANT")
    rest = fv(full_argv)
    config = fv.config
  except Exception as e:  # absl / ml_collections wrap the real cause; show its last line only
    text = str(e).replace("\\n", "\n").replace("\\'", "'")
    lines = [l.strip().strip("'\"") for l in text.strip().splitlines() if l.strip().strip("'\"")]
    if len(lines) >= 2 and lines[-1].startswith("Did you mean"):
      lines = [f"unknown config key {lines[-2]!r}; {lines[-1][0].lower() + lines[-1][1:]}"]
    line = lines[-1] if lines else type(e).__name__
    line = re.sub(r"\('Non-boolean argument to boolean flag', '(.*)'\)",
                  r"'\1' is not a boolean; use True or False", line)
    print(f"error: {line}", file=sys.stderr)
    return None
  if len(rest) > 1:
    print(f"error: unexpected argument(s) {' '.join(rest[1:])!r}; options look like "
          f"--config.SECTION.KNOB=VALUE", file=sys.stderr)
    return None
  if config is None:
    print(f"error: no config given; use --config configs/{default.name}:VARIANT", file=sys.stderr)
  return config


def _run_guarded(fn) -> int:
  """Runs ``fn``; user-input errors become one ``error:`` line and exit status 2.

  A run stopped by a preemption request (after its checkpoint) returns
  ``chinchax.distributed.PREEMPTED_EXIT_CODE`` (75).
  """
  from chinchax import checkpoint as checkpoint_lib
  from chinchax import config as config_lib
  from chinchax import distributed as distributed_lib
  from chinchax.data import sources as sources_lib
  try:
    fn()
  except (config_lib.ConfigError, sources_lib.DataError, checkpoint_lib.CheckpointError,
          distributed_lib.DistributedError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except distributed_lib.Preempted as e:
    import jax
    if jax.process_index() == 0:
      print(str(e), file=sys.stderr)
    return distributed_lib.PREEMPTED_EXIT_CODE
  return 0


def train_main(argv: list[str]) -> int:
  """``chinchax train``: absl flags with an ml_collections config file and dotted overrides."""
  config = _parse_config(argv, _REPO_CONFIG, "chinchax-train")
  if config is None:
    return 2
  from chinchax import config as config_lib
  if _run_guarded(lambda: config_lib.validate(config)):
    return 2
  setup_cpu_devices(config.mesh.num_cpu_devices)
  setup_compilation_cache(config.compile_cache_dir)
  from chinchax import distributed as distributed_lib
  if _run_guarded(lambda: distributed_lib.initialize(config.distributed)):  # before device use
    return 2
  distributed_lib.install_sigterm_handler()
  from chinchax import train as train_lib
  return _run_guarded(lambda: train_lib.train(config))


def ladder_main(argv: list[str]) -> int:
  """``chinchax ladder``: run (or resume) an IsoFLOP ladder, then fit it."""
  config = _parse_config(argv, _REPO_CONFIG.with_name("ladder.py"), "chinchax-ladder")
  if config is None:
    return 2
  from chinchax import config as config_lib
  from chinchax import ladder as ladder_lib
  if _run_guarded(lambda: (ladder_lib.validate_ladder(config.ladder),
                           config_lib.validate(config.train_config))):
    return 2
  setup_cpu_devices(config.train_config.mesh.num_cpu_devices)
  setup_compilation_cache(config.train_config.compile_cache_dir)
  return _run_guarded(lambda: ladder_lib.run_ladder(config))


def prepare_main(argv: list[str]) -> int:
  """``chinchax prepare``: builds (or resumes) the token store of ``config.data``.

  Ctrl-C keeps finished shards and exits with status 130; rerun to resume.
  """
  config = _parse_config(argv, _REPO_CONFIG, "chinchax-prepare")
  if config is None:
    return 2
  from chinchax import config as config_lib
  from chinchax.data import builder
  if _run_guarded(lambda: config_lib.validate(config)):
    return 2
  try:
    return _run_guarded(lambda: builder.run_prepare(config))
  except KeyboardInterrupt:
    return 130


def main(argv: list[str] | None = None) -> int:
  """Entry point of the ``chinchax`` command; Ctrl-C exits with status 130 and one line."""
  try:
    return _main(argv)
  except KeyboardInterrupt:
    print("\ninterrupted; rerun the same command to resume from the last checkpoint",
          file=sys.stderr)
    return 130


def _main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(_usage())
    return 0 if argv else 2
  verb, rest = argv[0], argv[1:]
  if verb == "train":
    return train_main(rest)
  if verb == "ladder":
    return ladder_main(rest)
  if verb == "plan":
    from chinchax import plan
    return plan.main(rest)
  if verb == "fit":
    from analysis import cli as analysis_cli
    return analysis_cli.main(rest)
  if verb == "prepare":
    return prepare_main(rest)
  if verb == "export":
    from chinchax import export
    return export.main(rest)
  if verb == "bench":
    from chinchax import bench
    return bench.main(rest)
  print(f"error: unknown verb {verb!r}; known: {', '.join(VERBS)}\n\n{_usage()}", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
