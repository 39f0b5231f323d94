"""What a compiled run means for the target: headroom, FLOPs, traffic, collectives, roofline.

:func:`summarize` turns a :class:`~chinchax.aot.program.CompiledRun` into one
dict (``chinchax compile --json`` prints it) and :func:`render` into the table.

* Memory: XLA's per-device total (arguments + outputs − aliased + temporaries +
  code) against the device's HBM (the accelerator table's per-chip figure),
  headroom in GB and %; beside it the analytic estimate of
  ``chinchax.cost.work.mesh_memory_per_device`` and their ratio.
* FLOPs and bytes: XLA's cost analysis per device against
  ``chinchax.cost.work.step_flops`` / ``bytes_per_step`` for the device's share of
  the batch. XLA counts a ``lax.scan`` body once (``model.scan_layers``), so a
  scanned model is compared per layer: the analytic count taken with one layer.
* Roofline step time (Williams et al. 2009): compute = analytic FLOPs × the
  remat recompute factor (:func:`recompute_factor`) / peak (a device's share of its chip's),
  HBM = bytes / bandwidth (XLA's bytes, which count each loop body once, scaled by the
  analytic step over the analytic count of one microbatch through one scanned layer; the
  analytic bytes where XLA gives none), interconnect = the collectives'
  ring wire bytes / half the chip's two-way interconnect bandwidth (one
  direction's share), data-center network (DCN) = the bytes a device sends between slices
  (``chinchax.aot.hlo``: TPU multi-slice transfers, or groups that span GPU hosts) / the
  chip's DCN bandwidth in one direction (``dcn_bandwidth`` of the accelerator table, with
  its source); the step is their maximum (perfect overlap).
"""

from __future__ import annotations

import dataclasses
import json

from chinchax.cost import budget
from chinchax.cost import work
from chinchax.aot import hlo as hlo_lib
from chinchax.aot.program import CompiledRun

# Headroom below which a program that fits is still flagged: XLA's own reservations,
# fragmentation and the input pipeline's buffers live there.
MIN_HEADROOM = 0.05


def _profile(run: CompiledRun) -> work.ExecutionProfile:
  return profile_of(run.spec.model)


def profile_of(m) -> work.ExecutionProfile:
  """The execution profile of a resolved model config (compute dtype, attention kernel that
  runs: ``work.ExecutionProfile.from_names``), the same on TPU and GPU."""
  return work.ExecutionProfile.from_names(m.compute_dtype, m.attention)


