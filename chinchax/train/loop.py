"""``train(config)``: one training run (or its resumption) as a short script of named steps.

The loop dispatches step t+1 before fetching step t's metrics, so the host
never waits on the device except at log, eval and checkpoint steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import time

import jax
import numpy as np

from chinchax import budget
from chinchax import checkpoint as checkpoint_lib
from chinchax import config as config_lib
from chinchax import console
from chinchax import distributed as distributed_lib
from chinchax import errors
from chinchax import paths as paths_lib
from chinchax import sharding as sharding_lib
from chinchax.data import builder as builder_lib
from chinchax.data import pipeline as pipeline_lib
from chinchax.data import store as store_lib
from chinchax.data import tokenizers as tokenizers_lib
import chinchax.train.mfu as mfu
import chinchax.train.spec as spec_lib
import chinchax.train.step as step_lib
from chinchax.train.metrics import MetricsLog, log_spaced_steps


class Diverged(errors.UserError):
  """The training loss or gradient norm became NaN/Inf (``train.stop_on_nonfinite``).

  The message names the first non-finite step and the last checkpoint, which
  holds a finite state; nothing non-finite was saved.
  """


@dataclasses.dataclass(frozen=True)
class RunData:
  """The token store of a run and its train/eval batches (this process's rows).

  Attributes:
    directory: the token store's directory.
    train_split, val_split: the store's splits.
    batches: the training batches, a pure function of (seed, step).
    evals: the fixed eval batches, host int32 [b, T+1] each (``train.eval_windows`` = 0).
    windows: the fixed eval windows (``train.eval_windows`` > 0; then ``evals`` is empty).
  """

  directory: pathlib.Path
  train_split: store_lib.TokenSplit
  val_split: store_lib.TokenSplit
  batches: pipeline_lib.TrainBatches
  evals: list
  windows: pipeline_lib.EvalWindows | None = None

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
      split of fewer windows (``pipeline.eval_windows``).
  """
  with distributed_lib.process_zero_first("chinchax:token-store"):
    directory = builder_lib.prepare(
        config.data, progress=config.train.progress and jax.process_index() == 0,
        on_scan=on_scan)
  train_split = store_lib.TokenSplit(directory, "train")
  val_split = store_lib.TokenSplit(directory, "val")
  if rows is None:
    per_proc = spec.global_batch_size // jax.process_count()
    rows = (jax.process_index() * per_proc, (jax.process_index() + 1) * per_proc)
  batches = pipeline_lib.TrainBatches(
      train_split, spec.seq_len, spec.global_batch_size, spec.steps, config.seed,
      allow_repeat=config.data.allow_repeat, rows=rows)
  if config.train.eval_windows:
    chunk = pipeline_lib.eval_chunk_rows(spec.mesh["data"] * spec.mesh["fsdp"])
    if eval_rows is None:
      per_proc = chunk // jax.process_count()
      eval_rows = (jax.process_index() * per_proc, (jax.process_index() + 1) * per_proc)
    windows = pipeline_lib.eval_windows(val_split, spec.seq_len, config.train.eval_windows,
                                        chunk, rows=eval_rows)
    return RunData(directory, train_split, val_split, batches, [], windows)
  evals = pipeline_lib.eval_batches(val_split, spec.seq_len, spec.global_batch_size,
                                    config.train.eval_batches, rows=rows)
  return RunData(directory, train_split, val_split, batches, evals)


class _StepLog:
  """The loop's bookkeeping: deferred metric rows, speed windows, eval loss, progress bar.

  A row for step t is fetched only after step t+1 has been dispatched
  (:meth:`defer` then :meth:`flush`); tokens/s and MFU are measured over the
  steps since the previous logged step, the first (compiling) step excluded.
  """

  def __init__(self, spec, data: RunData, metrics: MetricsLog, bar, flops_per_step: float,
               peak_total: float):
    self.spec, self.data, self.metrics, self.bar = spec, data, metrics, bar
    self.flops_per_step, self.peak_total = flops_per_step, peak_total
    self.eval_loss = float("nan")
    self.eval_loss_se = None  # standard error over the fixed eval windows (train.eval_windows > 0)
    self.timed_steps, self.timed_seconds = 0, 0.0
    self.compile_s = None
    self._pending = None
    self._window_t0, self._window_steps = time.perf_counter(), 0
    self._unchecked = []  # (step, loss, grad_norm) device scalars since the last finiteness check
    self.nonfinite_at = None  # (step, loss, grad_norm) of the first non-finite step seen
    self.warned_nonfinite = False

  def watch(self, step_no: int, metrics) -> None:
    """Keeps step ``step_no``'s loss and grad norm (device scalars: no wait) for :meth:`check`."""
    self._unchecked.append((step_no, metrics["loss"], metrics["grad_norm"]))

  def check(self):
    """(step, loss, grad_norm) of the first non-finite step so far, or None.

    Fetches the scalars kept since the last call in one transfer: called at log
    and checkpoint steps, where the loop waits for the device anyway.
    """
    rows, self._unchecked = self._unchecked, []
    if self.nonfinite_at is None and rows:
      for step_no, loss, grad_norm in jax.device_get(rows):
        if not (math.isfinite(float(loss)) and math.isfinite(float(grad_norm))):
          self.nonfinite_at = (step_no, float(loss), float(grad_norm))
          break
    return self.nonfinite_at

  @property
  def last_train_loss(self) -> float:
    return self.metrics.last_loss

  def stepped(self, state, t_dispatch: float) -> None:
    """After a step's dispatch: the first one is waited for and timed as compilation."""
    if self.compile_s is None:
      jax.block_until_ready(state["step"])
      self.compile_s = time.perf_counter() - t_dispatch
      self.restart_window()
    else:
      self._window_steps += 1
    self.flush()
    self.bar.update(1)

  def speed(self) -> dict:
    """Step time, tokens/s and MFU over the current window (empty if no step was timed)."""
    if not self._window_steps:
      return {}
    dt = time.perf_counter() - self._window_t0
    self.timed_steps += self._window_steps
    self.timed_seconds += dt
    step_time = dt / self._window_steps
    return {"step_time_s": step_time, "tokens_per_s": self.spec.tokens_per_step / step_time,
            "mfu": self.flops_per_step / step_time / self.peak_total}

  def restart_window(self) -> None:
    self._window_t0, self._window_steps = time.perf_counter(), 0

  def defer(self, step_no: int, metrics, extra: dict) -> None:
    self._pending = (step_no, metrics, extra)

  def flush(self) -> None:
    """Writes the deferred row, if any (fetching its metrics from the device)."""
    if self._pending is None:
      return
    step_no, m, extra = self._pending
    self._pending = None
    m = jax.device_get(m)
    loss = float(m["loss"])
    self.metrics.write({"step": step_no, "loss": loss,
                        "bits_per_byte": self.data.train_bits_per_byte(loss),
                        "grad_norm": float(m["grad_norm"]), "lr": float(m["lr"]),
                        **({"z_loss": float(m["z_loss"])} if "z_loss" in m else {}),
                        "tokens": step_no * self.spec.tokens_per_step, **extra})
    self.bar.set_postfix(loss=f"{loss:.3f}", eval=f"{self.eval_loss:.3f}", refresh=False)

  def close(self) -> None:
    self.flush()
    self.metrics.close()
    self.bar.close()


def _evaluate(program: step_lib.TrainProgram, params, evals) -> float:
  """Mean eval cross-entropy (nats/token) over the fixed eval batches."""
  losses = [program.eval_step(params, program.global_batch(b)) for b in evals]
  return float(np.mean(jax.device_get(losses)))


def window_stats(losses) -> tuple[float, float]:
  """(mean, standard error of the mean) of per-window losses, nats/token.

  SE = s / √n with s the sample standard deviation (n - 1 in its denominator)
  of the n per-window mean losses, treating windows as independent draws; NaN
  for one window.
  """
  x = np.asarray(losses, dtype=np.float64)
  se = float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")
  return float(np.mean(x)), se


class _Evaluator:
  """The run's eval: (params) → (mean eval loss, its standard error or None).

  ``train.eval_windows`` = 0: :func:`_evaluate` over the eval batches (no SE).
  Otherwise one jitted per-row eval (``step.jit_eval_rows``) per chunk of the
  fixed windows, all dispatched before one fetch; the padded rows are dropped
  and :func:`window_stats` gives the mean and SE over the windows. With
  ``train.curve_eval_windows`` = k > 0 the evals before the last step (the
  loss-vs-compute curve) read only about k of the windows: whole chunks
  evenly spaced over the set, the same chunks at every step; the final eval
  reads them all.
  """

  def __init__(self, program: step_lib.TrainProgram, data: RunData, curve_windows: int = 0):
    self.program, self.data = program, data
    self._rows = None if data.windows is None else step_lib.jit_eval_rows(program)
    self._curve_chunks = None
    w = data.windows
    if w is not None and 0 < curve_windows < w.n_windows:
      n_full = max(1, w.n_windows // w.chunk_rows)
      k = min(n_full, -(-curve_windows // w.chunk_rows))
      self._curve_chunks = sorted({int(i) for i in np.linspace(0, n_full - 1, k).round()})

  def __call__(self, params, final: bool = True) -> tuple[float, float | None]:
    w = self.data.windows
    if w is None:
      return _evaluate(self.program, params, self.data.evals), None
    sh = self.program.batch_sharding
    idx = range(len(w.chunks)) if final or self._curve_chunks is None else self._curve_chunks
    out = jax.device_get([self._rows(params, step_lib.global_batch(sh, w.chunks[i], w.chunk_rows))
                          for i in idx])
    if len(idx) == len(w.chunks):
      return window_stats(w.losses(out))
    return window_stats(np.concatenate([np.asarray(c, dtype=np.float64) for c in out]))


def _restore_or_init(ckpt: checkpoint_lib.Checkpointer, program: step_lib.TrainProgram,
                     init_src: checkpoint_lib.InitSource | None, workdir: pathlib.Path):
  """(state, resumed, init): the latest checkpoint of this run onto the mesh; else the
  ``train.init_from`` checkpoint's full state; else a fresh sharded state.

  ``init`` is {"from": checkpoints directory, "step": s} when the run started from
  another run's checkpoint (read back from config.json on a resume), else None.
  """
  state = ckpt.restore_latest(program.abstract_state, program.shardings)
  if state is not None:
    return state, True, checkpoint_lib.saved_init(workdir)
  if init_src is not None:
    state = checkpoint_lib.restore_init_source(init_src, program.abstract_state,
                                               program.shardings)
    return state, False, {"from": str(init_src.directory), "step": init_src.step}
  return program.init_state(), False, None


def _run_steps(config, program, data: RunData, state, start_step: int,
               ckpt: checkpoint_lib.Checkpointer, log: _StepLog, say, evaluate: _Evaluator):
  """Runs steps start_step … steps-1: log, eval and checkpoint on their schedules.

  Raises:
    Preempted: a preemption request reached a step boundary; the checkpoint of
      that step is saved and every writer closed first.
  """
  t, spec = config.train, program.spec
  eval_at = log_spaced_steps(spec.steps, t.eval_points, t.eval_points_from)
  for step, local_batch in data.batches.iterator(start_step, num_threads=config.data.read_threads):
    t_dispatch = time.perf_counter()
    state, metrics = program.step(state, program.global_batch(local_batch))
    log.stepped(state, t_dispatch)
    log.watch(step + 1, metrics)
    done = step + 1
    is_last = done == spec.steps
    is_eval = done % t.eval_every == 0 or is_last or done in eval_at
    if done % t.log_every == 0 or is_eval:
      jax.block_until_ready(metrics["loss"])
      extra = log.speed()
      log.defer(done, metrics, extra)  # written at the next step: eval fills ``extra`` first
      _check_finite(config, log, ckpt, done)
      if is_eval:
        log.eval_loss, log.eval_loss_se = evaluate(state["params"], final=is_last)
        extra["eval_loss"] = log.eval_loss
        if log.eval_loss_se is not None:
          extra["eval_loss_se"] = log.eval_loss_se
        extra["eval_bits_per_byte"] = data.val_bits_per_byte(log.eval_loss)
      if is_last or done % t.checkpoint_every == 0 or done in ckpt.save_steps:
        _save(config, log, ckpt, done, state, force=is_last)
      log.restart_window()
    elif done % t.checkpoint_every == 0 or done in ckpt.save_steps:
      _save(config, log, ckpt, done, state)
    if not is_last and distributed_lib.reached_preemption(done):
      log.flush()
      if ckpt.latest_step() != done:
        _save(config, log, ckpt, done, state, force=True)
      _shut_down(ckpt, log)
      say(f"preempted at step {done}: checkpoint saved in {ckpt.directory}")
      raise distributed_lib.Preempted(done, str(ckpt.directory.parent))
  _shut_down(ckpt, log)
  return state


def _save(config, log: _StepLog, ckpt: checkpoint_lib.Checkpointer, done: int, state,
          force: bool = False) -> None:
  """Checks the state is finite, then starts its save (at the interval, or ``force``).

  Raises:
    Diverged: see :func:`_check_finite`.
    CheckpointError: the checkpoint directory cannot be written; the metric
      rows so far are written and the logs closed first.
  """
  _check_finite(config, log, ckpt, done, state)
  try:
    ckpt.save(done, state, force=force)
  except checkpoint_lib.CheckpointError:
    log.close()
    raise


def _check_finite(config, log: _StepLog, ckpt: checkpoint_lib.Checkpointer, done: int,
                  state=None) -> None:
  """Stops the run at a non-finite loss or grad norm, or (``state`` given, before a save) params.

  With ``train.stop_on_nonfinite`` False it warns once and lets the run go on.

  Raises:
    Diverged: after the rows so far are written and the pending (finite)
      checkpoint writes have finished; the non-finite state is not saved.
  """
  bad = log.check()
  what = None
  if bad is not None:
    step_no, loss, grad_norm = bad
    what = f"the loss is {loss} (grad norm {grad_norm}) at step {step_no}"
  elif state is not None and not checkpoint_lib.all_finite(state["params"]):
    what = f"the parameters after step {done} hold NaN/Inf"
  if what is None:
    return
  if not config.train.stop_on_nonfinite:
    if not log.warned_nonfinite:
      log.warned_nonfinite = True
      console.warn(f"{what}; training goes on (train.stop_on_nonfinite=False)",
                   enabled=jax.process_index() == 0)
    return
  _shut_down(ckpt, log)
  last = ckpt.latest_step()
  kept = (f"the last checkpoint, step {last} in {ckpt.directory}, holds a finite state"
          if last is not None else "no checkpoint was saved before it")
  raise Diverged(f"training diverged: {what} (stopped at step {done}, nothing non-finite saved; "
                 f"{kept}); lower train.peak_lr, raise train.warmup_steps or set train.grad_clip,"
                 f" and start in another workdir")


def _shut_down(ckpt: checkpoint_lib.Checkpointer, log: _StepLog) -> None:
  """Writes the last row, waits for checkpoint writes, closes the logs and the bar."""
  log.flush()
  try:
    ckpt.wait_and_close()
  finally:
    log.close()


def _summary(workdir: pathlib.Path, spec, data: RunData, log: _StepLog, *, final_step: int,
             unigram: float, peak_src: str, resumed: bool, wall_s: float,
             init: dict | None = None, compiler_options: dict | None = None) -> dict:
  """The run's summary (also written to ``summary.json``): tokens, N, C, losses, speed.

  ``final_eval_loss_se`` is the standard error of ``final_eval_loss`` over the
  ``eval_windows`` fixed windows (:func:`window_stats`); None when
  ``train.eval_windows`` = 0 (eval batches, no SE).
  """
  train_loss, eval_loss = log.last_train_loss, log.eval_loss
  timed = log.timed_steps > 0
  step_time = log.timed_seconds / log.timed_steps if timed else float("nan")
  manifest = data.train_split.manifest
  return {
      "workdir": str(workdir), "steps": final_step, "tokens": final_step * spec.tokens_per_step,
      "planned_tokens": spec.tokens, "target_tokens": spec.target_tokens,
      "N": spec.n_params, "n_kind": spec.n_kind, "params_total": spec.counts.total,
      "params_non_embedding": spec.counts.non_embedding, "params_embedding": spec.counts.embedding,
      "C_6nd": spec.flops_6nd, "tokens_per_param": spec.tokens_per_param,
      "final_train_loss": train_loss, "final_eval_loss": eval_loss,
      "final_eval_loss_se": _json_float(log.eval_loss_se),
      "eval_windows": 0 if data.windows is None else data.windows.n_windows,
      "final_train_bits_per_byte": data.train_bits_per_byte(train_loss),
      "tokenizer": manifest["tokenizer"]["name"], "val_bytes": data.val_split.n_bytes,
      "eval_tokens": (len(data.evals) * spec.global_batch_size * spec.seq_len
                      if data.windows is None else data.windows.n_windows * spec.seq_len),
      "final_eval_bits_per_byte": data.val_bits_per_byte(eval_loss),
      "val_unigram_entropy_nats": unigram,
      "val_unigram_entropy_bits_per_byte": data.val_bits_per_byte(unigram),
      "eval_below_unigram": 1.0 - eval_loss / unigram,
      "step_time_s": step_time,
      "tokens_per_s": spec.tokens_per_step / step_time if timed else float("nan"),
      "mfu": log.flops_per_step / step_time / log.peak_total if timed else float("nan"),
      "peak_flops": log.peak_total, "peak_flops_source": peak_src,
      "compile_s": log.compile_s, "wall_s": wall_s, "resumed": resumed,
      "mesh": {k: int(v) for k, v in spec.mesh.items()},
      "compiler_options": dict(compiler_options or {}),
      "init_from": (init or {}).get("from", ""), "init_step": (init or {}).get("step", 0),
      "store": str(data.directory), "store_fingerprint": manifest["fingerprint"],
  }


def _json_float(x: float | None) -> float | None:
  """``x``, or None for None or NaN (an SE of one window)."""
  return None if x is None or not math.isfinite(x) else float(x)


# What only a run that took steps measures: a rerun of a finished run keeps the earlier figures.
_SPEED_KEYS = ("step_time_s", "tokens_per_s", "mfu", "compile_s")


def _keep_measured_speed(summary: dict, previous: pathlib.Path) -> dict:
  """``summary`` with the speed figures of ``previous`` (summary.json) when this call timed none."""
  if summary["compile_s"] is not None or not previous.exists():
    return summary
  try:
    old = json.loads(previous.read_text())
  except (OSError, ValueError):
    return summary
  return {**summary, **{k: old[k] for k in _SPEED_KEYS if k in old}}


def _report(s: dict, spec, say) -> None:
  """The result lines: steps and tokens, losses vs the unigram entropy, speed."""
  say(f"done    step {s['steps']}/{spec.steps}, tokens {s['tokens']:,} "
      f"(planned D {spec.tokens:,})")
  se = s["final_eval_loss_se"]
  over = (f" ± {se:.4f} (s.e. over {s['eval_windows']:,} windows)" if se is not None else "")
  say(f"loss    final train {s['final_train_loss']:.4f} nats/token; final eval "
      f"{s['final_eval_loss']:.4f}{over} nats/token = {s['final_eval_bits_per_byte']:.3f} "
      f"bits/byte")
  say(f"        val unigram entropy {s['val_unigram_entropy_nats']:.4f} nats/token = "
      f"{s['val_unigram_entropy_bits_per_byte']:.3f} bits/byte; eval loss is "
      f"{100 * abs(s['eval_below_unigram']):.1f}% "
      f"{'below' if s['eval_below_unigram'] >= 0 else 'above'} it")
  say(f"speed   {s['tokens_per_s']:,.0f} tokens/s, {s['step_time_s'] * 1e3:.1f} ms/step, MFU "
      f"{100 * s['mfu']:.2f}% (peak {s['peak_flops']:.3g} FLOP/s: {s['peak_flops_source']}); "
      f"wall {s['wall_s']:.1f}s")


def train(config, devices=None, verbose: bool = True) -> dict:
  """Runs (or resumes) one training run; returns the summary also written to summary.json.

  Args:
    config: the run's ConfigDict (see ``chinchax.config``).
    devices: devices to build the mesh from (default: all ``jax.devices()``).
    verbose: print the budget, data and result lines (process 0 only).

  Raises:
    ConfigError: invalid config (before any data is read).
    DataError: missing/empty/too-small corpus, or repetition not allowed (before compiling).
    PathError: the workdir or store root cannot be written, or a corpus file
      read (before the token store is built).
    CheckpointError: the workdir's checkpoint does not match the config's model; or
      ``train.init_from`` (used only while the workdir has no checkpoint) names a
      missing step or a run of another model shape, vocab, tokenizer, seq_len or
      batch (before any data is read; see ``checkpoint.check_init_source``).
    Diverged: a non-finite loss, grad norm or state (``train.stop_on_nonfinite``).
    Preempted: a preemption request (SIGTERM) stopped the run at a step
      boundary after a checkpoint was saved (see ``chinchax.distributed``).
  """
  t_start = time.time()
  primary = jax.process_index() == 0
  say = lambda msg: console.say(msg, enabled=verbose and primary)  # noqa: E731
  devices = list(jax.devices() if devices is None else devices)
  spec = spec_lib.resolve(config, len(devices))
  workdir = pathlib.Path(os.path.expanduser(config.workdir)).resolve()
  for path, what in ((workdir, "workdir"), (workdir / "checkpoints", "checkpoint directory")):
    if path == workdir or path.exists():
      paths_lib.check_writable_dir(path, what)
  paths_lib.check_writable_dir(config.data.store_root, "data.store_root")
  mesh = sharding_lib.make_mesh(spec.mesh, devices)
  program = step_lib.build_program(config, spec, mesh)  # shapes and jit wrappers: no compile yet
  tokenizer = tokenizers_lib.make_tokenizer(config.data)
  tokenizer_sha256 = getattr(tokenizer, "digest", None)  # a BPE still to train has none yet
  checkpoint_lib.check_compatible(workdir, config, vocab_size=spec.model.vocab_size,
                                  tokenizer_sha256=tokenizer_sha256,
                                  abstract_state=program.abstract_state)
  init_src = None
  if config.train.init_from.strip() and not checkpoint_lib.has_checkpoints(workdir):
    init_src = checkpoint_lib.check_init_source(
        config, workdir, spec.steps, vocab_size=spec.model.vocab_size,
        tokenizer_sha256=tokenizer_sha256, abstract_state=program.abstract_state)
  say(spec_lib.describe(spec, config, len(devices)))

  rows = distributed_lib.process_row_range(sharding_lib.batch_sharding(mesh),
                                           spec.global_batch_size)
  eval_rows = (distributed_lib.process_row_range(
      sharding_lib.batch_sharding(mesh),
      pipeline_lib.eval_chunk_rows(spec.mesh["data"] * spec.mesh["fsdp"]))
      if config.train.eval_windows else None)
  data = prepare_data(config, spec, rows, on_scan=lambda fp: checkpoint_lib.check_data_signature(
      workdir, "store_fingerprint", fp), eval_rows=eval_rows)
  say(f"data    store {data.directory}: train {data.train_split.n_tokens:,} tokens, val "
      f"{data.val_split.n_tokens:,} tokens; run reads {data.batches.plan.epochs:.3f} epochs")
  if init_src is not None:
    init_src.check_tokenizer(data.train_split.manifest["tokenizer"]["sha256"])
  unigram = store_lib.unigram_entropy_nats(data.val_split.all_tokens(), spec.model.vocab_size)

  workdir.mkdir(parents=True, exist_ok=True)
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", config.train.checkpoint_every,
                                     config.train.keep_checkpoints,
                                     config_lib.parse_save_steps(config.train.save_steps))
  state, resumed, init = _restore_or_init(ckpt, program, init_src, workdir)
  start_step = int(jax.device_get(state["step"]))
  if primary:
    manifest = data.train_split.manifest
    checkpoint_lib.write_run_config(workdir, config, spec, {
        "tokenizer_sha256": manifest["tokenizer"]["sha256"],
        "store_fingerprint": manifest["fingerprint"]}, init=init)
  if resumed:
    say(f"resumed from checkpoint at step {start_step} in {workdir}"
        + (" (train.init_from is ignored: the run goes on from its own checkpoints)"
           if config.train.init_from.strip() else ""))
  elif init:
    say(f"started from the checkpoint at step {init['step']} in {init['from']} "
        f"(train.init_from)")

  peak_total, peak_src = mfu.peak_flops(config, len(devices))
  bar = console.progress(total=spec.steps, initial=start_step, unit="step",
                         enabled=config.train.progress and primary and start_step < spec.steps)
  log = _StepLog(spec, data, MetricsLog(workdir / "metrics.jsonl", start_step, primary), bar,
                 budget.matmul_flops_per_token(spec.shape()) * spec.tokens_per_step, peak_total)
  evaluate = _Evaluator(program, data, config.train.curve_eval_windows)
  state = _run_steps(config, program, data, state, start_step, ckpt, log, say, evaluate)

  if math.isnan(log.eval_loss):
    log.eval_loss, log.eval_loss_se = evaluate(state["params"])
  summary = _summary(workdir, spec, data, log, final_step=int(jax.device_get(state["step"])),
                     unigram=unigram, peak_src=peak_src, resumed=resumed,
                     wall_s=time.time() - t_start, init=init,
                     compiler_options=program.compiler_options)
  summary = _keep_measured_speed(summary, workdir / "summary.json")
  if primary:
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  _report(summary, spec, say)
  return summary
