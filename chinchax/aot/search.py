"""Variants of a run that fit a target, ranked by roofline step time; compile results cached.

:func:`variants` lists configs that differ from the given one only in how the
program is laid out — ``model.remat`` (none, dots, full), the mesh split
(all data, all fsdp, data × fsdp, fsdp × tensor=2), ``model.scan_layers``
(on for deeper than 4 layers) and ``train.microbatches`` M (the global batch
in M microbatches: per remat × mesh the smallest M that the analytic memory
model, ``chinchax.planning.layout.smallest_microbatches``, fits on the device)
— never in what it trains (shape, global batch, steps). :func:`search`
compiles each (train step only), and a variant that XLA finds too large once
more at the next larger M, and ranks those that fit by their roofline step
time. :func:`compile_cached` keeps every report under
``~/.cache/chinchax/aot/<fingerprint>.json``: the fingerprint hashes the config,
the target, the versions of jax, jaxlib and libtpu / the CUDA plugin, the
collective count's version (``chinchax.aot.hlo.COUNT_VERSION``) and a digest of
chinchax's own source (:func:`source_digest`: the model it traces and the report it
writes), so a repeated search or plan compiles nothing and another chinchax compiles again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Callable

from chinchax.cost import work
from chinchax.aot import hlo as hlo_lib
from chinchax.aot import program as program_lib
from chinchax.aot import report as report_lib
from chinchax.aot import topology as topology_lib
from chinchax.aot.topology import Target
from chinchax.planning import layout as layout_lib

CACHE_DIR = pathlib.Path(os.path.expanduser("~/.cache/chinchax/aot"))
CHILD_TIMEOUT_S = 3600.0
REMATS = ("none", "dots", "full")


def _version(pkg: str) -> str:
  try:
    return importlib.metadata.version(pkg)
  except importlib.metadata.PackageNotFoundError:
    return "-"


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
  """sha256 of every ``.py`` file of the installed chinchax package (paths and contents): the
  compiled program follows the model's code and the cached report the report's, so a report
  cached by another chinchax is not reused (one caught: a bf16 RMSNorm that changed its
  program kept the old figures)."""
  root = pathlib.Path(__file__).resolve().parents[1]
  h = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    h.update(str(path.relative_to(root)).encode())
    h.update(path.read_bytes())
  return h.hexdigest()[:16]


def fingerprint(config, target: Target, eval_step: bool) -> str:
  """sha256 of what decides the compiled program and its report: config, target, compiler
  versions, the collective count's version and chinchax's source (:func:`source_digest`)."""
  key = {"config": json.loads(config.to_json_best_effort(sort_keys=True)),
         "target": [target.spec, target.topology, target.num_slices],
         "eval_step": eval_step,
         "versions": [_version(p) for p in ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin")],
         "collective_count": hlo_lib.COUNT_VERSION, "chinchax": source_digest()}
  for volatile in ("workdir", "compile_cache_dir"):
    key["config"].pop(volatile, None)
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def compile_isolated(config, target: Target, *, eval_step: bool = True) -> dict:
  """The report of one compile run in a child process (``chinchax.aot.child``).

  A compiler that crashes (a signal) or hangs past :data:`CHILD_TIMEOUT_S` gives a
  report whose train step failed, with the reason, instead of ending this process.

  Raises:
    UserError: what the child raised as one (bad config or target).
  """
  spec = program_lib.check_config(config, target)
  if target.platform == "tpu":
    topology_lib.warn_if_locked()
  request = json.dumps({"config": config.to_json_best_effort(), "target": target.spec,
                        "num_slices": target.num_slices, "eval_step": eval_step})
  start = time.perf_counter()
  while True:
    try:
      proc = subprocess.run([sys.executable, "-m", "chinchax.aot.child"], input=request,
                            capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      return _failed(config, target, spec, f"the compile ran past {CHILD_TIMEOUT_S:.0f} s",
                     time.perf_counter() - start)
    out = _last_json(proc.stdout)
    if not (isinstance(out, dict) and "libtpu_busy" in out):
      break
    # another process started libtpu between the child's wait and its own start: its turn
    if time.perf_counter() - start > topology_lib.LOCK_TIMEOUT_S:
      raise topology_lib.AotError(out["libtpu_busy"])
    time.sleep(1.0)
  if isinstance(out, dict) and "user_error" in out:
    raise topology_lib.AotError(out["user_error"])
  if proc.returncode == 0 and isinstance(out, dict):
    return out
  if proc.returncode < 0:
    why = (f"the compiler crashed ({signal.Signals(-proc.returncode).name}) in its own "
           f"process; a bug of this XLA / libtpu for this layout, try another (--search)")
  else:
    tail = [l for l in proc.stderr.strip().splitlines() if l.strip()][-1:] or ["no output"]
    why = f"the compile process failed (exit status {proc.returncode}): {tail[0][:300]}"
  return _failed(config, target, spec, why, time.perf_counter() - start)


def _last_json(stdout: str):
  """The child's report: the JSON object on its last line of ``stdout`` (None if none)."""
  last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
  try:
    return json.loads(last) if last else None
  except json.JSONDecodeError:
    return None