def analytic(run: CompiledRun) -> dict:
  """Analytic per-device FLOPs, bytes and memory of the run's train step, and the FLOPs and
  bytes of what XLA's cost analysis counts (each loop body once: one microbatch, through one
  layer when the layers are scanned)."""
  spec, n_dev = run.spec, run.target.n_devices
  shape, gbs, prof = spec.shape(), spec.global_batch_size, _profile(run)
  data_ways = spec.mesh["data"] * spec.mesh["fsdp"]
  # FLOPs and traffic are spread over every device (tensor splits the matmuls too).
  m = run.microbatches
  flops = work.step_flops(shape, gbs, n_devices=n_dev, profile=prof)
  nbytes = work.bytes_per_step(shape, gbs, n_devices=n_dev, profile=prof, microbatches=m)
  one = dataclasses.replace(shape, n_layers=1)
  mem = work.mesh_memory_per_device(shape, gbs, mesh=spec.mesh, remat=spec.model.remat,
                                    profile=prof, microbatches=m, loss_chunk=run.loss_chunk,
                                    grad_reduce=spec.grad_reduce)
  return {"flops": flops, "bytes": nbytes, "memory": mem.to_dict(), "data_ways": data_ways,
          # what XLA's cost analysis counts: each loop body once (the microbatch loop's, the
          # scanned layers'), so one microbatch through one layer (all of them unscanned)
          "bytes_counted": work.bytes_per_step(one if run.spec.model.scan_layers else shape,
                                               gbs // m, n_devices=n_dev, profile=prof),
          "flops_counted": work.step_flops(one if run.spec.model.scan_layers else shape,
                                           gbs // m, n_devices=n_dev, profile=prof)}


def recompute_factor(run: CompiledRun) -> float:
  """Executed over model matmul FLOPs of the train step: remat's and the chunked loss's
  recompute (``chinchax.cost.work.recompute_factor``)."""
  return work.recompute_factor(run.spec.shape(), run.spec.model.remat,
                               causal_skip=_profile(run).causal_skip, loss_chunk=run.loss_chunk)


def devices_per_chip(run: CompiledRun) -> float:
  """JAX devices per chip of the target (2 on v4, whose compile-only devices are TensorCores)."""
  t = run.target
  return t.n_devices / (t.hardware.n_devices * t.num_slices)


def roofline(run: CompiledRun, ana: dict) -> dict:
  """Compute, HBM and interconnect seconds per step and the bound (see the module doc)."""
  acc = run.target.accelerator
  t = run.train
  scanned = run.spec.model.scan_layers
  share = devices_per_chip(run)  # a device's share of its chip's peak and bandwidths
  compute = ana["flops"] * recompute_factor(run) / (acc.peak_flops / share)
  if t.xla_bytes is not None:
    # XLA counts each loop body once (the microbatch loop's, the scanned layers'): its bytes
    # scaled by the analytic step over the analytic count of what it counted, so layouts with
    # and without microbatches or scanned layers are ranked on the same footing
    hbm_bytes = t.xla_bytes * ana["bytes"] / ana["bytes_counted"]
    hbm_src = ("XLA" if not scanned and run.microbatches == 1 else
               "XLA, scaled from " + " of ".join(
                   ([f"one microbatch of {run.microbatches}"] if run.microbatches > 1 else [])
                   + (["one scanned layer"] if scanned else [])))
  else:
    hbm_bytes, hbm_src = ana["bytes"], "analytic"
  hbm = hbm_bytes / (acc.hbm_bandwidth / share)
  wire = t.collectives.total_wire_bytes if t.collectives is not None else 0.0
  ici = (wire / (acc.interconnect_bandwidth / 2 / share) if acc.interconnect_bandwidth
         else None)
  dcn_bytes = t.collectives.dcn_wire_bytes if t.collectives is not None else 0.0
  dcn = (dcn_bytes / (acc.dcn_bandwidth / share) if acc.dcn_bandwidth else None) if dcn_bytes \
      else 0.0
  parts = {"compute": compute, "hbm": hbm, "interconnect": ici or 0.0, "dcn": dcn or 0.0}
  bound = max(parts, key=parts.get)
  step = parts[bound]
  tokens = run.spec.global_batch_size * run.spec.seq_len
  return {"compute_s": compute, "hbm_s": hbm, "hbm_bytes_source": hbm_src,
          "interconnect_s": ici, "dcn_s": dcn, "dcn_bytes": dcn_bytes,
          "dcn_bandwidth": acc.dcn_bandwidth, "dcn_source": acc.dcn_source,
          "step_s": step, "bound": bound,
          "no_overlap_step_s": compute + hbm + (ici or 0.0) + (dcn or 0.0),
          "tokens_per_s": tokens / step if step > 0 else None,
          "recompute_factor": recompute_factor(run),
          "mfu_bound": (budget.matmul_flops_per_token(run.spec.shape()) * tokens
                        / run.target.n_devices / (acc.peak_flops / share) / step)
                       if step > 0 else None}


def suggestions(run: CompiledRun) -> list[str]:
  """The knobs that would bring a program that does not fit (or barely fits) under HBM."""
  m, mesh, out = run.spec.model, run.spec.mesh, []
  if m.remat == "none":
    out.append("model.remat=dots (keep matmul outputs) or full (keep only each block's input)")
  elif m.remat == "dots":
    out.append("model.remat=full (keep only each block's input)")
  if mesh["data"] > 1:
    out.append(f"mesh.fsdp={mesh['data'] * mesh['fsdp']} mesh.data=1 (shard parameters and "
               f"AdamW state over the data devices too)")
  if not m.scan_layers and m.n_layers > 4:
    out.append("model.scan_layers=True (one compiled layer; also shortens the compile)")
  per_dev = run.spec.global_batch_size // max(1, mesh["data"] * mesh["fsdp"] * run.microbatches)
  if per_dev > 1:
    out.append(f"train.microbatches={2 * run.microbatches} (the same global batch in more, "
               f"smaller microbatches: {per_dev} sequences of {run.spec.seq_len} tokens per "
               f"device per microbatch now), or more devices")
  if m.n_heads % 2 == 0 and mesh["tensor"] == 1:
    out.append("mesh.tensor=2 (split heads, MLP hidden and vocab)")
  out.append("chinchax compile --search tries these and lists the variants that fit")
  return out


def summarize(run: CompiledRun) -> dict:
  """The report of a compiled run as one JSON-ready dict (see the module doc)."""
  spec, target, t = run.spec, run.target, run.train
  ana = analytic(run)
  hbm = target.memory_per_device
  total = t.memory.get("total")
  available = (t.oom or {}).get("available") or hbm
  out = {
      "target": {"spec": target.spec, "platform": target.platform, "topology": target.topology,
                 "num_slices": target.num_slices, "n_devices": target.n_devices,
                 "accelerator": target.accelerator.name,
                 "memory_per_device": hbm},
      "run": {"d_model": spec.model.d_model, "n_layers": spec.model.n_layers,
              "n_heads": spec.model.n_heads, "d_ff": spec.model.d_ff,
              "vocab_size": spec.model.vocab_size, "seq_len": spec.seq_len,
              "global_batch_size": spec.global_batch_size, "N": spec.counts.total,
              "microbatches": run.microbatches,
              "microbatch_size": spec.global_batch_size // run.microbatches,
              "loss_chunk": run.loss_chunk,
              "mesh": spec.mesh, "remat": spec.model.remat,
              "scan_layers": spec.model.scan_layers, "compute_dtype": spec.model.compute_dtype,
              "attention": spec.model.attention, "steps": spec.steps},
      "train_step": t.to_dict(),
      "eval_step": None if run.eval is None else run.eval.to_dict(),
      "fits": t.fits and (total is None or total <= available),
      "analytic": ana,
      "notes": list(run.notes),
      "compiler_options": run.compiler_options,
  }
  if total is not None:
    out["headroom_bytes"] = available - total
    out["headroom_fraction"] = (available - total) / available
    out["headroom_of"] = "XLA's available HBM" if t.oom else "the device's HBM"
    if t.fits:
      out["analytic_memory_ratio"] = ana["memory"]["total"] / total if total else None
    if t.fits and total > available:
      out["notes"].append(f"XLA compiled it, but it needs {total / 1e9:.3f} GB per device of "
                          f"the {available / 1e9:.3f} GB there (XLA does not check HBM when it "
                          f"compiles for {target.platform})")
  hosts = target.num_slices if target.platform == "tpu" else max(
      1, target.n_devices // 8 if target.n_devices > 8 else 1)
  if hosts > 1:
    out["notes"].append(_dcn_note(run, hosts))
  if t.fits:
    layer, m = spec.model.scan_layers, run.microbatches
    # XLA counts each loop body once: compared with the analytic count of what it counted
    ref_flops, ref_bytes = ana["flops_counted"], ana["bytes_counted"]
    out["flops_compared"] = ", ".join(
        ([f"one microbatch of {m}"] if m > 1 else []) + (["per layer"] if layer else [])
        ) + " (XLA counts each loop body once)" if (layer or m > 1) else "whole step"
    out["xla_over_analytic_flops"] = (t.xla_flops / ref_flops if t.xla_flops else None)
    out["xla_over_analytic_bytes"] = (t.xla_bytes / ref_bytes if t.xla_bytes else None)
    if t.xla_flops is None:
      out["notes"].append(f"XLA gives no cost analysis on {target.platform}: the analytic "
                          f"FLOPs and bytes stand in")
    out["roofline"] = roofline(run, ana)
  if not out["fits"] or out.get("headroom_fraction", 1.0) < MIN_HEADROOM:
    out["suggestions"] = suggestions(run)
  return out


def _dcn_note(run: CompiledRun, hosts: int) -> str:
  """What crosses the slices (or GPU hosts) over the data-center network, and its charge."""
  t, acc = run.train, run.target.accelerator
  unit = "slices" if run.target.platform == "tpu" else "hosts"
  dcn = t.collectives.dcn if t.collectives is not None else {}
  sent = t.collectives.dcn_wire_bytes if t.collectives is not None else 0.0
  hint = ("" if run.spec.mesh.get("dcn_data", 1) > 1 else
          f"; mesh.dcn_data={hosts} keeps only the data-parallel reduction between them")
  if not sent:
    return (f"{hosts} {unit}: no collective found crossing them over the data-center "
            f"network{hint}")
  kinds = ", ".join(f"{k} {v['count']}×" for k, v in sorted(dcn.items()))
  where = (f"charged at {acc.dcn_bandwidth / 1e9:.4g} GB/s per chip each way ({acc.dcn_source})"
           if acc.dcn_bandwidth else f"not charged: no DCN bandwidth known for "
           f"{acc.display_name} (the step time is a lower bound)")
  return (f"{hosts} {unit}: {_gb(sent)} per device per step cross the data-center network "
          f"({kinds}), {where}{hint}")


def _gb(x: float | None) -> str:
  if x is None:
    return "n/a"
  if abs(x) >= 1e8:
    return f"{x / 1e9:.3f} GB"
  return f"{x / 1e6:.3g} MB" if abs(x) >= 1e5 or x == 0 else f"{x / 1e3:.3g} KB"


def _ms(x: float | None) -> str:
  if x is None:
    return "n/a"
  return f"{x * 1e3:.3g} ms" if abs(x) >= 1e-5 or x == 0 else f"{x * 1e6:.3g} µs"


def _micro(r: dict) -> str:
  """The run line's " = M 4 × microbatch 64, loss in chunks of 512" (the non-defaults)."""
  m, chunk = r.get("microbatches", 1), r.get("loss_chunk", 0)
  return ((f" = M {m} × microbatch {r['microbatch_size']}" if m > 1 else "")
          + (f", loss in chunks of {chunk}" if chunk else ""))


def render(rep: dict) -> str:
  """The human-readable table of :func:`summarize`'s report."""
  tg, r, t = rep["target"], rep["run"], rep["train_step"]
  lines = [f"target   {tg['spec']}: {tg['n_devices']} × {tg['accelerator']} devices, topology "
           f"{tg['topology']}{' × %d slices' % tg['num_slices'] if tg['num_slices'] > 1 else ''}"
           f", {_gb(tg['memory_per_device'])} HBM per device",
           f"run      d_model={r['d_model']} n_layers={r['n_layers']} n_heads={r['n_heads']} "
           f"d_ff={r['d_ff']} vocab={r['vocab_size']} N={r['N']:,}; batch "
           f"{r['global_batch_size']} × {r['seq_len']}{_micro(r)}; mesh {r['mesh']}; "
           f"remat={r['remat']}"
           f"{' scan_layers' if r['scan_layers'] else ''} {r['compute_dtype']} "
           f"attention={r['attention']}"]
  for name in ("train_step", "eval_step"):
    p = rep.get(name)
    if p is None:
      continue
    mem = p["memory"]
    if p["fits"]:
      lines.append(f"{name:<10} compiled in {p['compile_s']:.1f} s; per device: arguments "
                   f"{_gb(mem['argument'])}, outputs {_gb(mem['output'])} (aliased "
                   f"{_gb(mem['alias'])}), temporaries {_gb(mem['temp'])}, code "
                   f"{_gb(mem['generated_code'])}; total {_gb(mem['total'])}")
    elif p.get("oom"):
      o = p["oom"]
      lines.append(f"{name:<10} DOES NOT FIT: XLA needs {_gb(o['required'])} of {o['what']} "
                   f"per device, {_gb(o['available'])} available "
                   f"({_gb(o['required'] - o['available'])} over, compiled in "
                   f"{p['compile_s']:.1f} s)")
    else:
      lines.append(f"{name:<10} failed to compile: {p.get('error')}")
  if "headroom_bytes" in rep:
    verdict = "fits" if rep["fits"] else "does not fit"
    ratio = rep.get("analytic_memory_ratio")
    of = (f"of {_gb(tg['memory_per_device'])}" if rep.get("headroom_of") != "XLA's available HBM"
          else "of XLA's available HBM")
    lines.append(f"memory     {verdict} at M = {r.get('microbatches', 1)}: headroom "
                 f"{_gb(rep['headroom_bytes'])} "
                 f"({100 * rep['headroom_fraction']:+.1f}%) {of}; "
                 f"analytic estimate {_gb(rep['analytic']['memory']['total'])}"
                 + (f" (× {ratio:.2f} of XLA's)" if ratio else ""))
  if t["fits"]:
    a = rep["analytic"]
    xf, xb = t["xla_flops"], t["xla_bytes"]
    ratio = rep.get("xla_over_analytic_flops")
    lines.append(f"FLOPs      XLA {'n/a' if xf is None else f'{xf:.4g}'} per device, analytic "
                 f"{a['flops']:.4g} (compared {rep['flops_compared']}: XLA / analytic "
                 f"{'n/a' if ratio is None else f'{ratio:.3f}'})")
    br = rep.get("xla_over_analytic_bytes")
    lines.append(f"bytes      XLA {'n/a' if xb is None else f'{xb:.4g}'} accessed per device, "
                 f"analytic {a['bytes']:.4g} (XLA / analytic "
                 f"{'n/a' if br is None else f'{br:.3f}'})")
    c = t["collectives"]
    parts = [f"{k} {c[k]['count']}× {c[k]['operand_bytes'] / 1e6:.4g} MB"
             for k in hlo_lib.KINDS if c[k]["count"]]
    dcn = c.get("dcn") or {}
    across = ("; across slices (DCN): " + "; ".join(
        f"{k} {v['count']}× {v['operand_bytes'] / 1e6:.4g} MB" for k, v in sorted(dcn.items()))
        if dcn else "")
    lines.append("collectives " + ("; ".join(parts) if parts else "none") + across +
                 " per step (operand bytes per device)")
    ro = rep["roofline"]
    lines.append(f"roofline   compute {_ms(ro['compute_s'])}, HBM {_ms(ro['hbm_s'])}, "
                 f"interconnect {_ms(ro['interconnect_s'])}"
                 + (f", DCN {_ms(ro.get('dcn_s'))}" if ro.get("dcn_bytes") else "")
                 + f" → step ≥ {_ms(ro['step_s'])} "
                 f"({ro['bound']}-bound; {ro['tokens_per_s']:,.0f} tokens/s, MFU ≤ "
                 f"{100 * ro['mfu_bound']:.2g}%)")
  for note in rep.get("notes", []):
    lines.append(f"note       {note}")
  for s in rep.get("suggestions", []):
    lines.append(f"try        {s}")
  return "\n".join(lines)


def dumps(rep: dict) -> str:
  """JSON text of a report."""
  return json.dumps(rep, indent=2, sort_keys=True, default=float)
