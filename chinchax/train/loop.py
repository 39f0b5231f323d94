"""``train(config)``: one training run (or its resumption) as a short script of named steps.

The loop dispatches step t+1 before fetching step t's metrics, so the host
never waits on the device except at log, eval and checkpoint steps. Its parts:
the run's data (:mod:`~chinchax.train.rundata`), the deferred metric rows and
speed windows (:mod:`~chinchax.train.steplog`), the eval
(:mod:`~chinchax.train.evaluate`), the summary and result lines
(:mod:`~chinchax.train.summary`); here: restore or init, the steps with their
checkpoint, finiteness and preemption checks.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import time

import jax

from chinchax.cost import budget
from chinchax import checkpoint as checkpoint_lib
from chinchax import config as config_lib
from chinchax import console
from chinchax.runtime import distributed as distributed_lib
from chinchax.storage import diskfull
from chinchax import errors
from chinchax.runtime import interrupts
from chinchax.runtime import watchdog
from chinchax.storage import paths as paths_lib
from chinchax.storage import workdir_lock
from chinchax.model import sharding as sharding_lib
from chinchax.tracking import wandblog
from chinchax.data import pipeline as pipeline_lib
from chinchax.data import store as store_lib
from chinchax.data import tokenizers as tokenizers_lib
from chinchax.data import unique as unique_lib
from chinchax.export import hf_load
from chinchax.export import hf_resume
from chinchax.export import hf_source
import chinchax.train.mfu as mfu
import chinchax.train.spec as spec_lib
import chinchax.train.step as step_lib
import chinchax.train.trials as trials_lib
from chinchax.train.evaluate import Evaluator
from chinchax.train.metrics import MetricsLog, log_spaced_steps
from chinchax.train.cadence import WallClock
from chinchax.train.profile import StepProfiler
from chinchax.train.rundata import RunData, prepare_data
from chinchax.train.steplog import StepLog
from chinchax.train.summary import keep_measured_speed, report, summarize


class Diverged(errors.UserError):
  """The training loss or gradient norm became NaN/Inf (``train.stop_on_nonfinite``).

  The message names the first non-finite step and the last checkpoint, which
  holds a finite state; nothing non-finite was saved.
  """


@interrupts.deferring  # orbax reads and XLA compiles: Ctrl-C waits for the next step boundary
def _restore_or_init(ckpt: checkpoint_lib.Checkpointer, program: step_lib.TrainProgram,
                     init_src: checkpoint_lib.InitSource | None, workdir: pathlib.Path,
                     hf_src: hf_source.HFSource | None = None):
  """(state, resumed, init): the latest checkpoint of this run onto the mesh; else the
  ``train.init_from`` checkpoint's full state; else, for ``train.init_from=hf:DIR``, its
  params streamed onto the mesh with a fresh optimizer state at step 0; else a fresh
  sharded state.

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
  if hf_src is not None:
    params = hf_load.load_params(hf_src, program.abstract_state["params"],
                                 program.shardings["params"], program.spec.model.n_layers)
    opt_state = jax.jit(program.tx.init, out_shardings=program.shardings["opt_state"])(params)
    step = jax.device_put(jax.numpy.zeros((), jax.numpy.int32), program.shardings["step"])
    return ({"step": step, "params": params, "opt_state": opt_state}, False,
            {"from": hf_source.PREFIX + str(hf_src.directory), "step": 0})
  return program.init_state(), False, None


@interrupts.deferring  # Ctrl-C stops at the next step boundary, after a checkpoint
def _run_steps(config, program, data: RunData, state, start_step: int,
               ckpt: checkpoint_lib.Checkpointer, log: StepLog, evaluate,
               lock: workdir_lock.WorkdirLock | None = None):
  """Runs steps start_step … steps-1: log, eval and checkpoint on their schedules.

  With ``train.stop_after_s`` > 0 the first step after which this call has trained that
  many seconds (compilation, evals and checkpoints excluded) is treated as the last: it is
  evaluated and checkpointed, and the run stops there (``summary["stopped_by_time"]``).

  Raises:
    Preempted: a preemption request (SIGTERM; :class:`~chinchax.runtime.interrupts.Interrupted`
      after Ctrl-C) reached a step boundary; the checkpoint of that step is saved and every
      writer closed first.
  """
  workdir = str(ckpt.directory.parent)
  with contextlib.ExitStack() as regions:  # a command: a stall, a stop, each one line
    regions.enter_context(watchdog.watch(config.train.stall_timeout_s, stall_hint(config)))
    if start_step:
      watchdog.saved(f"the last checkpoint is at step {start_step} in {workdir}")
    return _steps(config, program, data, state, start_step, ckpt, log, evaluate, regions, lock)


