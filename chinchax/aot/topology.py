"""Compile targets: a hardware name (``v5e-16``, ``v5p-128``, ``h100x8``) → compile-only devices.

No accelerator is needed. TPU slices are described by ``libtpu``
(``jax.experimental.topologies.get_topology_desc(platform="tpu")``, installed
with ``pip install -e ".[tpu]"``); GPU hosts by the CUDA PJRT plugin
(``pip install -e ".[gpu-aot]"``) from a device description kept in
``chinchax/aot/targets/<accelerator>.txtpb`` (XLA's ``GpuTargetConfigProto``
as text, with its provenance in the file's comments).

Names follow ``chinchax.cost.hardware.parse_hardware``: ``v5e-16`` = 16 chips,
``v5p-128`` = 64 chips (the number counts TensorCores on v4 and v5p),
``h100x8`` = 8 GPUs. Slices of 2D chips (v5e, v6e) are laid out as 1, 4, 8,
16, …, 256 chips (``2x2`` … ``16x16``), 3D ones (v4, v5p) as ``2x2x1``,
``2x2x2``, ``2x2x4``, ``2x4x4``, ``4x4x4``, … (each step doubles the last of the
smallest sides), the shapes Cloud TPU sells.

libtpu runs in one process per host at a time: it holds a POSIX lock on
``/tmp/libtpu_lockfile`` for as long as its process lives, and a second process
fails ("multi-process lockfile") — unless ``ALLOW_MULTIPLE_LIBTPU_LOAD`` is set
(1 or true), when it takes no lock at all. Without that variable a process takes
``~/.cache/chinchax/libtpu.lock`` before its first TPU description and keeps it
until it exits, then waits for any other holder of libtpu's own lock (another
user's compile, a training job): a second ``chinchax compile`` waits its turn
(up to :data:`LOCK_TIMEOUT_S`, ``CHINCHAX_LIBTPU_LOCK_TIMEOUT_S``, 900 s by default)
instead of failing. With the variable set neither
lock is taken or waited for: compiles run side by side, as libtpu allows them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import pathlib
import tempfile
import time

from chinchax import console
from chinchax import errors
from chinchax.cost import hardware as hardware_lib

TARGETS_DIR = pathlib.Path(__file__).with_name("targets")
TPU_2D = ("v5e", "v6e")
TPU_3D = ("v4", "v5p")
MAX_2D_CHIPS = 256
LOCK_PATH = pathlib.Path(os.path.expanduser("~/.cache/chinchax/libtpu.lock"))
LOCK_TIMEOUT_S = float(os.environ.get("CHINCHAX_LIBTPU_LOCK_TIMEOUT_S", "900"))
_lock_file = None  # held for the life of the process once libtpu is in use
# libtpu's own lock: a POSIX (fcntl) write lock its process holds for as long as it lives.
LIBTPU_LOCKFILE = pathlib.Path("/tmp/libtpu_lockfile")


class AotError(errors.UserError):
  """A compile target, mesh or config that cannot be compiled ahead of time."""


class LibtpuBusy(AotError):
  """Another process took libtpu's lock as this one started libtpu (a compile to retry)."""


@dataclasses.dataclass(frozen=True)
class Target:
  """A slice or host to compile for.

  Attributes:
    spec: the name as given (``"v5e-16"``).
    hardware: its accelerator and chip count (``chinchax.cost.hardware``).
    platform: ``"tpu"`` or ``"gpu"``.
    topology: the topology string handed to JAX (``"v5e:4x4"``, ``"1x1x8"``).
    num_slices: TPU slices (ICI within a slice, data-center network between).
    n_devices: JAX devices (v4 shows each TensorCore as a device: two per chip).
    memory_per_device: HBM bytes per device (the table's per-chip figure over
      the devices of a chip).
  """

  spec: str
  hardware: hardware_lib.Hardware
  platform: str
  topology: str
  num_slices: int
  n_devices: int
  memory_per_device: float

  @property
  def accelerator(self) -> hardware_lib.Accelerator:
    return self.hardware.accelerator

  def describe_short(self) -> str:
    """``v5e-16 × 2 slices`` (or just the name for one slice)."""
    return self.spec + (f" × {self.num_slices} slices" if self.num_slices > 1 else "")

  def describe(self) -> str:
    a = self.accelerator
    slices = f" × {self.num_slices} slices" if self.num_slices > 1 else ""
    return (f"{self.spec}: {self.n_devices} × {a.display_name} devices ({self.platform} "
            f"topology {self.topology}{slices}), {self.memory_per_device / 1e9:.4g} GB HBM each")


