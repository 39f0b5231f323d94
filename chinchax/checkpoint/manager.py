"""The checkpoint manager of a run: asynchronous saves, verified restores, fallback.

:class:`Checkpointer` wraps ``ocp.CheckpointManager`` over the train state;
the checks it applies live in :mod:`chinchax.checkpoint.integrity`.
"""

from __future__ import annotations

import json
import logging
import pathlib
import shutil

import jax
import orbax.checkpoint as ocp

from chinchax import console
from chinchax.storage import diskfull
from chinchax.storage import paths as paths_lib
from chinchax.checkpoint.integrity import (CheckpointError, Unusable, check_shapes, first_line,
                                           read_failure, saved_steps, state_sums, verify_sums)


# orbax warnings that say what a run does on purpose: a save waits for the previous one (on a
# bucket, at every save of a short run), a resume after a kill replaces the unfinished save.
_ORBAX_NOISE = ("Waiting for previous save to complete",
                "Removing existing directory since it is not finalized")


class _OrbaxErrors(logging.Filter):
  """Drops orbax's own ERROR records (tracebacks of a failed background write): the
  :class:`Checkpointer` reports the failure once, as one line, where it surfaces; and the
  warnings of :data:`_ORBAX_NOISE`."""

  def filter(self, record: logging.LogRecord) -> bool:
    orbax = "orbax" in record.pathname
    return not (record.levelno >= logging.ERROR and orbax
                or orbax and any(n in str(record.msg) for n in _ORBAX_NOISE)
                or record.name == "asyncio" and "orbax" in record.getMessage())


