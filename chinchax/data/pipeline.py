"""Grain random-access pipeline: the batch of a step is a pure function of (seed, step).

The training split is cut into non-overlapping windows of ``seq_len + 1`` tokens
(window i covers tokens [i·seq_len, i·seq_len + seq_len + 1), so consecutive
windows share one token: every token is a target exactly once per epoch).
Windows are shuffled with a seeded permutation per epoch (grain's
``MapDataset.shuffle``; each epoch reseeded), and global sample j of the run is
element j of that sequence. The batch of step s is samples
[s·B, (s+1)·B) with B = global_batch_size; a process that holds rows
[r0, r1) of each global batch reads only those samples. Nothing depends on
how many processes read, or on what was read before: a resume needs only the step.

The windows of a batch are read together (:meth:`TokenSplit.read_windows`, see
:mod:`chinchax.data.reader`), and :meth:`TrainBatches.iterator` reads the next
batches on background threads while a step runs; neither changes which tokens
a batch holds (:meth:`TrainBatches.batch_rowwise` is the window-by-window
reference).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math

import grain
import numpy as np

from chinchax.data import sources as sources_lib
from chinchax.data import store as store_lib


class WindowSource:
  """Random-access source of [seq_len + 1] token windows of one split (grain data source)."""

  def __init__(self, split: store_lib.TokenSplit, seq_len: int):
    self.split = split
    self.seq_len = seq_len
    self.n_windows = max((split.n_tokens - 1) // seq_len, 0)

  def __len__(self) -> int:
    return self.n_windows

  def __getitem__(self, i: int) -> np.ndarray:
    if not 0 <= i < self.n_windows:
      raise IndexError(f"window {i} out of range [0, {self.n_windows})")
    return self.split.read(int(i) * self.seq_len, self.seq_len + 1).astype(np.int32)

  def windows(self, ids) -> np.ndarray:
    """int32 [len(ids), seq_len + 1]: windows ``ids`` read together (equal to ``self[i]`` each)."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if len(ids) and (ids.min() < 0 or ids.max() >= self.n_windows):
      raise IndexError(f"window ids {ids.min()}..{ids.max()} out of range [0, {self.n_windows})")
    read_windows = getattr(self.split, "read_windows", None)  # a split view may lack it
    if read_windows is None:
      return np.stack([self[int(i)] for i in ids]) if len(ids) else np.zeros(
          (0, self.seq_len + 1), np.int32)
    return read_windows(ids * self.seq_len, self.seq_len + 1).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class DataPlan:
  """How much data a run reads: samples, windows per epoch, epochs (may be fractional)."""

  steps: int
  global_batch_size: int
  seq_len: int
  n_windows: int

  @property
  def samples(self) -> int:
    return self.steps * self.global_batch_size

  @property
  def epochs(self) -> float:
    return self.samples / self.n_windows