def stall_hint(config):
  """What to do after a run stalled (``train.stall_timeout_s``), as a function of what it was
  doing: writing to a bucket → check the bucket; a step on virtual CPU devices → fewer of them."""
  scheme, _, rest = str(config.workdir).partition("://")
  bucket = f"{scheme}://{rest.split('/')[0]}"
  cpu = config.mesh.num_cpu_devices > 1 and jax.default_backend() == "cpu"
  again = ("then rerun the same command to resume from the last checkpoint "
           f"(train.stall_timeout_s={config.train.stall_timeout_s:g} sets this limit)")

  def hint(doing: str) -> str:
    if paths_lib.is_url(config.workdir) and "://" in doing:
      return f"check that {bucket} is reachable, {again}"
    if cpu:
      return (f"an XLA collective between {config.mesh.num_cpu_devices} virtual CPU devices on "
              f"{os.cpu_count()} cores may have stalled: {again} and "
              f"--config.mesh.num_cpu_devices=1")
    return f"check the devices and the storage, {again}"
  return hint


def _steps(config, program, data: RunData, state, start_step: int,
           ckpt: checkpoint_lib.Checkpointer, log: StepLog, evaluate, regions,
           lock: workdir_lock.WorkdirLock | None):
  """The body of :func:`_run_steps`; enters ``regions``' keeping after the first step and checks
  ``lock`` (the workdir's) before each save."""
  t, spec = config.train, program.spec
  workdir = str(ckpt.directory.parent)
  eval_at = log_spaced_steps(spec.steps, t.eval_points, t.eval_points_from)
  prof = StepProfiler(config, ckpt.directory.parent, start_step)  # train.profile_steps
  clock = WallClock(t.eval_every_s, t.checkpoint_every_s)  # train.eval_every_s, checkpoint_every_s
  for step, local_batch in data.batches.iterator(start_step, num_threads=config.data.read_threads):
    prof.before(step + 1)
    t_dispatch = time.perf_counter()
    state, metrics = program.step(state, program.global_batch(local_batch))
    prof.after(step + 1, state)
    log.stepped(state, t_dispatch)
    watchdog.beat(f"step {step + 2} of {workdir}")
    if step == start_step:  # trained steps to save: a signal stops at a step boundary
      regions.enter_context(watchdog.keeping())
    log.watch(step + 1, metrics)
    done = step + 1
    stop = t.stop_after_s > 0 and log.trained_seconds() >= t.stop_after_s
    is_last = done == spec.steps or stop
    timed_eval, timed_save = clock.due() if done % t.log_every == 0 else (False, False)
    is_eval = done % t.eval_every == 0 or is_last or done in eval_at or timed_eval
    if done % t.log_every == 0 or is_eval:
      jax.block_until_ready(metrics["loss"])
      extra = log.speed()
      log.defer(done, metrics, extra)  # written at the next step: eval fills ``extra`` first
      _check_finite(config, log, ckpt, done)
      if is_eval:
        watchdog.beat(f"evaluating at step {done} of {workdir}")
        log.eval_loss, log.eval_loss_se = evaluate.evaluate_state(state, final=is_last)
        extra["eval_loss"] = log.eval_loss
        extra.update(evaluate.row_fields())
        if log.eval_loss_se is not None:
          extra["eval_loss_se"] = log.eval_loss_se
        extra["eval_bits_per_byte"] = data.val_bits_per_byte(log.eval_loss)
        clock.evaluated()
      if is_last or done % t.checkpoint_every == 0 or done in ckpt.save_steps or timed_save:
        _save(config, log, ckpt, done, state, force=is_last or timed_save, lock=lock)
        clock.checkpointed()
      log.restart_window()
      if stop:  # train.stop_after_s: this step is the run's last of this call
        log.stopped_by_time = done < spec.steps
        break
    elif done % t.checkpoint_every == 0 or done in ckpt.save_steps:
      _save(config, log, ckpt, done, state, lock=lock)
      clock.checkpointed()
    if not is_last and distributed_lib.reached_preemption(done):
      log.flush()
      if ckpt.latest_step() != done:
        _save(config, log, ckpt, done, state, force=True, lock=lock)
      prof.stop()
      _shut_down(ckpt, log)  # the command line reports it once, from the exception
      raise interrupts.stop_error(done, str(ckpt.directory.parent))
  prof.stop()
  _shut_down(ckpt, log)
  return state