def _failed(config, target: Target, spec, why: str, seconds: float) -> dict:
  run = program_lib.CompiledRun(target=target, spec=spec,
                                train=program_lib.ProgramResult("train_step", seconds, False, {},
                                                                error=why),
                                eval=None, compiler_options={})
  return report_lib.summarize(run)


def compile_cached(config, target: Target, *, eval_step: bool = True, devices=None,
                   cache_dir: pathlib.Path | None = CACHE_DIR,
                   isolate: bool = True) -> tuple[dict, bool]:
  """(report of ``report.summarize``, whether it came from the cache) for ``config`` on ``target``.

  ``cache_dir=None`` compiles without reading or writing the cache. ``isolate``
  compiles in a child process (:func:`compile_isolated`); ``False`` compiles in
  this one (on ``devices`` when given), which then holds libtpu until it exits.
  """
  path = None
  if cache_dir is not None:
    path = pathlib.Path(cache_dir) / f"{fingerprint(config, target, eval_step)}.json"
    if path.exists():
      try:
        return json.loads(path.read_text()), True
      except (OSError, json.JSONDecodeError):
        pass  # a torn cache file is compiled again and rewritten
  if isolate:
    rep = compile_isolated(config, target, eval_step=eval_step)
  else:
    rep = report_lib.summarize(program_lib.compile_run(config, target, eval_step=eval_step,
                                                       devices=devices))
  if path is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(report_lib.dumps(rep))
    tmp.replace(path)
  return rep, False