def tpu_shape(name: str, chips: int) -> tuple[int, ...]:
  """The sides of a TPU slice of ``chips`` chips (see the module doc).

  Raises:
    AotError: a chip count that no slice of this generation has.
  """
  if name in TPU_2D:
    sides = {1: (1, 1)}
    x, y = 2, 2
    while x * y <= MAX_2D_CHIPS:
      sides[x * y] = (x, y)
      x, y = (x, 2 * y) if x == y else (2 * x, y)
    if chips not in sides:
      raise AotError(f"{name} slices have {', '.join(map(str, sorted(sides)))} chips, not {chips}")
    return sides[chips]
  dims = [2, 2, 1]
  valid = [4]
  while math.prod(dims) < max(chips, 4):
    smallest = min(dims)
    i = max(j for j, d in enumerate(dims) if d == smallest)
    dims[i] *= 2
    valid.append(math.prod(dims))
  if math.prod(dims) != chips:
    # v4 and v5p slice names count TensorCores, two per chip: say it in the user's unit.
    raise AotError(f"{name} slices are {name}-8, {name}-16, {name}-32, … (TensorCores, two per "
                   f"chip: {', '.join(map(str, valid[:6]))}, … chips); {name}-{2 * chips} "
                   f"({chips} chips) is not one")
  return tuple(dims)


def gpu_targets() -> list[str]:
  """Accelerator names with a device description in ``chinchax/aot/targets/``."""
  return sorted(p.stem for p in TARGETS_DIR.glob("*.txtpb"))