def _save(config, log: StepLog, ckpt: checkpoint_lib.Checkpointer, done: int, state,
          force: bool = False, lock: workdir_lock.WorkdirLock | None = None) -> None:
  """Checks the state is finite, then starts its save (at the interval, or ``force``).

  Raises:
    Diverged: see :func:`_check_finite`.
    WorkdirBusy: another process took the workdir's lock over; nothing more is written.
    CheckpointError: the checkpoint directory cannot be written; the metric
      rows so far are written and the logs closed first.
  """
  _check_finite(config, log, ckpt, done, state)
  if lock is not None:
    try:
      lock.check()
    except workdir_lock.WorkdirBusy:
      ckpt.wait_and_close()
      raise
  where = ckpt.directory.parent
  watchdog.beat(f"writing the metrics of step {done} to {where}")
  log.flush()
  log.metrics.sync()  # every row so far is in metrics.jsonl before the checkpoint can commit
  watchdog.beat(f"saving the checkpoint of step {done} in {where}")
  try:
    ckpt.save(done, state, force=force)
  except (checkpoint_lib.CheckpointError, diskfull.DiskFull):
    log.close()
    raise
  watchdog.saved(f"the last checkpoint started is at step {done} in {where}")


def _check_finite(config, log: StepLog, ckpt: checkpoint_lib.Checkpointer, done: int,
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


def _shut_down(ckpt: checkpoint_lib.Checkpointer, log: StepLog) -> None:
  """Writes the last row, waits for checkpoint writes, closes the logs and the bar."""
  log.flush()
  watchdog.beat(f"finishing the checkpoint writes in {ckpt.directory}")
  try:
    ckpt.wait_and_close()
  finally:
    watchdog.beat(f"closing the logs in {ckpt.directory.parent}")
    log.close()


def train(config, devices=None, verbose: bool = True, lease_held: bool = False) -> dict:
  """Runs (or resumes) one training run; returns the summary also written to summary.json.

  Args:
    config: the run's ConfigDict (see ``chinchax.config``).
    devices: devices to build the mesh from (default: all ``jax.devices()``).
    verbose: print the budget, data and result lines (process 0 only).
    lease_held: the caller holds a lease that makes it this workdir's one writer (a ladder
      worker): an earlier workdir lock is taken over without asking
      (:mod:`chinchax.storage.workdir_lock`).

  Raises:
    ConfigError: invalid config (before any data is read), or ``train.stop_after_s`` in a
      multi-process run.
    DataError: missing/empty/too-small corpus, or repetition not allowed (before compiling).
    PathError: the workdir or store root cannot be written, or a corpus file
      read (before the token store is built).
    CheckpointError: the workdir's checkpoint does not match the config's model; or
      ``train.init_from`` (used only while the workdir has no checkpoint) names a
      missing step or a run of another model shape, vocab, tokenizer, seq_len or
      batch (before any data is read; see ``checkpoint.check_init_source``).
    HFCheckpointError: ``train.init_from=hf:DIR`` is not an HF Llama checkpoint chinchax's
      model can hold, or conflicts with the config (before any data is read; see
      ``chinchax.export.hf_source``).
    Diverged: a non-finite loss, grad norm or state (``train.stop_on_nonfinite``).
    Preempted: a preemption request (SIGTERM) stopped the run at a step
      boundary after a checkpoint was saved (see ``chinchax.runtime.distributed``).
    WorkdirBusy: another live process holds the workdir (before anything in it is written),
      or took it over during the run (before the next checkpoint).
  """
  t_start = time.time()
  primary = jax.process_index() == 0
  say = lambda msg: console.say(msg, enabled=verbose and primary)  # noqa: E731
  devices = list(jax.devices() if devices is None else devices)
  workdir = paths_lib.resolved(config.workdir)  # local, or gs://bucket/... (docs/storage.md)
  # init_from=hf:DIR sets the model shape and tokenizer; a run with a checkpoint no longer
  # needs DIR: its config.json and token store hold them
  resumes = hf_resume.configure_from_run(config, workdir, say=verbose and primary)
  hf_src = None if resumes else hf_source.open_source(config)
  spec = spec_lib.resolve(config, len(devices))
  unique_lib.check_config(config.data, config.train)  # a bad value before any line is printed
  if config.train.stop_after_s > 0 and jax.process_count() > 1:
    # each process reads its own clock: they could stop at different steps and hang
    raise config_lib.ConfigError(
        f"train.stop_after_s={config.train.stop_after_s:g} needs a single-process run (this one "
        f"has {jax.process_count()} processes); use 0 and a step budget")
  for path, what in ((workdir, "workdir"), (workdir / "checkpoints", "checkpoint directory")):
    if path == workdir or path.exists():
      paths_lib.check_writable_dir(path, what)
  paths_lib.check_writable_dir(config.data.store_root, "data.store_root")
  # one writer per workdir: taken before anything in it is written or deleted (orbax's manager
  # removes unfinished checkpoints when it opens), and before a refused process does any work;
  # process 0 holds it for a multi-host run
  lock = workdir_lock.acquire(workdir, lease_held=lease_held) if primary else None
  wrote = False  # until the workdir is written, a refusal leaves it as it was found
  try:
    mesh = sharding_lib.make_mesh(spec.mesh, devices)
    trials = trials_lib.parse_trials(config)  # train.lr_multipliers × train.trial_seeds
    trials_lib.check_supported(config, trials)
    if trials:  # shapes and jit wrappers: no compile yet
      program, single = trials_lib.build_trials_program(config, spec, mesh, trials)
    else:
      program = single = step_lib.build_program(config, spec, mesh)
    tokenizer = tokenizers_lib.make_tokenizer(config.data)
    tokenizer_sha256 = getattr(tokenizer, "digest", None)  # a BPE still to train has none yet
    checkpoint_lib.check_compatible(workdir, config, vocab_size=spec.model.vocab_size,
                                    tokenizer_sha256=tokenizer_sha256,
                                    abstract_state=program.abstract_state)
    init_src = None
    if hf_src is None and config.train.init_from.strip() and not checkpoint_lib.has_checkpoints(
        workdir):
      init_src = checkpoint_lib.check_init_source(
          config, workdir, spec.steps, vocab_size=spec.model.vocab_size,
          tokenizer_sha256=tokenizer_sha256, abstract_state=program.abstract_state)
    say(spec_lib.describe(spec, config, len(devices)))
    if trials:
      say(trials_lib.describe(trials))

    rows = distributed_lib.process_row_range(sharding_lib.batch_sharding(mesh),
                                             spec.global_batch_size)
    eval_rows = (distributed_lib.process_row_range(
        sharding_lib.batch_sharding(mesh),
        pipeline_lib.eval_chunk_rows(spec.mesh["data"] * spec.mesh["fsdp"]))
        if config.train.eval_windows else None)
    data = prepare_data(config, spec, rows, on_scan=lambda fp: checkpoint_lib.check_data_signature(
        workdir, "store_fingerprint", fp), eval_rows=eval_rows)
    of = (f" of {data.unique_tokens:,} unique tokens (data.unique_tokens="
          f"{config.data.unique_tokens:,} in whole documents, {config.data.unique_order} order)"
          if config.data.unique_tokens else "")
    say(f"data    store {data.directory}: train {data.train_split.n_tokens:,} tokens, val "
        f"{data.val_split.n_tokens:,} tokens; run reads {data.batches.plan.epochs:.3f} epochs{of}")
    if init_src is not None:
      init_src.check_tokenizer(data.train_split.manifest["tokenizer"]["sha256"])
    unigram = store_lib.unigram_entropy_nats(data.val_split.all_tokens(), spec.model.vocab_size)

    wrote = True
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", config.train.checkpoint_every,
                                       config.train.keep_checkpoints,
                                       config_lib.parse_save_steps(config.train.save_steps))
    state, resumed, init = _restore_or_init(ckpt, program, init_src, workdir, hf_src)
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
    wandb = wandblog.open_run(config, workdir) if primary else None  # train.wandb: W&B too
    metrics_log = MetricsLog(workdir / "metrics.jsonl", start_step, primary, wandb)
    log = StepLog(spec, data, metrics_log, bar,
                  budget.matmul_flops_per_token(spec.shape()) * spec.tokens_per_step
                  * max(1, len(trials)), peak_total, peak_src)  # MFU counts every trial's FLOPs
    evaluate = (trials_lib.TrialsEvaluator(single, data, config.train.curve_eval_windows,
                                           len(trials)) if trials
                else Evaluator(program, data, config.train.curve_eval_windows))
    try:
      state = _run_steps(config, program, data, state, start_step, ckpt, log, evaluate, lock)
    except diskfull.DiskFull:  # a metrics row: pending checkpoint writes end before the error line
      try:
        ckpt.wait_and_close()
      except Exception:  # noqa: BLE001 — the disk is full: the error being raised says so
        pass
      raise

    if math.isnan(log.eval_loss):
      log.eval_loss, log.eval_loss_se = evaluate.evaluate_state(state)
    summary = summarize(workdir, spec, data, log, final_step=int(jax.device_get(state["step"])),
                       unigram=unigram, peak_src=peak_src, resumed=resumed,
                       wall_s=time.time() - t_start, init=init,
                       compiler_options=program.compiler_options)
    if trials:
      summary = trials_lib.summarize_trials(summary, trials, evaluate, log.metrics.last_trial_loss,
                                            jax.device_get(state["diverged_step"]),
                                            data.train_bits_per_byte)
    summary = keep_measured_speed(summary, workdir / "summary.json")
    if primary:
      (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    report(summary, spec, say)
    if trials:
      trials_lib.report(summary, say)
    return summary
  finally:
    if lock is not None:
      if wrote:
        lock.release()
      else:
        lock.withdraw()

