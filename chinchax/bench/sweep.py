"""The bench sweep: every point measured (here or in a child process), then its tables and reports."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import re
import shutil
import tempfile
import time

import ml_collections

from chinchax import config as config_lib
from chinchax import console
from chinchax.bench.isolate import run_child
from chinchax.bench.measure import measure_point
from chinchax.bench.plots import write_plots
from chinchax.bench.points import Point, parse_mesh, point_config, validate_bench
from chinchax.bench.probe import probe
from chinchax.bench.report import format_row, summary_markdown
from chinchax.bench.stepfit import fit_step_time

CSV_COLUMNS = (
    "name", "sweeps", "status", "model", "d_model", "n_layers", "n_heads", "d_ff", "vocab_size",
    "params_total", "params_non_embedding", "global_batch_size", "seq_len", "tokens_per_step",
    "attention_requested", "attention", "mesh", "mesh_data", "mesh_fsdp", "mesh_tensor",
    "n_devices", "remat", "compute_dtype", "scan_layers", "compile_s", "first_step_s",
    "startup_s", "step_time_s",
    "step_time_min_s", "step_time_max_s", "step_time_p10_s", "step_time_p90_s",
    "step_time_std_s", "step_time_spread", "timed_steps", "tokens_per_s", "model_flops_per_step",
    "model_flops_per_s", "peak_flops", "mfu", "memory_peak_bytes", "memory_source",
    "compiled_memory_bytes", "memory_limit_bytes", "xla_flops", "xla_bytes_accessed",
    "price_per_hour", "cost_per_million_tokens", "loss_first", "loss_last",
    "profile_dir", "error")


def _base_row(cfg, p: Point) -> dict:
  """A point's row before it is measured: its name, sweeps, shape and requested settings."""
  shape = cfg.models[p.model]
  sizes = parse_mesh(p.mesh)
  return {"name": p.name, "sweeps": ",".join(p.sweeps), "model": p.model,
          "d_model": int(shape.d_model), "n_layers": int(shape.n_layers),
          "n_heads": int(shape.n_heads), "d_ff": int(shape.d_ff),
          "global_batch_size": p.global_batch_size, "seq_len": p.seq_len,
          "tokens_per_step": p.global_batch_size * p.seq_len, "attention_requested": p.attention,
          "attention": p.attention, "mesh": p.mesh, "mesh_data": sizes["data"],
          "mesh_fsdp": sizes["fsdp"], "mesh_tensor": sizes["tensor"], "remat": p.remat,
          "compute_dtype": p.compute_dtype}


PROFILE_DIR = "profile"  # bench.profile_steps: one trace folder per point under it


def _profile_dir(workdir: pathlib.Path, name: str, profile_steps: int) -> str | None:
  """``<workdir>/profile/<point name>`` (name made path-safe), or None when profiling is off."""
  if profile_steps <= 0:
    return None
  return str(workdir / PROFILE_DIR / re.sub(r"[^A-Za-z0-9_.=-]+", "_", name))


