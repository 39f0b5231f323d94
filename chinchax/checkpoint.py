"""Checkpoints: an orbax CheckpointManager over the train state, plus the run's config.

Saves are asynchronous every ``checkpoint_every`` steps and at the end; the
latest ``keep_checkpoints`` are kept. Restore targets carry the shardings of
the current mesh, so the state lands directly sharded. ``config.json`` in the
workdir records the model of the run; a restart whose model differs is refused
before anything is overwritten.
"""

from __future__ import annotations

import json
import pathlib

import jax
import orbax.checkpoint as ocp

MODEL_KEYS = ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "tie_embeddings")


class CheckpointError(ValueError):
  """A checkpoint cannot be used with this config; the message names the mismatch."""


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` for the train-state pytree."""

  def __init__(self, directory: pathlib.Path, every: int, keep: int):
    self.directory = pathlib.Path(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every,
                                           enable_async_checkpointing=True, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, force: bool = False) -> bool:
    """Starts an async save of ``state`` at ``step`` if the interval (or ``force``) says so."""
    return self.manager.save(step, args=ocp.args.StandardSave(state), force=force)

  def restore_latest(self, abstract_state, shardings):
    """Restores the latest checkpoint onto ``shardings``, or returns None when there is none."""
    step = self.manager.latest_step()
    if step is None:
      return None
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract_state, shardings)
    return self.manager.restore(step, args=ocp.args.StandardRestore(target))

  def wait_and_close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _model_signature(config, vocab_size: int | None = None) -> dict:
  sig = {k: config.model[k] for k in MODEL_KEYS}
  if vocab_size is not None:
    sig["vocab_size"] = vocab_size
  return sig


def check_compatible(workdir: pathlib.Path, config) -> None:
  """Refuses to resume in ``workdir`` with a model that differs from the one saved there.

  Raises:
    CheckpointError: naming each mismatched field (saved vs config).
  """
  path = pathlib.Path(workdir) / "config.json"
  if not path.exists() or not (pathlib.Path(workdir) / "checkpoints").exists():
    return
  saved = json.loads(path.read_text()).get("model_signature", {})
  now = _model_signature(config)
  for k, v in saved.items():
    if k == "vocab_size" and config.model.vocab_size == 0:
      continue
    if k in now and now[k] != v:
      raise CheckpointError(
          f"workdir {workdir} holds a checkpoint of a model with model.{k}={v!r}, but the config "
          f"says model.{k}={now[k]!r}; use another workdir or the saved shape")


def write_run_config(workdir: pathlib.Path, config, spec) -> None:
  """Writes ``config.json``: the full config, the resolved model signature and budget."""
  payload = {
      "config": json.loads(config.to_json_best_effort()),
      "model_signature": _model_signature(config, spec.model.vocab_size),
      "budget": {"N": spec.n_params, "n_kind": spec.n_kind, "D": spec.tokens,
                 "steps": spec.steps, "C_6nd": spec.flops_6nd},
  }
  tmp = pathlib.Path(workdir) / "config.json.tmp"
  tmp.write_text(json.dumps(payload, indent=2))
  tmp.replace(pathlib.Path(workdir) / "config.json")