class TrainBatches:
  """Training batches as a pure function of (seed, step).

  Args:
    split: the training split.
    seq_len: tokens per sequence; samples are [seq_len + 1] windows.
    global_batch_size: B, sequences per step over all processes.
    steps: steps the run will take (sets how many epochs are admitted).
    seed: shuffle seed.
    allow_repeat: admit more than one epoch.
    rows: the (start, stop) rows of each global batch this process reads
      (default: all rows).
  Raises:
    DataError: the split holds fewer windows than one batch, or the run needs
      more than one epoch and ``allow_repeat`` is False (the message says how many).
  """

  def __init__(self, split, seq_len: int, global_batch_size: int, steps: int, seed: int,
               allow_repeat: bool = False, rows: tuple[int, int] | None = None):
    self.source = WindowSource(split, seq_len)
    self.plan = DataPlan(steps=steps, global_batch_size=global_batch_size, seq_len=seq_len,
                         n_windows=len(self.source))
    if self.plan.n_windows < global_batch_size:
      raise sources_lib.DataError(
          f"the training split holds {split.n_tokens} tokens = {self.plan.n_windows} windows of "
          f"seq_len+1={seq_len + 1}, fewer than one batch of global_batch_size={global_batch_size}; "
          f"use a larger corpus or a smaller batch / seq_len")
    if self.plan.epochs > 1.0 and not allow_repeat:
      raise sources_lib.DataError(
          f"the run needs {self.plan.samples} sequences but the training split holds "
          f"{self.plan.n_windows} windows: {self.plan.epochs:.2f} epochs. Set "
          f"--config.data.allow_repeat=True to repeat data, or lower the budget")
    self.global_batch_size = global_batch_size
    self.rows = rows or (0, global_batch_size)
    epochs = max(1, math.ceil(self.plan.epochs))
    # Window index of every global sample: a seeded permutation per epoch.
    self._window_of = (grain.MapDataset.range(self.plan.n_windows).seed(seed).shuffle()
                       .repeat(epochs))
    self._ds = self._window_of.map(self.source.__getitem__)

  def sample_index(self, step: int, row: int) -> int:
    return step * self.global_batch_size + row

  def _window_array(self, step: int) -> np.ndarray:
    r0, r1 = self.rows
    samples = [self.sample_index(step, r) for r in range(r0, r1)]
    getitems = getattr(self._window_of, "_getitems", None)  # grain's batched index lookup
    ids = getitems(samples) if getitems is not None else [self._window_of[i] for i in samples]
    return np.asarray(ids, dtype=np.int64)

  def batch(self, step: int) -> np.ndarray:
    """int32 [rows, seq_len + 1] windows of ``step`` for this process's rows.

    The windows are read together (:meth:`TokenSplit.read_windows`); the result
    equals :meth:`batch_rowwise` bit for bit."""
    return self.source.windows(self._window_array(step))

  def batch_rowwise(self, step: int) -> np.ndarray:
    """:meth:`batch` read one window at a time through grain (the reference path)."""
    r0, r1 = self.rows
    return np.stack([self._ds[self.sample_index(step, r)] for r in range(r0, r1)])

  def window_ids(self, step: int) -> list[int]:
    """The window index behind each of this process's rows of ``step`` (data-order checks)."""
    return [int(i) for i in self._window_array(step)]

  def iterator(self, start_step: int, num_threads: int = 2, prefetch: int = 4):
    """Yields (step, batch) from ``start_step`` on, the next ``prefetch`` batches read ahead on
    ``num_threads`` background threads (a thread reads a whole batch; the order of the yielded
    steps never depends on the threads)."""
    total = self.plan.steps
    pool = concurrent.futures.ThreadPoolExecutor(max(1, num_threads),
                                                 thread_name_prefix="chinchax-batches")
    ahead = collections.deque()
    nxt = start_step
    try:
      for step in range(start_step, total):
        while nxt < total and len(ahead) < max(1, prefetch):
          ahead.append(pool.submit(self.batch, nxt))
          nxt += 1
        yield step, ahead.popleft().result()
    finally:
      for f in ahead:
        f.cancel()
      pool.shutdown(wait=True, cancel_futures=True)


