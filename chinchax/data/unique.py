"""A unique-data budget: training reads epochs over a fixed set of whole documents of its split.

``data.unique_tokens`` = U > 0 keeps the first documents of the training split
(``data.unique_order=store``: a prefix; ``shuffled``: the first of a seeded
document permutation, a uniform sample) whose tokens (each document's ids and
its EOS, as the store lays them out) add up to U, rounded to the nearest
document boundary (the store records each document's start,
``train_docs.npy``), at least one document. The validation split is
untouched. The kept documents are read as one token sequence
(:class:`DocumentsView`), cut into the windows of
:class:`chinchax.data.pipeline.WindowSource`, none reaching past it; each
epoch is a fresh seeded permutation of them (grain's shuffle, reseeded per
epoch), and the batch of a step stays a pure function of (seed, step).

A run records ``unique_tokens`` (U after rounding; the whole split's tokens
when ``data.unique_tokens`` = 0), ``epochs`` = tokens trained / U and
``repeated_tokens`` = max(0, tokens trained - U): the quantities of the
data-constrained scaling law (Muennighoff et al. 2023, "Scaling Data-Constrained
Language Models", Sec. 3: D = U + repeated tokens).
"""

from __future__ import annotations

import numpy as np

from chinchax.data import remote as remote_lib
from chinchax.data import sources as sources_lib


UNIQUE_ORDERS = ("store", "shuffled")  # data.unique_order


class DocumentsView:
  """Documents of a :class:`chinchax.data.store.TokenSplit` read as one token sequence.

  Segment k is the split's tokens [starts[k], starts[k] + lengths[k]); the view
  is their concatenation in the given order. Has what the window pipeline reads
  of a split: ``n_tokens``, ``read``, ``read_windows``, ``all_tokens``,
  ``manifest``, ``directory``.

  Args:
    split: the training split.
    starts, lengths: int [k] segment offsets and token counts.
  """

  def __init__(self, split, starts, lengths):
    self.split = split
    self.starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    self.n_tokens = int(self.offsets[-1])
    self.manifest, self.directory = split.manifest, split.directory

  @property
  def contiguous(self) -> bool:
    """One segment from the split's first token: the view is a prefix of the split."""
    return len(self.starts) == 1 and self.starts[0] == 0

  def read(self, start: int, length: int) -> np.ndarray:
    """Tokens [start, min(start + length, n_tokens)) of the view."""
    stop = min(start + length, self.n_tokens)
    if self.contiguous:
      return self.split.read(start, max(0, stop - start))
    pieces, pos = [], start
    while pos < stop:
      k = int(np.searchsorted(self.offsets, pos, side="right")) - 1
      take = min(stop, int(self.offsets[k + 1])) - pos
      pieces.append(self.split.read(int(self.starts[k]) + pos - int(self.offsets[k]), take))
      pos += take
    return np.concatenate(pieces) if pieces else self.split.read(0, 0)

  def read_windows(self, starts, length: int) -> np.ndarray:
    """Tokens [s, s + length) for each s of ``starts`` [n], all inside the view: [n, length]
    (``read`` row by row; a prefix reads through the split's batched reader).

    Raises:
      IndexError: a window reaches past the view.
    """
    starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    if len(starts) and starts.max() + length > self.n_tokens:
      raise IndexError(f"a window of {length} tokens at {starts.max()} reaches past the "
                       f"{self.n_tokens} tokens kept")
    if self.contiguous and hasattr(self.split, "read_windows"):
      return self.split.read_windows(starts, length)
    if not len(starts):
      return np.zeros((0, length), self.split.read(0, 0).dtype)
    return np.stack([self.read(int(s), length) for s in starts])

  def all_tokens(self) -> np.ndarray:
    return self.read(0, self.n_tokens)


def PrefixSplit(split, n_tokens: int) -> DocumentsView:  # noqa: N802 — a view's constructor
  """The first ``n_tokens`` tokens of ``split`` as a :class:`DocumentsView`."""
  return DocumentsView(split, [0], [n_tokens])


