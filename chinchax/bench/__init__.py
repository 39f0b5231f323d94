"""``chinchax bench``: throughput and bottleneck sweep — tokens/s, MFU, memory, cost per point.

  chinchax bench [--config configs/bench.py:VARIANT] [--config.bench.timed_steps=10 ...]
                 [--config.sweeps.size.global_batch_size=8,16,32 ...]

A bench config (``chinchax.config.base_bench_config``) names model shapes
(``models``) and sub-grids (``sweeps``); each sweep's points are the product of
its lists of models, global_batch_size, seq_len, attention implementation,
mesh layout (pure data parallel ``dp``, ``fsdp``, tensor parallel ``tp``, or
mixed ``DATAxFSDPxTENSOR``), remat policy and compute dtype. Every point is a
full training config (``train_config`` with the point's values), and is
measured with the train step of ``chinchax train`` itself: state, shardings,
jitted step and global batches all come from ``train.build_program``, the
builder ``chinchax train`` uses.
Only the input pipeline is left out: batches are random tokens already on
the host.

Per point: compile time (lower + compile of the step), the first step, then
``bench.warmup_steps`` untimed steps and ``bench.timed_steps`` timed steps in
the steady state of the training loop — step i+1 is queued before the devices
are waited on for step i, and each step's time runs from the completion of the
one before to its own — giving the median step time and its spread (min, max,
p10, p90, standard deviation) —, tokens/s, model
FLOPs/s (``budget.matmul_flops_per_token``, the numerator of ``chinchax
train``'s MFU) and MFU against the device peak, peak device memory
(``memory_stats()`` where the backend keeps it, else the compiled memory
analysis), XLA ``cost_analysis()`` FLOPs and bytes accessed per device, and
the cost per million tokens from the price table
(``chinchax/cost/hardware_prices.json``).

Failures are results: a point whose mesh or batch does not fit the devices is
``invalid``; one whose compiled step needs more memory than a device has is
``oom`` without being run (and ``oom`` too if allocation fails); a failed
compile is ``compile_error``; with ``bench.isolate`` (each point in its own
process) a crash is ``crashed`` and a hang past ``bench.point_timeout_s`` is
``timeout``.

Outputs in ``workdir``: ``results.jsonl`` and ``results.csv`` (one row per
point), ``summary.md``, ``bench.json`` (devices, peak, price, step-time fits),
``tokens_per_s_vs_batch.png``, ``mfu_vs_size.png``, ``memory_vs_batch.png``
and, when ``bench.fit_sweep`` names a sweep, ``step_time.json`` — the step
times of that sweep in the format ``chinchax plan --step-time-model`` reads
(``chinchax.cost.step_time``). Two step-time models are scored on held-out points
of that sweep: t = t0 + a·FLOPs, and t = t0 + a·FLOPs + b·bytes ("Time
Matters", Inbar & Sernau 2024), each with the analytic features of
``chinchax.cost.work`` (what ``plan`` uses) and with XLA's own cost analysis.

Modules: :mod:`~chinchax.bench.points` (the grid, each point's config, the
config check), :mod:`~chinchax.bench.measure` (one point timed),
:mod:`~chinchax.bench.memory` (limits, needs, peaks, OOM errors),
:mod:`~chinchax.bench.probe` (devices, peak, price),
:mod:`~chinchax.bench.isolate` (child processes), :mod:`~chinchax.bench.sweep`
(the run and its tables), :mod:`~chinchax.bench.stepfit` (step-time models),
:mod:`~chinchax.bench.report` and :mod:`~chinchax.bench.plots` (summary.md, PNGs).
"""

from chinchax.bench.measure import STATUSES, measure_point
from chinchax.bench.memory import compiled_memory_bytes, device_memory_limit, is_oom, peak_memory
from chinchax.bench.plots import write_plots
from chinchax.bench.points import (MESH_LAYOUTS, SWEEP_FIELDS, Point,
                                   expand_points, parse_mesh, point_config, validate_bench)
from chinchax.bench.probe import probe
from chinchax.bench.report import format_row, summary_markdown
from chinchax.bench.stepfit import fit_step_time, heldout_indices
from chinchax.bench.sweep import CSV_COLUMNS, run_bench, write_tables

__all__ = [
    "CSV_COLUMNS", "MESH_LAYOUTS", "STATUSES", "SWEEP_FIELDS", "Point",
    "compiled_memory_bytes", "device_memory_limit", "expand_points", "fit_step_time",
    "format_row", "heldout_indices", "is_oom", "measure_point",
    "parse_mesh", "peak_memory", "point_config", "probe", "run_bench", "summary_markdown",
    "validate_bench", "write_plots", "write_tables",
]
