"""TensorBoard scalars for a run, written with ``tensorboardX`` next to metrics.jsonl.

Each run writes event files to ``<workdir>/tensorboard/``, so ``tensorboard
--logdir`` pointed at a ladder's root shows its runs as a set
(``<run>/tensorboard``). A metrics row ``{"step": s, "loss": ..., "eval_loss": ...}``
becomes scalars tagged by :func:`tag`: ``train/loss``, ``train/bits_per_byte``,
``eval/loss``, ``eval/bits_per_byte``, ``train/lr``, ``train/grad_norm``,
``perf/tokens_per_s``, ``perf/step_time_s``, ``perf/mfu`` (any other numeric
key goes under ``train/``), at global step ``s``; the row's ``tokens`` is not
a curve. A resumed run purges the steps after its checkpoint, matching
metrics.jsonl.
"""

from __future__ import annotations

import math
import pathlib
import time

from chinchax.storage import paths as paths_lib

TB_DIR = "tensorboard"
_PERF = ("tokens_per_s", "step_time_s", "mfu")
_SKIP = ("step", "tokens")


def tag(key: str) -> str:
  """TensorBoard tag of a metrics-row key: eval_x → eval/x, perf keys → perf/x, else train/x."""
  if key.startswith("eval_"):
    return "eval/" + key[len("eval_"):]
  if key in _PERF:
    return "perf/" + key
  return "train/" + key


class ScalarWriter:
  """Writes metrics rows as TensorBoard scalars.

  Args:
    logdir: the run's event-file directory (created).
    purge_step: on resume, the first step to be rewritten; TensorBoard hides
      older events at or after it. None for a fresh run.
  Raises:
    ImportError: tensorboardX is not installed (it is a chinchax dependency).
  """

  def __init__(self, logdir: pathlib.Path, purge_step: int | None = None):
    from tensorboardX import SummaryWriter

    self.logdir = paths_lib.as_path(logdir)
    self.logdir.mkdir(parents=True, exist_ok=True)
    # An object store rewrites the whole event file at each flush: there, every flush_secs
    # (tensorboardX's writer thread) and at close; locally after every row.
    self._flush_each_row = not paths_lib.is_url(logdir)
    # A nanosecond suffix keeps two writers started within one second in separate files,
    # and in start order (readers load event files sorted by name).
    self._writer = SummaryWriter(str(logdir), purge_step=purge_step, flush_secs=30,
                                 filename_suffix=f".{time.time_ns()}")

  def write(self, row: dict) -> None:
    """Adds every finite numeric value of ``row`` (except step, tokens) at ``row["step"]``."""
    step = int(row["step"])
    for key, value in row.items():
      if key in _SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
        continue
      if math.isfinite(value):
        self._writer.add_scalar(tag(key), float(value), step)
    if self._flush_each_row:
      self._writer.flush()

  def close(self) -> None:
    writers = list((getattr(self._writer, "all_writers", None) or {}).values())
    self._writer.close()
    if not self._flush_each_row:
      # tensorboardX's gs:// writer uploads its buffer again from __del__ (at exit, perhaps
      # after the service is gone): the upload at close was the last one.
      for fw in writers:
        events = getattr(getattr(fw, "event_writer", None), "_ev_writer", None)
        gcs_writer = getattr(getattr(events, "_py_recordio_writer", None), "_writer", None)
        if hasattr(gcs_writer, "blob"):
          gcs_writer.flush = lambda: None
