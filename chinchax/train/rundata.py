"""The data of a run: its token store, training batches and fixed eval batches or windows."""

from __future__ import annotations

import dataclasses
import pathlib

import jax

from chinchax import config as config_lib
from chinchax.runtime import distributed as distributed_lib
from chinchax.data import builder as builder_lib
from chinchax.data import pipeline as pipeline_lib
from chinchax.data import store as store_lib
from chinchax.data import unique as unique_lib
import chinchax.train.spec as spec_lib


@dataclasses.dataclass(frozen=True)
class RunData:
  """The token store of a run and its train/eval batches (this process's rows).

  Attributes:
    directory: the token store's directory.
    train_split, val_split: the store's splits.
    batches: the training batches, a pure function of (seed, step).
    evals: the fixed eval batches, host int32 [b, T+1] each (``train.eval_windows`` = 0).
    windows: the fixed eval windows (``train.eval_windows`` > 0; then ``evals`` is empty).
    unique_tokens: tokens of the training split the run reads (``data.unique_tokens``
      rounded to whole documents; the whole split when it is 0).
  """

  directory: pathlib.Path
  train_split: store_lib.TokenSplit
  val_split: store_lib.TokenSplit
  batches: pipeline_lib.TrainBatches
  evals: list
  windows: pipeline_lib.EvalWindows | None = None
  unique_tokens: int = 0

  def train_bits_per_byte(self, nats: float) -> float:
    return store_lib.bits_per_byte(nats, self.train_split.n_tokens, self.train_split.n_bytes)

  def val_bits_per_byte(self, nats: float) -> float:
    return store_lib.bits_per_byte(nats, self.val_split.n_tokens, self.val_split.n_bytes)


def prepare_data(config, spec: spec_lib.RunSpec, rows: tuple[int, int] | None = None,
                 on_scan=None, eval_rows: tuple[int, int] | None = None) -> RunData:
  """Builds/loads the store and the train/eval pipelines; raises DataError before any compile.

  In a multi-process run process 0 builds the token store first while the others
  wait, then they load it (or, on a host without the shared filesystem, build
  their own copy).

  Args:
    rows: the rows [r0, r1) of every global train and eval batch this process
      reads (default: an equal contiguous share by process index).
    on_scan: called with the corpus fingerprint before the store is built
      (``builder.build``).
    eval_rows: with ``train.eval_windows`` > 0, the rows [r0, r1) of every
      eval chunk (``pipeline.eval_chunk_rows`` rows) this process reads
      (default: an equal contiguous share by process index).

  Raises:
    DataError: see ``builder.prepare``, ``pipeline.TrainBatches`` and
      ``pipeline.eval_batches``; with ``train.eval_windows`` > 0, a validation
      split of fewer windows (``pipeline.eval_windows``); a ``data.unique_tokens`` the
      split or the run cannot take (``unique.check_config``, ``unique.check_reads``).
  """
  unique_lib.check_config(config.data, config.train)  # before the store is built
  with distributed_lib.process_zero_first("chinchax:token-store"):
    directory = builder_lib.prepare(
        config.data, progress=config.train.progress and jax.process_index() == 0,
        on_scan=on_scan)
  read = dict(reader=config.data.store_reader, cache_mb=config.data.store_cache_mb)
  train_split = store_lib.TokenSplit(directory, "train", **read)
  val_split = store_lib.TokenSplit(directory, "val", **read)
  if rows is None:
    per_proc = spec.global_batch_size // jax.process_count()
    rows = (jax.process_index() * per_proc, (jax.process_index() + 1) * per_proc)
  read_split, unique = train_split, train_split.n_tokens
  if config.data.unique_tokens or config.data.max_epochs:  # a prefix of whole documents
    starts, lengths = [0], [unique]
    if config.data.unique_tokens:  # data.unique_order: the store's order, or shuffled
      starts, lengths = unique_lib.select_documents(
          unique_lib.document_ends(directory, unique), config.data.unique_tokens,
          config.data.unique_order, config_lib.data_shuffle_seed(config))
      unique = int(sum(lengths))
    unique_lib.check_reads(unique, config.data.unique_tokens, seq_len=spec.seq_len,
                           global_batch_size=spec.global_batch_size, steps=spec.steps,
                           allow_repeat=config.data.allow_repeat,
                           max_epochs=config.data.max_epochs)
    read_split = unique_lib.DocumentsView(train_split, starts, lengths)
  batches = pipeline_lib.TrainBatches(
      read_split, spec.seq_len, spec.global_batch_size, spec.steps,
      config_lib.data_shuffle_seed(config),
      allow_repeat=config.data.allow_repeat, rows=rows)
  if config.train.eval_windows:
    chunk = pipeline_lib.eval_chunk_rows(spec.mesh["data"] * spec.mesh["fsdp"])
    if eval_rows is None:
      per_proc = chunk // jax.process_count()
      eval_rows = (jax.process_index() * per_proc, (jax.process_index() + 1) * per_proc)
    windows = pipeline_lib.eval_windows(val_split, spec.seq_len, config.train.eval_windows,
                                        chunk, rows=eval_rows)
    return RunData(directory, train_split, val_split, batches, [], windows, unique)
  evals = pipeline_lib.eval_batches(val_split, spec.seq_len, spec.global_batch_size,
                                    config.train.eval_batches, rows=rows)
  return RunData(directory, train_split, val_split, batches, evals, unique_tokens=unique)