def write_tables(workdir: pathlib.Path, rows: list[dict]) -> None:
  """``results.jsonl`` (every field) and ``results.csv`` (:data:`CSV_COLUMNS`)."""
  (workdir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  with (workdir / "results.csv").open("w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
      w.writerow({k: r.get(k) for k in CSV_COLUMNS})


def run_bench(cfg, points: list[Point] | None = None, *, verbose: bool = True) -> dict:
  """Runs the sweep and writes every output to ``cfg.workdir``.

  The devices must be set up before (``runtime.setup_cpu_devices``) unless
  ``cfg.bench.isolate``: then the probe and every point run in child
  processes, each setting up its own. A KeyboardInterrupt (Ctrl-C, or SIGTERM
  turned into one by the caller) during a point stops the sweep; the points
  measured so far are written, with ``meta["interrupted"]``.

  Args:
    cfg: a bench ConfigDict (``chinchax.config.base_bench_config``).
    points: the validated grid (default: :func:`validate_bench`).
    verbose: print one line per point.
  Returns:
    {"rows": [one dict per point], "meta": devices, peak, price, fits, wall time}.
  Raises:
    ConfigError: an invalid bench config (before anything runs).
    RuntimeError: the device probe failed in its child process.
  """
  t_start = time.time()
  points = validate_bench(cfg) if points is None else points
  b = cfg.bench
  workdir = pathlib.Path(os.path.expanduser(cfg.workdir)).resolve()
  workdir.mkdir(parents=True, exist_ok=True)
  for old in ("results.jsonl", "results.csv", "step_time.json"):
    (workdir / old).unlink(missing_ok=True)
  measure_kw = {"warmup_steps": b.warmup_steps, "timed_steps": b.timed_steps,
                "memory_limit_gb": b.memory_limit_gb, "profile_steps": int(b.profile_steps)}
  if b.profile_steps > 0:
    shutil.rmtree(workdir / PROFILE_DIR, ignore_errors=True)  # traces of an earlier sweep
  with tempfile.TemporaryDirectory(prefix="chinchax-bench-") as tmp_name:
    tmp = pathlib.Path(tmp_name)
    base = ml_collections.ConfigDict(cfg.train_config.to_dict())
    if b.isolate:
      info = run_child({"kind": "probe", "config": base.to_dict(), "hardware": b.hardware},
                               b.point_timeout_s, tmp, "probe")
      if "backend" not in info:
        raise RuntimeError(f"the device probe failed: {info.get('error')}")
    else:
      info = probe(base, b.hardware)
    n_dev = info["n_devices"]
    per_device_peak = info["peak_flops"] / n_dev
    price = info["price_per_hour"]
    console.say(f"bench   {len(points)} points on {n_dev} {info['backend']} device(s) "
                f"({info['device_kind']}); peak {info['peak_flops']:.3g} FLOP/s "
                f"({info['peak_flops_source']}); price "
                f"{'unknown' if price is None else '$%.2f/hour' % price}", enabled=verbose)
    rows = []
    interrupted = False
    for i, p in enumerate(points):
      c = point_config(cfg, p)
      c.train.peak_flops_per_device = per_device_peak
      row = _base_row(cfg, p)
      try:
        config_lib.validate(c, n_dev)
        invalid = None
      except config_lib.ConfigError as e:
        invalid = str(e)
      try:
        point_kw = {**measure_kw, "profile_dir": _profile_dir(workdir, p.name, b.profile_steps)}
        if invalid is not None:
          result = {"status": "invalid", "error": invalid}
        elif b.isolate:
          result = run_child({"kind": "point", "config": c.to_dict(), "measure": point_kw},
                             b.point_timeout_s, tmp, f"p{i}")
        else:
          result = measure_point(c, **point_kw)
      except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep what is measured, write the outputs
        console.say(f"interrupted at point {i + 1}/{len(points)}; writing what was measured",
                    enabled=verbose)
        interrupted = True
        break
      row.update(result)
      row["peak_flops_source"] = info["peak_flops_source"]
      if row["status"] == "ok":
        row["price_per_hour"] = price
        row["cost_per_million_tokens"] = (None if price is None
                                          else price / 3600 / row["tokens_per_s"] * 1e6)
      rows.append(row)
      console.say(f"[{i + 1}/{len(points)}] {p.name}: {format_row(row)}", enabled=verbose)
      write_tables(workdir, rows)
    fits = None
    if b.fit_sweep:
      fits = fit_step_time(rows, sweep=b.fit_sweep, n_heldout=b.fit_heldout,
                           hardware_spec=info["hardware_spec"], path=workdir / "step_time.json")
    plots = write_plots(workdir, rows) if b.plots else []
    meta = {"probe": info, "points": len(rows), "interrupted": interrupted,
            "ok": sum(r["status"] == "ok" for r in rows),
            "warmup_steps": b.warmup_steps, "timed_steps": b.timed_steps,
            "isolate": bool(b.isolate), "fits": fits, "wall_s": time.time() - t_start,
            "config": cfg.to_dict(), "plots": [p.name for p in plots]}
    (workdir / "bench.json").write_text(json.dumps(meta, indent=1, default=str))
    (workdir / "summary.md").write_text(summary_markdown(rows, meta))
  _report_outputs(workdir, meta, b.fit_sweep, verbose)
  return {"rows": rows, "meta": meta}


def _report_outputs(workdir: pathlib.Path, meta: dict, fit_sweep: str, verbose: bool) -> None:
  """The closing lines: the files written, and the step-time fit or why there is none."""
  fits = meta["fits"]
  console.say(f"wrote   {workdir}/results.jsonl, results.csv, summary.md, bench.json"
              + (", step_time.json" if fits and fits.get("path") else "")
              + "".join(f", {name}" for name in meta["plots"]) + f" ({meta['wall_s']:.0f} s)",
              enabled=verbose)
  if not fit_sweep:
    console.say("fit     none: bench.fit_sweep is empty, so no step_time.json for plan "
                "--step-time-model (name a sweep, e.g. --config.bench.fit_sweep=size)",
                enabled=verbose)
  elif not (fits and fits.get("path")):
    why = (fits or {}).get("skipped", "no fit")
    console.say(f"fit     none: {why}, so no step_time.json", enabled=verbose)
  if fits and fits.get("heldout"):
    for key, res in fits["heldout"].items():
      console.say(f"fit     {key}: held-out mean |error| {100 * res['mean_abs_error']:.1f}% "
                  f"on {len(res['errors'])} points", enabled=verbose)
