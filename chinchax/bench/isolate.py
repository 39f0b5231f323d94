"""``bench.isolate``: the probe and each point in a fresh interpreter, a crash or hang a failed row.

The parent writes a job (``{"kind": "probe", "config", "hardware"}`` or
``{"kind": "point", "config", "measure": measure_point's keyword arguments}``)
to ``TAG.in.json`` and runs ``python -m chinchax.bench --child IN OUT``
(:mod:`chinchax.bench.__main__`), which writes the probe or the row to
``TAG.out.json``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import ml_collections

from chinchax import config as config_lib
from chinchax.runtime import jax_settings as runtime
from chinchax.bench.memory import is_oom
from chinchax.bench.measure import measure_point
from chinchax.bench.probe import probe

# The folder that holds this chinchax package: a child imports this very copy.
_PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _overlay(c: ml_collections.ConfigDict, values: dict) -> ml_collections.ConfigDict:
  """Sets ``values`` (a nested dict) onto the declared config ``c``; other knobs keep defaults."""
  for k, v in values.items():
    if isinstance(v, dict) and k in c and isinstance(c[k], ml_collections.ConfigDict):
      _overlay(c[k], v)
    else:
      c[k] = v
  return c


def child_main(in_path: str, out_path: str) -> int:
  """Runs the job in ``in_path`` (one probe or one point) and writes its result to ``out_path``."""
  job = json.loads(pathlib.Path(in_path).read_text())
  c = _overlay(config_lib.base_config(), job["config"])
  runtime.setup_cpu_devices(c.mesh.num_cpu_devices)
  if job["kind"] == "probe":
    out = probe(c, job["hardware"])
  else:
    out = measure_point(c, **job["measure"])
  pathlib.Path(out_path).write_text(json.dumps(out))
  return 0


def run_child(job: dict, timeout_s: float, tmp: pathlib.Path, tag: str) -> dict:
  """Runs one job in a fresh interpreter; a crash or timeout becomes a failed row.

  Args:
    job: the job (module doc), JSON-serialisable.
    timeout_s: seconds the child may run before it is killed (``timeout``).
    tmp: folder for the job's ``TAG.in.json``, ``TAG.out.json`` and ``TAG.err``.
    tag: the job's file name stem.
  Returns:
    the child's result, or {"status": "timeout" | "crashed" | "oom", "error"}.
  """
  inp, outp, errp = tmp / f"{tag}.in.json", tmp / f"{tag}.out.json", tmp / f"{tag}.err"
  inp.write_text(json.dumps(job))
  env = dict(os.environ)
  env["PYTHONPATH"] = str(_PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"]
                                            if env.get("PYTHONPATH") else "")
  cmd = [sys.executable, "-m", "chinchax.bench", "--child", str(inp), str(outp)]
  with errp.open("w") as err:
    proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=env)
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      return {"status": "timeout", "error": f"no result after {timeout_s:g} s "
                                            f"(bench.point_timeout_s)"}
    finally:  # a timeout or an interrupted bench leaves no child behind
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  if proc.returncode == 0 and outp.exists():
    return json.loads(outp.read_text())
  tail = [l for l in errp.read_text(errors="replace").splitlines() if l.strip()][-6:]
  why = f"exit status {proc.returncode}"
  if proc.returncode == -9:
    why += " (SIGKILL: the kernel's out-of-memory killer?)"
  return {"status": "oom" if is_oom(RuntimeError("\n".join(tail))) else "crashed",
          "error": f"{why}: " + " | ".join(tail)[-1500:]}