def _quiet_orbax_errors() -> None:
  for logger in (logging.getLogger("absl"), logging.getLogger("asyncio")):
    if not any(isinstance(f, _OrbaxErrors) for f in logger.filters):
      logger.addFilter(_OrbaxErrors())


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` for the train-state pytree.

  Every save also records a checksum per array of the state (a wrapping
  uint32 sum of its bit patterns: the same on any mesh) in
  ``<directory>.sums.json``; a restore verifies it, and that the state is
  finite, and falls back to the newest intact checkpoint. An unusable
  checkpoint is moved to ``<directory>-unusable/`` with a warning, never deleted.

  ``save_steps`` (``train.save_steps``) are saved besides every ``every``-th
  step and never deleted: orbax's ``save_on_steps`` plus a preservation policy
  keeping the latest ``keep`` and those steps (a trunk's branch points).
  """

  def __init__(self, directory: pathlib.Path, every: int, keep: int,
               save_steps: tuple[int, ...] = ()):
    self.directory = paths_lib.as_path(directory)  # local, or gs:// (orbax takes an epath)
    self.sums_path = self.directory.with_name(self.directory.name + ".sums.json")
    self.save_steps = frozenset(save_steps)
    if self.save_steps:
      policy = ocp.checkpoint_managers.AnyPreservationPolicy([
          ocp.checkpoint_managers.LatestN(n=keep),
          ocp.checkpoint_managers.CustomSteps(sorted(self.save_steps))])
      options = ocp.CheckpointManagerOptions(
          save_interval_steps=every, save_on_steps=self.save_steps, preservation_policy=policy,
          enable_async_checkpointing=True, create=True)
    else:
      options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every,
                                             enable_async_checkpointing=True, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    self._pending = None  # (step, bytes of the state) of the newest save started
    _quiet_orbax_errors()

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, force: bool = False) -> bool:
    """Starts an async save of ``state`` at ``step`` if the interval (or ``force``) says so,
    and records the state's checksums."""
    if not (force or self.manager.should_save(step)):
      return False
    try:
      paths_lib.check_writable_dir(self.directory, "checkpoint directory")
    except paths_lib.PathError as e:
      raise CheckpointError(f"{e}: cannot save step {step}; {self._last_complete()}") from None
    sums = state_sums(state)
    try:
      saved = self.manager.save(step, args=ocp.args.StandardSave(state), force=force)
    except Exception as e:  # noqa: BLE001 — orbax reports a failed earlier async write here
      failed = self._pending[0] if self._pending else step  # that earlier write's step
      raise self._write_error(e, failed) from None
    if saved:
      self._pending = (step, sum(int(x.nbytes) for x in jax.tree.leaves(state)))
      try:
        self._record_sums(step, sums)
      except OSError as e:
        if not diskfull.is_disk_full(e):
          raise
        raise self._write_error(e, step) from None
    return saved

  def _write_error(self, e: Exception, step: int) -> Exception:
    """The one-line error of a failed write of the checkpoint of ``step``: DiskFull (naming
    the space a checkpoint needs; its partial files removed) or CheckpointError."""
    last = self._last_complete()
    if diskfull.is_disk_full(e):
      free = diskfull.free_bytes(self.directory)  # before the partial checkpoint is removed
      if jax.process_index() == 0 and not paths_lib.is_url(self.directory):
        for partial in self.directory.glob("*.orbax-checkpoint-tmp*"):
          shutil.rmtree(partial, ignore_errors=True)
      needed = self._pending[1] if self._pending else None
      return diskfull.disk_full(f"saving the checkpoint of step {step}", self.directory,
                                needed, then=last, free=free)
    return CheckpointError(f"saving the checkpoint of step {step} in {self.directory} failed "
                           f"({first_line(e)}); {last}")

  def _last_complete(self) -> str:
    """Where the newest complete checkpoint is, in words (after pending writes end)."""
    try:
      self.manager.wait_until_finished()
    except Exception:  # noqa: BLE001 — the failed write is reported by the caller
      pass
    steps = saved_steps(self.directory.parent, self.directory.name)
    return (f"the last complete checkpoint is step {steps[-1]} in {self.directory}" if steps
            else "no checkpoint is complete")

  def _saved_sums(self) -> dict:
    try:
      return json.loads(self.sums_path.read_text())
    except (OSError, ValueError):
      return {}

  def _record_sums(self, step: int, sums: list[int]) -> None:
    if jax.process_index() != 0:
      return
    keep = {str(s) for s in self.manager.all_steps()} | {str(step)}
    table = {k: v for k, v in self._saved_sums().items() if k in keep}
    table[str(step)] = sums
    paths_lib.write_text_atomic(self.sums_path, json.dumps(table))

  def restore_latest(self, abstract_state, shardings):
    """Restores the newest intact checkpoint onto ``shardings``, or returns None when there is none.

    The checkpoint may come from another mesh or device count: every array is
    read straight into the sharding given here. A checkpoint whose files are
    truncated, missing or altered (checksum mismatch), or whose state is not
    finite, is moved to ``<directory>-unusable/`` with a warning naming it,
    and the next older one is tried.

    Raises:
      CheckpointError: an array's shape or dtype, or the set of arrays, differs
        from ``abstract_state`` (a different model), or no checkpoint is
        intact; nothing is read or written.
    """
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract_state, shardings)
    unusable = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        self.check_shapes(step, abstract_state)
        try:
          state = self.manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as e:  # noqa: BLE001 — orbax / tensorstore: any read failure
          raise Unusable(f"unreadable: {read_failure(e)}") from None
        self._verify(step, state)
      except Unusable as e:
        unusable.append((step, str(e)))
        continue
      self._set_aside(unusable, step)
      return state
    if unusable:
      raise CheckpointError(
          f"no checkpoint in {self.directory} can be restored: "
          f"{'; '.join(f'step {s} {why}' for s, why in unusable)}; move the directory away to "
          f"start afresh, or use another workdir")
    return None

  def _verify(self, step: int, state) -> None:
    """Raises Unusable when ``state`` differs from its recorded checksums or is not finite."""
    verify_sums(self._saved_sums().get(str(step)), state)

  def _set_aside(self, unusable: list, good_step: int) -> None:
    """Moves unusable checkpoints to ``<directory>-unusable/<step>`` (process 0), warns, reloads."""
    if not unusable:
      return
    aside = self.directory.with_name(self.directory.name + "-unusable")
    for step, why in unusable:
      dest = aside / str(step)
      n = 1
      while dest.exists():
        dest, n = aside / f"{step}-{n}", n + 1
      if jax.process_index() == 0:
        aside.mkdir(parents=True, exist_ok=True)
        paths_lib.move(self.directory / str(step), dest)
      console.warn(f"the checkpoint at step {step} in {self.directory} is {why}; moved to {dest}; "
                   f"resuming from step {good_step}", enabled=jax.process_index() == 0)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # noqa: PLC0415 — multi-process only
      multihost_utils.sync_global_devices("chinchax:checkpoints-set-aside")
    self.manager.reload()

  def check_shapes(self, step: int, abstract_state) -> None:
    """:func:`check_shapes` of this directory's checkpoint at ``step``."""
    check_shapes(self.directory, step, abstract_state)

  def wait_and_close(self) -> None:
    """Waits for pending writes and closes the manager.

    Raises:
      CheckpointError: a pending write failed (e.g. the directory turned read-only).
    """
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 — orbax / tensorstore write errors
      if self._pending:
        raise self._write_error(e, self._pending[0]) from None
      raise CheckpointError(f"writing a checkpoint in {self.directory} failed ({first_line(e)});"
                            f" {self._last_complete()}") from None
    finally:
      try:
        self.manager.close()
      except Exception:  # noqa: BLE001 — already reported above
        pass