def eval_batches(split, seq_len: int, batch_size: int, n_batches: int, seed: int = 1234,
                 rows: tuple[int, int] | None = None):
  """A fixed list of ``n_batches`` int32 [rows, seq_len + 1] validation batches.

  Windows are drawn without replacement by a fixed seeded permutation; if the
  split holds fewer than ``n_batches`` batches, all whole batches are used.
  ``rows=(r0, r1)`` keeps only those rows of each global batch of
  ``batch_size`` (this process's share; default: all rows).

  Raises:
    DataError: the validation split holds fewer windows than one batch.
  """
  src = WindowSource(split, seq_len)
  if len(src) < batch_size:
    raise sources_lib.DataError(
        f"the validation split holds {split.n_tokens} tokens = {len(src)} windows, fewer than "
        f"one eval batch of {batch_size}; raise data.val_fraction, use a larger corpus, or cut a "
        f"single .txt file into documents with data.txt_documents=paragraph")
  n = min(n_batches, len(src) // batch_size)
  order = grain.MapDataset.range(len(src)).seed(seed).shuffle()
  r0, r1 = rows or (0, batch_size)
  return [src.windows([order[i * batch_size + r] for r in range(r0, r1)]) for i in range(n)]


# Rows of one fixed-window eval call, rounded up to a multiple of the data-parallel size: a
# constant, so runs that differ only in global_batch_size evaluate the very same chunks.
EVAL_CHUNK_ROWS = 64


def eval_chunk_rows(data_parallel: int) -> int:
  """Rows per fixed-window eval chunk: :data:`EVAL_CHUNK_ROWS` rounded up to a multiple of
  ``data_parallel`` (data×fsdp, the mesh axes the rows are split over)."""
  return -(-EVAL_CHUNK_ROWS // data_parallel) * data_parallel


def eval_window_ids(n_available: int, n_windows: int) -> np.ndarray:
  """int64 [n_windows]: window k is ⌊k·W / n⌋ of the W = ``n_available``, evenly spaced, distinct.

  Raises:
    DataError: ``n_windows`` > ``n_available``.
  """
  if n_windows > n_available:
    raise sources_lib.DataError(
        f"train.eval_windows={n_windows} asks for more validation windows than the validation "
        f"split holds ({n_available}); lower train.eval_windows to at most {n_available}, raise "
        f"data.val_fraction, or shorten train.seq_len")
  return np.arange(n_windows, dtype=np.int64) * n_available // n_windows


@dataclasses.dataclass(frozen=True)
class EvalWindows:
  """``train.eval_windows`` fixed validation windows, cut into chunks of ``chunk_rows``.

  The same windows (:func:`eval_window_ids`) for every run on the same store and
  seq_len, whatever its batch size. The last chunk is padded with copies of the
  last window; the padded rows' losses are dropped (:meth:`losses`), so they do
  not enter the mean.

  Attributes:
    window_ids: int64 [n] window indices into the validation split.
    chunk_rows: rows of each global chunk.
    rows: the (r0, r1) rows of every global chunk this process feeds.
    chunks: host int32 [r1 - r0, seq_len + 1] per chunk, ceil(n / chunk_rows) of them.
  """

  window_ids: np.ndarray
  chunk_rows: int
  rows: tuple[int, int]
  chunks: list

  @property
  def n_windows(self) -> int:
    return int(self.window_ids.shape[0])

  def losses(self, chunk_losses) -> np.ndarray:
    """float64 [n]: per-window losses from the chunks' [chunk_rows] losses (padding dropped)."""
    return np.concatenate([np.asarray(c, dtype=np.float64) for c in chunk_losses])[
        : self.n_windows]


def eval_windows(split, seq_len: int, n_windows: int, chunk_rows: int,
                 rows: tuple[int, int] | None = None) -> EvalWindows:
  """The :class:`EvalWindows` of ``n_windows`` evenly spaced [seq_len + 1] validation windows.

  Args:
    split: the validation split.
    seq_len: tokens per sequence.
    n_windows: windows to evaluate (> 0).
    chunk_rows: rows per global chunk (:func:`eval_chunk_rows`).
    rows: this process's rows [r0, r1) of every chunk (default: all).

  Raises:
    DataError: the split holds fewer than ``n_windows`` windows (both numbers named).
  """
  src = WindowSource(split, seq_len)
  ids = eval_window_ids(len(src), n_windows)
  n_chunks = -(-n_windows // chunk_rows)
  padded = np.concatenate([ids, np.full(n_chunks * chunk_rows - n_windows, ids[-1])])
  r0, r1 = rows or (0, chunk_rows)
  chunks = [src.windows(padded[c * chunk_rows + r0:c * chunk_rows + r1])
            for c in range(n_chunks)]
  return EvalWindows(window_ids=ids, chunk_rows=chunk_rows, rows=(r0, r1), chunks=chunks)
