"""Starting a fresh run from another run's checkpoint (``train.init_from``).

:func:`check_init_source` checks the source against this run before any data
is read; :func:`restore_init_source` reads its full state (params, optimizer,
step), verified by the checksums the source recorded.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import orbax.checkpoint as ocp

from chinchax.storage import paths as paths_lib
from chinchax.checkpoint.integrity import (CheckpointError, Unusable, check_shapes, read_failure,
                                           saved_steps, verify_sums)
from chinchax.checkpoint.run_config import MODEL_KEYS, model_signature

# Settings a run started from another run's checkpoint (``train.init_from``) must share with it,
# besides the model signature and the tokenizer's hash: what one step reads. (Schedule, budget,
# optimizer hyper-parameters and the corpus may differ: a cooldown has its own.)
INIT_KEYS = ("train.seq_len", "train.global_batch_size", "data.tokenizer")


@dataclasses.dataclass(frozen=True)
class InitSource:
  """A checked ``train.init_from`` checkpoint.

  Attributes:
    directory: the source run's checkpoints directory.
    step: the step of the checkpoint the run starts from.
    tokenizer_sha256: the source run's tokenizer hash (None if it recorded none).
  """

  directory: pathlib.Path
  step: int
  tokenizer_sha256: str | None

  def check_tokenizer(self, tokenizer_sha256: str) -> None:
    """Refuses a run whose tokenizer (content hash) differs from the source's.

    Raises:
      CheckpointError: naming both hashes.
    """
    if self.tokenizer_sha256 is not None and tokenizer_sha256 != self.tokenizer_sha256:
      raise CheckpointError(
          f"train.init_from={str(self.directory.parent)!r} was trained with another tokenizer "
          f"(sha256 {self.tokenizer_sha256[:16]}, this run's {tokenizer_sha256[:16]}): its "
          f"token ids mean other things here; use the source run's data.tokenizer settings")


def init_source_dirs(path) -> tuple[pathlib.Path, pathlib.Path]:
  """(workdir, checkpoints directory) of a ``train.init_from`` path: a run's workdir, or the
  ``checkpoints`` directory inside it."""
  p = paths_lib.resolved(str(path).strip())
  if (p / "checkpoints").is_dir() or not p.is_dir() or (p / "config.json").exists():
    return p, p / "checkpoints"
  return p.parent, p


def has_checkpoints(workdir: pathlib.Path) -> bool:
  """True when ``workdir/checkpoints`` holds a complete checkpoint (a run that resumes)."""
  return bool(saved_steps(workdir))


def check_init_source(config, workdir: pathlib.Path, steps: int, vocab_size: int,
                      tokenizer_sha256: str | None, abstract_state) -> InitSource:
  """Checks ``train.init_from`` / ``train.init_step`` against this run, before any data is read.

  Args:
    config: this run's config.
    workdir: this run's workdir (resolved); it must differ from the source's.
    steps: this run's total steps; the source step must come before the last.
    vocab_size: this run's resolved vocab size.
    tokenizer_sha256: this run's tokenizer hash (None: a BPE still to train;
      then :meth:`InitSource.check_tokenizer` runs once the store is built).
    abstract_state: this run's abstract train state (array paths, shapes, dtypes).
  Returns:
    the source checkpoint (directory and step).
  Raises:
    CheckpointError: the source has no config.json or no checkpoint; the
      step (``train.init_step``, 0 = latest) is not saved there (the saved
      steps are named); the step is not before this run's last; the model
      signature (shape, vocab, tied head, layer layout), seq_len, batch,
      tokenizer or the arrays (optimizer state included) differ.
  """
  t = config.train
  src_workdir, directory = init_source_dirs(t.init_from)
  where = f"train.init_from={t.init_from!r}"
  if src_workdir == paths_lib.resolved(workdir):
    raise CheckpointError(f"{where} is this run's own workdir; give another run's workdir (a "
                          f"run resumes from its own checkpoints without init_from)")
  saved = saved_steps(directory.parent, directory.name)
  if not saved:
    raise CheckpointError(f"{where}: {directory} holds no complete checkpoint; give the workdir "
                          f"of a run that saved one")
  step = t.init_step or saved[-1]
  if step not in saved:
    raise CheckpointError(
        f"{where} has no checkpoint at train.init_step={step}; its saved steps are "
        f"{', '.join(map(str, saved))} (a trunk keeps its branch steps with train.save_steps)")
  if step >= steps:
    raise CheckpointError(
        f"{where} at step {step} is not before this run's last step {steps}: nothing would be "
        f"trained; choose an earlier train.init_step or a larger budget")
  try:
    payload = json.loads((src_workdir / "config.json").read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{where}: {src_workdir / 'config.json'} cannot be read ({e}), so the "
                          f"settings its checkpoints were trained with cannot be checked") from None
  theirs = payload.get("model_signature", {})
  ours = model_signature(config, vocab_size)
  for k in MODEL_KEYS:
    if k in theirs and theirs[k] != ours[k]:
      raise CheckpointError(f"{where} is a model with model.{k}={theirs[k]!r}, but this run has "
                            f"model.{k}={ours[k]!r}; use the source's model settings")
  src_cfg = payload.get("config", {})
  src_trials = {k: src_cfg.get("train", {}).get(k, "") for k in ("lr_multipliers", "trial_seeds")}
  if any(str(v).strip() for v in src_trials.values()):
    raise CheckpointError(f"{where} is a trials run (train.lr_multipliers="
                          f"{src_trials['lr_multipliers']!r}, train.trial_seeds="
                          f"{src_trials['trial_seeds']!r}): its checkpoint stacks several models; "
                          f"continue from a single run (or export one trial)")
  for key in INIT_KEYS:
    old_v, new_v = src_cfg, config
    for part in key.split("."):
      old_v, new_v = (old_v or {}).get(part), new_v[part]
    if old_v != new_v:
      raise CheckpointError(f"{where} was trained with {key}={old_v!r}, but this run has "
                            f"{key}={new_v!r}; a run continued from it must keep it")
  src = InitSource(directory, step, payload.get("data_signature", {}).get("tokenizer_sha256"))
  if tokenizer_sha256 is not None:
    src.check_tokenizer(tokenizer_sha256)
  try:
    check_shapes(directory, step, abstract_state)
  except Unusable as e:
    raise CheckpointError(f"{where}: the checkpoint at step {step} is {e}") from None
  return src


def restore_init_source(src: InitSource, abstract_state, shardings):
  """The full train state (params, optimizer state, step) of ``src`` onto ``shardings``.

  The source directory is opened read-only; the state is verified against the
  per-array checksums the source recorded (``Checkpointer``) and for finiteness.

  Raises:
    CheckpointError: the checkpoint is unreadable, altered or not finite
      (nothing in the source directory is moved or written).
  """
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract_state, shardings)
  where = f"the checkpoint at step {src.step} in {src.directory}"
  try:
    # The item's own handler reads it: nothing is opened for writing in the source directory.
    state = ocp.StandardCheckpointHandler().restore(
        src.directory / str(src.step) / "default", args=ocp.args.StandardRestore(target))
  except Exception as e:  # noqa: BLE001 — orbax / tensorstore: any read failure
    raise CheckpointError(f"{where} is unreadable: {read_failure(e)}") from None
  sums_path = src.directory.with_name(src.directory.name + ".sums.json")
  try:
    sums = json.loads(sums_path.read_text()).get(str(src.step))
  except (OSError, ValueError):
    sums = None
  try:
    verify_sums(sums, state)
  except Unusable as e:
    raise CheckpointError(f"{where} is {e}; it cannot start this run") from None
  return state
