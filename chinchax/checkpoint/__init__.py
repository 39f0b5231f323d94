"""Checkpoints: an orbax CheckpointManager over the train state, plus the run's config.

Saves are asynchronous every ``checkpoint_every`` steps and at the end; the
latest ``keep_checkpoints`` are kept. Restore targets carry the shardings of
the current mesh, so the state lands directly sharded. ``config.json`` in the
workdir records the run: its config, model signature and data signature (the
tokenizer's sha256 and the corpus fingerprint). A restart whose model, data or
any of :data:`RESUME_KEYS` differs is refused before anything is overwritten;
so is a workdir holding checkpoints but no ``config.json`` (what they were
trained with cannot be checked, and cannot be rebuilt from the arrays alone).

A fresh run may start from another run's checkpoint (``train.init_from``,
:func:`check_init_source` then :func:`restore_init_source`): the full state,
step counter included, verified by the same per-array checksums; a trunk keeps
its branch checkpoints with ``train.save_steps`` (``Checkpointer(save_steps=)``).

The package's modules: :mod:`~chinchax.checkpoint.manager` (the Checkpointer),
:mod:`~chinchax.checkpoint.integrity` (checksums, finiteness, array specs),
:mod:`~chinchax.checkpoint.run_config` (config.json and the resume checks),
:mod:`~chinchax.checkpoint.init_source` (``train.init_from``). Their public
names are importable from ``chinchax.checkpoint``.
"""

from __future__ import annotations

from chinchax.checkpoint.init_source import (INIT_KEYS, InitSource, check_init_source,
                                             has_checkpoints, init_source_dirs,
                                             restore_init_source)
from chinchax.checkpoint.integrity import (CheckpointError, all_finite, check_shapes,
                                           state_sums)
from chinchax.checkpoint.manager import Checkpointer
from chinchax.checkpoint.run_config import (DATA_SIGNATURE, MODEL_KEYS, RESUME_KEYS,
                                            check_compatible, check_data_signature, saved_init,
                                            write_run_config)

__all__ = ["CheckpointError", "Checkpointer", "DATA_SIGNATURE", "INIT_KEYS", "InitSource",
           "MODEL_KEYS", "RESUME_KEYS", "all_finite", "check_compatible", "check_data_signature",
           "check_init_source", "check_shapes", "has_checkpoints", "init_source_dirs",
           "restore_init_source", "saved_init", "state_sums", "write_run_config"]
