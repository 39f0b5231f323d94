"""Multi-process start-up, each process's rows of a global batch, and preemption.

One chinchax run may span several processes (hosts of a TPU pod slice, GPU
nodes, or local CPU processes), each owning some of the devices of one global
mesh. :func:`initialize` starts JAX's multi-controller runtime
(``jax.distributed.initialize``) before any device is used, from
``config.distributed``:

  auto      an explicit ``coordinator_address`` if set; else a SLURM job step
            with more than one task; else a Cloud TPU VM; else one process.
  off       one process; never start the runtime.
  explicit  ``coordinator_address``, ``num_processes`` and ``process_id``
            from the config (the local CPU launcher uses this, with gloo).
  slurm     coordinator, count and id from SLURM's environment (srun).
  tpu       Cloud TPU VM / GKE TPU: JAX reads the slice's worker list.

Start-up is bounded by ``distributed.initialization_timeout_s``: a coordinator
that cannot be reached, or processes that never join, end the process with one
``error:`` line (exit status 2) instead of hanging or aborting with a runtime
stack trace.

Preemption. SIGTERM (Cloud TPU maintenance and preemption, SLURM's
``--signal``, ``scancel``, Kubernetes eviction) asks the run to stop. In a
multi-process run JAX's preemption service catches the signal on any process
and all processes agree on one step (``reached_preemption_sync_point``); in a
single process a Python handler sets a flag. At that step boundary the run
saves a checkpoint, waits for it, and raises :class:`Preempted`; ``chinchax
train`` then exits with :data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``:
relaunch the same command to resume).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.util
import os
import signal
import socket
import sys
import threading
import time

from chinchax import errors
from chinchax import config as config_lib
from chinchax.runtime import watchdog

PREEMPTED_EXIT_CODE = watchdog.PREEMPTED_EXIT_CODE  # EX_TEMPFAIL: stopped on request, relaunch
STARTUP_EXIT_CODE = 2      # start-up failed on the user's input (address, counts, timeout)

_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
               "SLURM_LOCALID")
_TPU_ENV_VARS = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS")
_sigterm_received = threading.Event()


class DistributedError(errors.UserError):
  """Multi-process start-up or layout cannot work; the message names the value and the fix."""


class Preempted(Exception):
  """The run stopped at a step boundary on a preemption request, after checkpointing.

  Attributes:
    step: the step of the checkpoint just written (relaunching resumes there), or None when
      the stop came between runs (a ladder worker) and nothing was trained.
    workdir: the run's directory, or None.
  """

  def __init__(self, step: int | None, workdir: str | None):
    where = f": checkpoint saved at step {step} in {workdir}" if step is not None else ""
    super().__init__(f"preempted{where}; relaunch the same command to resume")
    self.step, self.workdir = step, workdir


@dataclasses.dataclass(frozen=True)
class StartupPlan:
  """How this process joins the run, settled from config and environment (no side effects).

  Attributes:
    method: "single" (no runtime), "explicit", "slurm" or "tpu".
    coordinator_address: host:port, or None for JAX to find from the environment.
    num_processes: process count, or None for JAX to find.
    process_id: this process's id, or None for JAX to find.
    local_device_ids: accelerator ids this process uses, or None (JAX default).
    timeout_s: start-up deadline in seconds.
  """

  method: str
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: tuple[int, ...] | None = None
  timeout_s: int = 300


def _slurm_present(environ) -> bool:
  return all(v in environ for v in _SLURM_VARS)


def _tpu_vm_present(environ) -> bool:
  if any(environ.get(v) for v in _TPU_ENV_VARS):
    return True
  if environ.get("TPU_SKIP_MDS_QUERY") is not None:
    return False
  return (importlib.util.find_spec("libtpu") is not None
          and bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")))


def plan_startup(dist_cfg, environ=None) -> StartupPlan:
  """Decides how this process starts from ``config.distributed`` and the environment.

  Args:
    dist_cfg: the ``config.distributed`` section (validated).
    environ: environment mapping (default ``os.environ``).
  Returns:
    The :class:`StartupPlan`; ``method == "single"`` means no runtime start.
  Raises:
    ConfigError: an invalid section (see ``config.validate_distributed``).
    DistributedError: ``mode='slurm'`` outside a SLURM job step.
  """
  config_lib.validate_distributed(dist_cfg)
  environ = os.environ if environ is None else environ
  r = dist_cfg
  ids = str(r.local_device_ids).strip()
  common = dict(
      coordinator_address=r.coordinator_address or None,
      num_processes=r.num_processes or None,
      process_id=r.process_id if r.process_id >= 0 else None,
      local_device_ids=tuple(int(i) for i in ids.split(",")) if ids else None,
      timeout_s=r.initialization_timeout_s)
  mode = r.mode
  if mode == "off":
    return StartupPlan("single", timeout_s=r.initialization_timeout_s)
  if mode == "auto":
    if r.coordinator_address:
      mode = "explicit"
    elif _slurm_present(environ) and int(environ["SLURM_NTASKS"]) > 1:
      mode = "slurm"
    elif _tpu_vm_present(environ):
      mode = "tpu"
    else:
      return StartupPlan("single", timeout_s=r.initialization_timeout_s)
  if mode == "slurm" and not _slurm_present(environ):
    missing = [v for v in _SLURM_VARS if v not in environ]
    raise DistributedError(
        f"distributed.mode='slurm' but this is not a SLURM job step ({', '.join(missing)} unset); "
        f"start the processes with srun inside an allocation (see launch/slurm_gpu.sbatch)")
  return StartupPlan(mode, **common)


def wait_for_coordinator(address: str, timeout_s: float) -> None:
  """Waits until a TCP connection to ``address`` (host:port) succeeds.

  Raises:
    DistributedError: nothing accepts connections there within ``timeout_s`` seconds.
  """
  host, port = config_lib.parse_host_port(address)
  deadline = time.monotonic() + timeout_s
  last = None
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      raise DistributedError(
          f"cannot reach the coordinator at distributed.coordinator_address={address!r} within "
          f"distributed.initialization_timeout_s={timeout_s:g} s ({last}); check that process 0 "
          f"is running and that the address and port are right and reachable from this host")
    try:
      with socket.create_connection((host, port), timeout=max(min(left, 1.0), 0.01)):
        return
    except OSError as e:
      last = f"{type(e).__name__}: {e.strerror or e}"
      time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))


def _startup_timed_out(plan: StartupPlan) -> None:
  """Watchdog: the runtime's connect call blocks in C++, so report and leave from here."""
  who = (f"process {plan.process_id} of {plan.num_processes}"
         if plan.process_id is not None else "this process")
  where = plan.coordinator_address or "the coordinator from the cluster environment"
  print(f"error: distributed start-up did not complete within distributed.initialization_timeout_s"
        f"={plan.timeout_s} s: {who} could not register with {where} ({plan.method}); check that "
        f"all {plan.num_processes or 'the'} processes were started with the same coordinator "
        f"address and num_processes, or raise the timeout", file=sys.stderr, flush=True)
  os._exit(STARTUP_EXIT_CODE)


