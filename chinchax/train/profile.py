"""A ``jax.profiler`` trace of a few training steps (``train.profile_steps``), for xprof or
TensorBoard's profile plugin.

Steps ``train.profile_first_step`` … ``profile_first_step + profile_steps - 1`` (step numbers
as in metrics.jsonl, 1-based) are traced when this call of ``train`` runs them, except the
call's first step, which compiles. The trace starts before the first of them is dispatched
and stops after the last has finished on the device, and lands in ``<workdir>/profile/``
(``plugins/profile/<time>/<host>.xplane.pb``; ``tensorboard --logdir <workdir>/profile`` or
``xprof``). Process 0 only, unless ``train.profile_all_processes``. For a ``gs://`` workdir
the trace is written locally and uploaded when it stops.
"""

from __future__ import annotations

import shutil
import tempfile

import jax

from chinchax import console
from chinchax.storage import paths as paths_lib

PROFILE_DIR = "profile"


class StepProfiler:
  """Starts and stops one trace around the configured steps of this call.

  Args:
    config: the run's config (``train.profile_steps``, ``profile_first_step``,
      ``profile_all_processes``).
    workdir: the run's workdir (local path or URL).
    start_step: steps already done (a resume's restored step); the call's first
      step is ``start_step + 1``.
  """

  def __init__(self, config, workdir, start_step: int):
    t = config.train
    first = max(int(t.profile_first_step), start_step + 2)  # never the compiling step
    last = int(t.profile_first_step) + int(t.profile_steps) - 1
    on_this_process = jax.process_index() == 0 or t.profile_all_processes
    self.first, self.last = first, last
    self.enabled = int(t.profile_steps) > 0 and first <= last and on_this_process
    self.out = paths_lib.as_path(workdir) / PROFILE_DIR
    self._local = None

  def before(self, step_no: int) -> None:
    """Call before dispatching step ``step_no`` (1-based): starts the trace at the first."""
    if self.enabled and step_no == self.first and self._local is None:
      self._local = (str(self.out) if not paths_lib.is_url(self.out)
                     else tempfile.mkdtemp(prefix="chinchax-profile-"))
      jax.profiler.start_trace(self._local)

  def after(self, step_no: int, state) -> None:
    """Call after dispatching step ``step_no``: at the last traced step, waits for it and stops."""
    if self._local is not None and step_no >= self.last:
      jax.block_until_ready(state)
      self.stop()

  def stop(self) -> None:
    """Stops an open trace (a run that ended early) and uploads it for a URL workdir."""
    if self._local is None:
      return
    jax.profiler.stop_trace()
    local, self._local = self._local, None
    if paths_lib.is_url(self.out):
      paths_lib.upload_dir(local, self.out)
      shutil.rmtree(local, ignore_errors=True)
    console.say(f"profile steps {self.first}-{self.last}: trace in {self.out} (tensorboard "
                f"--logdir {self.out}, or xprof)", enabled=jax.process_index() == 0)