def select_documents(ends: np.ndarray, unique_tokens: int, order: str = "store",
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """The documents a unique-data budget keeps: (starts, lengths), int64 [k] each, in reading order.

  ``order="store"``: the first documents of the split (one segment, a prefix);
  ``"shuffled"``: the first documents of a permutation of them seeded by ``seed``
  (a uniform sample of whole documents; a larger U keeps a superset). Either
  way their tokens add up to ``unique_tokens`` rounded to the nearest
  document boundary of that order (:func:`prefix_tokens`).

  Args:
    ends: int64 [n_docs] document ends (:func:`document_ends`).
  Raises:
    DataError: ``unique_tokens`` exceeds the split; an unknown ``order``.
  """
  if order not in UNIQUE_ORDERS:
    raise sources_lib.DataError(f"data.unique_order={order!r} is not one of "
                                f"{', '.join(map(repr, UNIQUE_ORDERS))}")
  n_tokens = int(ends[-1])
  starts_all = np.concatenate([[0], ends[:-1]]).astype(np.int64)
  lengths_all = ends - starts_all
  idx = (np.arange(len(ends)) if order == "store"
         else np.random.default_rng(seed).permutation(len(ends)))
  cum = np.cumsum(lengths_all[idx])
  kept = prefix_tokens(cum, n_tokens, unique_tokens)
  if order == "store":
    return np.zeros(1, np.int64), np.array([kept], np.int64)
  k = int(np.searchsorted(cum, kept)) + 1
  return starts_all[idx[:k]], lengths_all[idx[:k]]


def document_ends(directory, n_tokens: int) -> np.ndarray:
  """int64 [n_docs]: the end offset of each training document (the next one's start; the last
  ends at ``n_tokens``), from the store's ``train_docs.npy``."""
  starts = remote_lib.load_npy(directory / "train_docs.npy").astype(np.int64)
  return np.append(starts[1:], np.int64(n_tokens))


def min_unique_tokens(global_batch_size: int, seq_len: int) -> int:
  """Tokens a prefix needs for one batch of distinct windows: B·T + 1 (B windows of T + 1
  tokens, neighbours sharing one)."""
  return global_batch_size * seq_len + 1


def check_config(d, t) -> None:
  """Checks ``data.unique_tokens`` / ``data.max_epochs`` of a run config (data section ``d``,
  train section ``t``) before any data is read.

  Raises:
    DataError: not a non-negative integer / number, an unknown ``data.unique_order``, or a U
      below one batch (:func:`min_unique_tokens`).
  """
  u, m = d.unique_tokens, d.max_epochs
  if d.unique_order not in UNIQUE_ORDERS:
    raise sources_lib.DataError(f"data.unique_order={d.unique_order!r} is not one of "
                                f"{', '.join(map(repr, UNIQUE_ORDERS))}")
  if not isinstance(u, int) or isinstance(u, bool) or u < 0:
    raise sources_lib.DataError(f"data.unique_tokens={u!r} must be an integer >= 0 (tokens of "
                                f"the training split to repeat; 0 = the whole split)")
  if isinstance(m, bool) or not isinstance(m, (int, float)) or not m >= 0:
    raise sources_lib.DataError(f"data.max_epochs={m!r} must be a number >= 0 (0 = no limit)")
  need = min_unique_tokens(t.global_batch_size, t.seq_len)
  if 0 < u < need:
    raise sources_lib.DataError(
        f"data.unique_tokens={u:,} is smaller than one batch: global_batch_size="
        f"{t.global_batch_size} windows of seq_len+1={t.seq_len + 1} tokens need at least "
        f"{need:,} tokens; raise data.unique_tokens to >= {need:,} (or 0 = the whole split)")


def prefix_tokens(ends: np.ndarray, n_tokens: int, unique_tokens: int) -> int:
  """U rounded to the nearest document end (ties: the shorter), at least the first document.

  Args:
    ends: int64 [n_docs] document ends (:func:`document_ends`).
    n_tokens: tokens of the training split.
    unique_tokens: U asked for (> 0).
  Raises:
    DataError: U exceeds the training split.
  """
  if unique_tokens > n_tokens:
    raise sources_lib.DataError(
        f"data.unique_tokens={unique_tokens:,} exceeds the training split's {n_tokens:,} tokens; "
        f"use at most {n_tokens:,} (or 0 = the whole split)")
  i = int(np.searchsorted(ends, unique_tokens))  # ends[i-1] < U <= ends[i]
  if i == 0:
    return int(ends[0])
  lo, hi = int(ends[i - 1]), int(ends[min(i, len(ends) - 1)])
  return lo if unique_tokens - lo <= hi - unique_tokens else hi


def check_reads(unique: int, asked: int, *, seq_len: int, global_batch_size: int, steps: int,
                allow_repeat: bool, max_epochs: float, what: str = "the run") -> float:
  """Checks that a prefix of ``unique`` tokens feeds ``steps`` batches; returns its epochs
  (sequences read / windows of the prefix, as the pipeline counts them).

  Args:
    unique: tokens of the prefix (after rounding to documents).
    asked: ``data.unique_tokens`` as given (named in the messages; 0: the whole split).
    what: the run, for the messages (a ladder names its run).
  Raises:
    DataError: the prefix holds fewer windows than one batch; it would be read more than
      ``max_epochs`` (> 0) times; or more than once without ``allow_repeat``.
  """
  n_windows = max((unique - 1) // seq_len, 0)
  head = (f"data.unique_tokens={asked:,} rounds to {unique:,} tokens of whole documents" if asked
          else f"the training split's {unique:,} tokens")
  if n_windows < global_batch_size:
    raise sources_lib.DataError(
        f"{head} = {n_windows} windows of seq_len+1={seq_len + 1}, fewer than one batch of "
        f"global_batch_size={global_batch_size}; raise data.unique_tokens to at least "
        f"{min_unique_tokens(global_batch_size, seq_len):,} plus a document")
  epochs = steps * global_batch_size / n_windows
  if max_epochs and epochs > max_epochs:
    raise sources_lib.DataError(
        f"{what} reads {epochs:.3g} epochs of it ({head}), more than data.max_epochs="
        f"{max_epochs:g}; raise data.max_epochs or data.unique_tokens, or lower the budget")
  if epochs > 1.0 and not allow_repeat:
    raise sources_lib.DataError(
        f"{what} reads {epochs:.2f} epochs of it ({head}); set --config.data.allow_repeat=True "
        f"to repeat it, or raise data.unique_tokens / lower the budget")
  return epochs


def epoch_fields(tokens: int, unique_tokens: int) -> dict:
  """``unique_tokens`` U, ``epochs`` = tokens / U (float) and ``repeated_tokens`` = tokens beyond
  the first pass, max(0, tokens - U), of a run that trained ``tokens`` tokens."""
  return {"unique_tokens": int(unique_tokens), "epochs": tokens / unique_tokens,
          "repeated_tokens": int(max(0, tokens - unique_tokens))}
