"""Training: the run spec, the optimizer, the one state+step builder, metrics and the loop.

``train(config)`` validates the config, settles the budget (N, D, C, steps),
builds or loads the token store, creates the train state directly sharded over
the mesh (eval_shape → shardings → jitted init with out_shardings), resumes
from the latest checkpoint in the workdir, and runs the jitted train step with
explicit in/out shardings and donation. Metrics go to ``metrics.jsonl``; the
loop fetches step t's metrics only after step t+1 is dispatched.

Modules: :mod:`~chinchax.train.spec` (RunSpec, resolve), :mod:`~chinchax.train.optim`
(schedule, decay mask, AdamW chain), :mod:`~chinchax.train.loss` (cross-entropy and
z-loss, whole or in chunks of the sequence), :mod:`~chinchax.train.step` (the pure step with
its microbatches, :func:`build_program`), :mod:`~chinchax.train.mfu` (peak FLOP/s),
:mod:`~chinchax.train.metrics` (metrics.jsonl + TensorBoard), :mod:`~chinchax.train.rundata`
(store and batches), :mod:`~chinchax.train.steplog` (deferred rows, speed),
:mod:`~chinchax.train.evaluate` (eval loss and its s.e.), :mod:`~chinchax.train.summary`
(summary.json, result lines), :mod:`~chinchax.train.trials` (K runs of one shape stepped
by one program: LR multipliers and seeds), :mod:`~chinchax.train.loop` (the run).
"""

from chinchax.train.loop import Diverged, train
from chinchax.train.metrics import MetricsLog, log_spaced_steps
from chinchax.train.mfu import calibrate_cpu_flops, peak_flops
from chinchax.train.optim import lr_schedule, make_optimizer, weight_decay_mask
from chinchax.train.rundata import RunData, prepare_data
from chinchax.train.spec import RunSpec, describe, resolve
from chinchax.train.step import (TrainProgram, build_program, compiled_train_step_cost,
                                 global_batch, loss_terms, make_eval_step, make_train_step)

__all__ = [
    "Diverged", "RunData", "RunSpec", "MetricsLog", "TrainProgram", "build_program", "calibrate_cpu_flops",
    "compiled_train_step_cost", "describe", "global_batch", "log_spaced_steps", "loss_terms",
    "lr_schedule", "make_eval_step", "make_optimizer", "make_train_step", "peak_flops",
    "prepare_data", "resolve", "train", "weight_decay_mask",
]