def parse_target(spec: str, *, num_slices: int = 1,
                 table: dict[str, hardware_lib.Accelerator] | None = None) -> Target:
  """Parses a compile target name; nothing is compiled or loaded.

  Raises:
    AotError: (or HardwareError, both UserErrors) an unknown name, a chip count no
      slice has, a GPU without a device description, ``num_slices`` < 1 or
      given for a GPU, or a CPU target.
  """
  hw = hardware_lib.parse_hardware(spec, table)
  acc = hw.accelerator
  if not isinstance(num_slices, int) or num_slices < 1:
    raise AotError(f"--slices={num_slices!r} must be a positive integer")
  if acc.kind == "tpu":
    if acc.name not in TPU_2D + TPU_3D:
      raise AotError(f"no TPU topology is known for {acc.display_name}; known: "
                     f"{', '.join(TPU_2D + TPU_3D)}")
    sides = tpu_shape(acc.name, hw.n_devices)
    per_chip = 2 if acc.name == "v4" else 1
    return Target(spec=spec, hardware=hw, platform="tpu",
                  topology=f"{acc.name}:{'x'.join(map(str, sides))}", num_slices=num_slices,
                  n_devices=hw.n_devices * per_chip * num_slices,
                  memory_per_device=acc.memory_bytes / per_chip)
  if acc.kind == "gpu":
    if num_slices != 1:
      raise AotError(f"--slices={num_slices} is for TPU targets; name the GPU count instead "
                     f"(e.g. {acc.name}x16 for two hosts of 8)")
    if acc.name not in gpu_targets():
      raise AotError(f"no device description for {acc.display_name} in {str(TARGETS_DIR)!r}; "
                     f"GPUs with one: {', '.join(gpu_targets())}")
    n = hw.n_devices
    if n > 8 and n % 8:
      raise AotError(f"{spec!r}: more than 8 GPUs must fill hosts of 8 (16, 24, …), not {n}")
    hosts, per_host = (1, n) if n <= 8 else (n // 8, 8)
    return Target(spec=spec, hardware=hw, platform="gpu", topology=f"1x{hosts}x{per_host}",
                  num_slices=1, n_devices=n, memory_per_device=acc.memory_bytes)
  raise AotError(f"{spec!r} is a {acc.kind} target; chinchax compile is for TPU slices and GPU "
                 f"hosts (e.g. v5e-16, v5p-128, h100x8); on this host run chinchax train")


@contextlib.contextmanager
def quiet_stderr():
  """Sends what C++ libraries print to file descriptor 2 to a temporary file.

  libtpu warns about TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES on a host
  without TPUs, and the CUDA plugin about missing drivers: neither concerns a
  compile for another machine. Python's own ``sys.stderr`` is flushed first and
  restored after.
  """
  import sys
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as sink:
    os.dup2(sink.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)


def multiple_loads_allowed() -> bool:
  """True when ``ALLOW_MULTIPLE_LIBTPU_LOAD`` is set (``1``, ``true``, ``yes``): libtpu then
  loads in any number of processes at once and takes no lock of its own."""
  return os.environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD", "").strip().lower() in ("1", "true", "yes")


def _take_libtpu_lock() -> None:
  """Takes the per-user libtpu lock (see the module doc) once per process; nothing when
  libtpu allows several processes (:func:`multiple_loads_allowed`)."""
  global _lock_file
  if _lock_file is not None or multiple_loads_allowed():
    return
  LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
  f = open(LOCK_PATH, "a+")
  start, said = time.monotonic(), False
  while True:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      break
    except BlockingIOError:
      if not said:
        console.warn(f"another process compiles for TPU ({LOCK_PATH} is held); waiting for it")
        said = True
      if time.monotonic() - start > LOCK_TIMEOUT_S:
        f.close()
        raise AotError(f"{LOCK_PATH} stayed held for {LOCK_TIMEOUT_S:.0f} s by another TPU "
                       f"compile; wait for it to finish or end it") from None
      time.sleep(0.5)
  _lock_file = f


def wait_for_libtpu(path: pathlib.Path = LIBTPU_LOCKFILE, timeout_s: float = LOCK_TIMEOUT_S,
                    poll_s: float = 0.5) -> float:
  """Waits until no other process holds libtpu's own lock ``path`` (module doc); the seconds
  waited. Says once whom it waits for.

  Raises:
    AotError: still held after ``timeout_s`` seconds, naming the holder and what to do.
  """
  start, said = time.monotonic(), False
  while True:
    held = libtpu_lock_message(path)
    if held is None:
      return time.monotonic() - start
    if not said:
      console.warn(f"waiting for libtpu: {held.split('; wait for it')[0]}")
      said = True
    if time.monotonic() - start > timeout_s:
      raise AotError(f"waited {timeout_s:.0f} s: {held}; or set ALLOW_MULTIPLE_LIBTPU_LOAD=1 "
                     f"to compile beside it")
    time.sleep(poll_s)


def lock_holders(path: pathlib.Path, locks: str | None = None) -> list[int]:
  """The ids of the processes holding a POSIX or flock lock on ``path``, read from
  ``/proc/locks`` (``locks``: its text); [] when none does or the file is absent."""
  try:
    st = os.stat(path)
    text = pathlib.Path("/proc/locks").read_text() if locks is None else locks
  except OSError:
    return []
  want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
  pids = []
  for line in text.splitlines():  # "1: POSIX  ADVISORY  WRITE 2798 00:29:2 0 EOF"
    fields = line.split()
    if len(fields) < 6 or "->" in fields[1]:  # a waiter's line, not a holder's
      continue
    try:
      major, minor, inode = fields[5].split(":")
      key = (int(major, 16), int(minor, 16), int(inode))
      pid = int(fields[4])
    except ValueError:
      continue
    if key == want and pid not in pids and pid != os.getpid():
      pids.append(pid)
  return pids


def _command_line(pid: int) -> str:
  try:
    raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
  except OSError:
    return "?"
  return " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)[:160] or "?"


def libtpu_lock_message(path: pathlib.Path = LIBTPU_LOCKFILE, locks: str | None = None) -> str | None:
  """Why libtpu cannot start in this process when another one holds its lock ``path``: which
  process (id and command line) and what to do; None when no process holds it."""
  pids = lock_holders(path, locks)
  if not pids:
    return None
  who = "; ".join(f"process {pid} ({_command_line(pid)})" for pid in pids)
  kill = " ".join(str(p) for p in pids)
  return (f"libtpu runs in one process at a time and {who} holds its lock {path}; wait for it "
          f"to finish (or stop it: kill {kill}) and rerun; do not delete {path} while it runs")


def warn_if_locked() -> None:
  """Says so when another process holds chinchax's or libtpu's lock (a child compile, whose
  own lines are not shown, will wait for it); nothing when libtpu allows several processes."""
  if multiple_loads_allowed():
    return
  if LOCK_PATH.exists():
    with open(LOCK_PATH, "a+") as f:
      try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        console.warn(f"another process compiles for TPU ({LOCK_PATH} is held); this compile "
                     f"waits for it (up to {LOCK_TIMEOUT_S:.0f} s)")
        return
      fcntl.flock(f, fcntl.LOCK_UN)
  held = libtpu_lock_message()
  if held:
    console.warn(f"{held.split('; wait for it')[0]}; this compile waits for it (up to "
                 f"{LOCK_TIMEOUT_S:.0f} s)")


def libtpu_available() -> bool:
  """True when the ``libtpu`` package is installed."""
  import importlib.util
  return importlib.util.find_spec("libtpu") is not None


def cuda_plugin_available() -> bool:
  """True when JAX's CUDA PJRT plugin is installed."""
  import importlib.util
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:  # no jax_plugins namespace at all: no plugin installed
    return False


def check_available(target: Target) -> None:
  """Raises AotError naming the install command when the target's compiler is missing."""
  if target.platform == "tpu" and not libtpu_available():
    raise AotError(f"compiling for {target.spec} needs libtpu, which is not installed; "
                   f"pip install -e \".[tpu]\" (or pip install \"jax[tpu]\")")
  if target.platform == "gpu" and not cuda_plugin_available():
    raise AotError(f"compiling for {target.spec} needs JAX's CUDA plugin, which is not "
                   f"installed; pip install -e \".[gpu-aot]\"")


def compile_devices(target: Target) -> list:
  """The target's compile-only JAX devices (no hardware touched; quiet; TPU lock held).

  Raises:
    AotError: the compiler for the target is not installed, or JAX refuses the topology.
  """
  check_available(target)
  from jax.experimental import topologies
  if target.platform == "gpu":
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    text = (TARGETS_DIR / f"{target.accelerator.name}.txtpb").read_text()
    kwargs = dict(platform="cuda", target_config=text, topology=target.topology)
  else:
    if not multiple_loads_allowed():  # else libtpu takes no lock and neither do we
      _take_libtpu_lock()
      wait_for_libtpu()  # libtpu itself would fail with advice to delete a live lock
    kwargs = dict(platform="tpu", topology_name=target.topology)
    if target.topology.endswith(":1x1"):
      kwargs["chips_per_host_bounds"] = (1, 1, 1)
    if target.num_slices > 1:
      kwargs["num_slices"] = target.num_slices
  try:
    with quiet_stderr():
      desc = topologies.get_topology_desc(**kwargs)
  except Exception as e:  # JaxRuntimeError, NotImplementedError: JAX's text says why
    held = libtpu_lock_message() if "lockfile" in str(e) else None
    if held:  # taken between our wait and libtpu's start: the parent runs this child again
      raise LibtpuBusy(f"cannot describe {target.spec}: {held}") from None
    raise AotError(f"JAX cannot describe {target.spec} ({target.topology}): "
                   f"{str(e).splitlines()[0]}") from None
  devices = list(desc.devices)
  if len(devices) != target.n_devices:
    raise AotError(f"{target.spec}: JAX describes {len(devices)} devices, expected "
                   f"{target.n_devices}")
  return devices