def mesh_splits(n_devices: int, n_heads: int) -> list[dict[str, int]]:
  """Mesh layouts tried: all data, all fsdp, data × fsdp (√n-ish), fsdp × tensor=2."""
  out = [{"data": n_devices, "fsdp": 1, "tensor": 1}, {"data": 1, "fsdp": n_devices, "tensor": 1}]
  f = 1
  while f * f < n_devices:
    f *= 2
  if 1 < f < n_devices and n_devices % f == 0:
    out.append({"data": n_devices // f, "fsdp": f, "tensor": 1})
  if n_devices % 2 == 0 and n_heads % 2 == 0 and n_devices > 2:
    out.append({"data": 1, "fsdp": n_devices // 2, "tensor": 2})
  return out


def _key(c) -> tuple:
  return (c.model.remat, c.mesh.data, c.mesh.fsdp, c.mesh.tensor, c.model.scan_layers,
          c.train.microbatches)


def microbatch_options(config, target: Target) -> tuple[list[int], int]:
  """(every M that splits the config's batch over its mesh's data × fsdp, ascending; the
  smallest of them the analytic memory model fits on a device of ``target``, else the
  largest). ``config``'s mesh must be resolved; its own M is not read."""
  c = config.copy_and_resolve_references()
  c.train.microbatches = 1
  spec = program_lib.check_config(c, target)
  dp = spec.mesh["data"] * spec.mesh["fsdp"]
  shape = spec.shape()
  chunk = work.resolve_loss_chunk(c.train.loss_chunk_size, target.platform, spec.seq_len,
                                  shape.vocab_size)
  m, _ = layout_lib.smallest_microbatches(
      shape, spec.global_batch_size, spec.mesh, remat=spec.model.remat, loss_chunk=chunk,
      profile=report_lib.profile_of(spec.model),
      capacity=target.memory_per_device)
  return layout_lib.microbatch_choices(spec.global_batch_size, dp), m


def variants(config, target: Target) -> list:
  """Configs of the same run laid out differently (see the module doc); the given one first."""
  base = config.copy_and_resolve_references()
  out, seen = [base], set()
  spec = program_lib.check_config(base, target)
  base.mesh.update(**spec.mesh)
  seen.add(_key(base))
  scan = bool(base.model.scan_layers) or base.model.n_layers > 4
  for remat in REMATS:
    for mesh in mesh_splits(target.n_devices, base.model.n_heads):
      if (base.train.global_batch_size % (mesh["data"] * mesh["fsdp"])
          or mesh["data"] % base.mesh.get("dcn_data", 1)):  # data must hold the slices' part
        continue
      c = base.copy_and_resolve_references()
      c.model.remat = remat
      c.model.scan_layers = scan
      c.mesh.update(**mesh)
      c.train.microbatches = microbatch_options(c, target)[1]
      if _key(c) not in seen:
        seen.add(_key(c))
        out.append(c)
  return out


def _larger_m(config, target: Target):
  """The config at the next larger M that splits its batch, or None at the largest."""
  choices, _ = microbatch_options(config, target)
  bigger = [m for m in choices if m > config.train.microbatches]
  if not bigger:
    return None
  c = config.copy_and_resolve_references()
  c.train.microbatches = bigger[0]
  return c


def search(config, target: Target, *, cache_dir: pathlib.Path | None = CACHE_DIR,
           progress: Callable[[int, int, dict], None] | None = None,
           isolate: bool = True) -> list[dict]:
  """Compiles every variant's train step (one that does not fit once more at the next larger
  M); returns rows ranked: fitting ones by roofline step time, then the rest by how far over
  HBM they are.

  Each row: {"remat", "mesh", "scan_layers", "microbatches", "fits", "total_bytes",
  "headroom_fraction", "step_s", "bound", "cached", "given", "report"}.
  """
  topology_lib.check_available(target)
  devices = None if isolate else topology_lib.compile_devices(target)
  rows = []
  todo = [(c, i == 0, True) for i, c in enumerate(variants(config, target))]
  i = 0
  while i < len(todo):
    c, given, retry = todo[i]
    i += 1
    rep, cached = compile_cached(c, target, eval_step=False, devices=devices, cache_dir=cache_dir,
                                 isolate=isolate)
    ro = rep.get("roofline") or {}
    rows.append({"remat": c.model.remat, "mesh": dict(rep["run"]["mesh"]),
                 "scan_layers": bool(c.model.scan_layers),
                 "microbatches": int(c.train.microbatches), "fits": rep["fits"],
                 "total_bytes": rep["train_step"]["memory"].get("total"),
                 "headroom_fraction": rep.get("headroom_fraction"),
                 "step_s": ro.get("step_s"), "bound": ro.get("bound"), "cached": cached,
                 "given": given, "report": rep})
    if retry and not rep["fits"] and not rep["train_step"].get("error"):
      bigger = _larger_m(c, target)
      if bigger is not None and _key(bigger) not in {_key(t[0]) for t in todo}:
        todo.append((bigger, False, False))
    if progress is not None:
      progress(i, len(todo), rows[-1])
  fit = sorted((r for r in rows if r["fits"]), key=lambda r: r["step_s"] or float("inf"))
  rest = sorted((r for r in rows if not r["fits"]), key=lambda r: -(r["headroom_fraction"] or
                                                                    -float("inf")))
  return fit + rest


def render(rows: list[dict], target: Target) -> str:
  """The search's table: one line per variant, the best first, and the best one's flags."""
  lines = [f"{'rank':>4}  {'fits':<4}  {'remat':<5}  {'data×fsdp×tensor':<16}  {'scan':<5}  "
           f"{'M':>4}  {'memory/device':>13}  {'headroom':>8}  {'step (roofline)':>15}  bound"]
  for i, r in enumerate(rows, 1):
    m = r["mesh"]
    mem = "n/a" if r["total_bytes"] is None else f"{r['total_bytes'] / 1e9:.3f} GB"
    head = "n/a" if r["headroom_fraction"] is None else f"{100 * r['headroom_fraction']:+.1f}%"
    step = "n/a" if r["step_s"] is None else f"{r['step_s'] * 1e3:.4g} ms"
    tag = " (given)" if r["given"] else ""
    lines.append(f"{i:>4}  {'yes' if r['fits'] else 'no':<4}  {r['remat']:<5}  "
                 f"{m['data']}×{m['fsdp']}×{m['tensor']:<12}  {str(r['scan_layers']):<5}  "
                 f"{r.get('microbatches', 1):>4}  {mem:>13}  {head:>8}  {step:>15}  "
                 f"{r['bound'] or '-'}{tag}")
  best = next((r for r in rows if r["fits"]), None)
  if best is None:
    lines.append(f"no variant fits {target.spec}; more devices or a smaller model would")
  else:
    m = best["mesh"]
    lines.append(f"best: --config.model.remat={best['remat']} --config.mesh.data={m['data']} "
                 f"--config.mesh.fsdp={m['fsdp']} --config.mesh.tensor={m['tensor']} "
                 f"--config.model.scan_layers={best['scan_layers']} "
                 f"--config.train.microbatches={best.get('microbatches', 1)}")
  return "\n".join(lines)