def initialize(dist_cfg, environ=None) -> StartupPlan:
  """Starts JAX's multi-process runtime as ``config.distributed`` says; call before any device use.

  A single-process plan starts nothing. Otherwise the CPU backend's cross-process
  collectives are set (gloo by default), a non-zero process first waits for the
  coordinator's port, and ``jax.distributed.initialize`` runs under a watchdog
  that ends the process with one ``error:`` line (exit status 2) when start-up
  outlives ``initialization_timeout_s``.

  Args:
    dist_cfg: the ``config.distributed`` section.
    environ: environment mapping (default ``os.environ``).
  Returns:
    The :class:`StartupPlan` that was carried out.
  Raises:
    ConfigError: an invalid section.
    DistributedError: ``mode='slurm'`` outside a SLURM job step, an
      unreachable coordinator, or a runtime that was already started.
  """
  plan = plan_startup(dist_cfg, environ)
  if plan.method == "single":
    return plan
  import jax
  if jax.distributed.is_initialized():
    raise DistributedError("jax.distributed is already initialized in this process")
  t0 = time.monotonic()
  if plan.coordinator_address and plan.process_id not in (None, 0):
    wait_for_coordinator(plan.coordinator_address, plan.timeout_s)
  if dist_cfg.cpu_collectives != "none":
    jax.config.update("jax_cpu_collectives_implementation", dist_cfg.cpu_collectives)
  left = max(plan.timeout_s - (time.monotonic() - t0), 1.0)
  watchdog = threading.Timer(left, _startup_timed_out, args=(plan,))
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(
        coordinator_address=plan.coordinator_address, num_processes=plan.num_processes,
        process_id=plan.process_id,
        local_device_ids=list(plan.local_device_ids) if plan.local_device_ids else None,
        cluster_detection_method={"slurm": "slurm", "explicit": "deactivate"}.get(plan.method),
        # The watchdog fires first; JAX's own deadline (which aborts the process) is a backstop.
        initialization_timeout=int(left) + 60,
        heartbeat_timeout_seconds=dist_cfg.heartbeat_timeout_s)
  except (ValueError, TypeError) as e:
    raise DistributedError(f"jax.distributed.initialize ({plan.method}) refused its arguments: "
                           f"{e}") from e
  finally:
    watchdog.cancel()
  return plan


def process_row_range(sharding, global_batch_size: int) -> tuple[int, int]:
  """The rows [r0, r1) of a [global_batch_size, ...] batch that this process's devices hold.

  The process feeds exactly these rows to ``jax.make_array_from_process_local_data``.

  Args:
    sharding: the batch's sharding over the global mesh.
    global_batch_size: rows of the global batch.
  Returns:
    (r0, r1): one contiguous range.
  Raises:
    DistributedError: this process's devices hold rows that are not one
      contiguous range (a mesh whose device order interleaves processes).
  """
  index_map = sharding.addressable_devices_indices_map((global_batch_size, 1))
  ranges = sorted({idx[0].indices(global_batch_size)[:2] for idx in index_map.values()})
  r0, r1 = ranges[0]
  for a, b in ranges[1:]:
    if a > r1:
      raise DistributedError(
          f"this process's devices hold rows {ranges} of each global batch of {global_batch_size}, "
          f"not one contiguous range; build the mesh with each process's devices adjacent along "
          f"the batch axes (chinchax.model.sharding.make_mesh does)")
    r1 = max(r1, b)
  return r0, r1


@contextlib.contextmanager
def process_zero_first(name: str):
  """Runs the block on process 0 first, then on the other processes (a no-op in one process).

  For work with a shared result on disk, such as building the token store: the
  others find it done (or, without a shared filesystem, do it for their host).
  If process 0's block raises, the others still run theirs (and meet the same
  error) rather than wait forever.

  Args:
    name: barrier name, the same on every process.
  """
  import jax
  if jax.process_count() == 1:
    yield
    return
  from jax.experimental import multihost_utils
  if jax.process_index() != 0:
    multihost_utils.sync_global_devices(name)
    yield
    return
  try:
    yield
  finally:
    multihost_utils.sync_global_devices(name)


def install_sigterm_handler() -> bool:
  """Makes SIGTERM request a checkpoint-and-exit at the next step boundary (single process).

  In a run under ``jax.distributed`` with the preemption service on, JAX owns
  SIGTERM and nothing is installed. A second SIGTERM terminates at once. In a ``chinchax``
  command (:mod:`chinchax.runtime.watchdog`) SIGTERM ends the command at once, exit status 75
  and one line, while there is nothing to save.

  Returns:
    True if a Python handler was installed.
  """
  import jax
  if jax.distributed.is_initialized() and jax.config.jax_enable_preemption_service:
    return False
  if threading.current_thread() is not threading.main_thread():
    return False

  def on_sigterm(signum, frame):
    if watchdog.ends_at_once():
      watchdog.end(PREEMPTED_EXIT_CODE, watchdog.stop_line(signal.SIGTERM))
    if watchdog.raising_now():
      raise KeyboardInterrupt
    if _sigterm_received.is_set() and watchdog.installed():
      watchdog.end(PREEMPTED_EXIT_CODE, watchdog.stop_line(signal.SIGTERM)
                   + " (stopped at once, without a new checkpoint)")
    if _sigterm_received.is_set():
      signal.signal(signal.SIGTERM, signal.SIG_DFL)
      os.kill(os.getpid(), signal.SIGTERM)
    _sigterm_received.set()

  _sigterm_received.clear()
  signal.signal(signal.SIGTERM, on_sigterm)
  return True


def stop_requested() -> bool:
  """True when SIGTERM (or Ctrl-C, :mod:`chinchax.runtime.interrupts`) asked this process to stop.

  Always False under ``jax.distributed``: there the processes stop together at a step
  boundary (:func:`reached_preemption`), never one alone between runs.
  """
  import jax
  return not jax.distributed.is_initialized() and _sigterm_received.is_set()


def reached_preemption(step: int) -> bool:
  """True at the step boundary where every process stops for a preemption request.

  Call once per step on every process with the same ``step``. Under
  ``jax.distributed`` it is JAX's ``reached_preemption_sync_point`` (true on
  all processes at the same step); in one process it is the SIGTERM flag of
  :func:`install_sigterm_handler`; several processes without the preemption
  service agree through an all-gather of their flags.
  """
  import jax
  if jax.distributed.is_initialized():
    from jax.experimental import multihost_utils
    try:
      return bool(multihost_utils.reached_preemption_sync_point(step))
    except RuntimeError:  # the preemption service is disabled
      pass
  if jax.process_count() == 1:
    return _sigterm_received.is_set()
  import numpy as np
  from jax.experimental import multihost_utils
  flags = multihost_utils.process_allgather(np.int32(_sigterm_received.is_set()))
  return bool(np.any(flags))
