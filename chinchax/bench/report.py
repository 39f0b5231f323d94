"""The bench's text: one line per measured point, and ``summary.md``."""

from __future__ import annotations

import math
import pathlib


def attention_label(r: dict) -> str:
  """The kernel that ran, with the requested one when the switch fell back (``cudnn→xla``)."""
  if r["attention"] == r["attention_requested"]:
    return r["attention"]
  return f"{r['attention_requested']}→{r['attention']}"


def format_row(r: dict) -> str:
  """One point's result in a line: its status and error, or its step time, throughput, MFU, memory."""
  if r["status"] != "ok":
    return f"{r['status']}: {str(r.get('error', ''))[:160]}"
  return (f"ok  {1e3 * r['step_time_s']:.1f} ms/step (p10-p90 {1e3 * r['step_time_p10_s']:.1f}-"
          f"{1e3 * r['step_time_p90_s']:.1f})  {r['tokens_per_s']:,.0f} tokens/s  "
          f"MFU {100 * r['mfu']:.2f}%  compile {r['compile_s']:.1f}s  "
          f"mem {(r['memory_peak_bytes'] or 0) / 2**20:,.0f} MiB/device")


def _fmt(v, fmt: str, scale: float = 1.0) -> str:
  if v is None or (isinstance(v, float) and not math.isfinite(v)):
    return "–"
  return format(v * scale if scale != 1.0 else v, fmt)


def summary_markdown(rows: list[dict], meta: dict) -> str:
  """A short report: devices, the point table, failures, the best points, the step-time fits."""
  info = meta["probe"]
  price = info["price_per_hour"]
  lines = [
      "# chinchax bench", "",
      f"- devices: {info['n_devices']} × {info['device_kind']} ({info['backend']}), "
      f"jax {info['jax_version']}",
      f"- MFU peak: {info['peak_flops']:.4g} FLOP/s in all ({info['peak_flops_source']}); "
      f"MFU numerator: matmul FLOPs with causal-halved attention (budget.matmul_flops_per_token)",
      f"- price: {'unknown' if price is None else f'${price:.2f}/hour'} "
      f"(accelerator table entry: {info['accelerator']})",
      f"- per point: compile, 1 first step, {meta['warmup_steps']} warm-up steps, "
      f"{meta['timed_steps']} timed steps (completion to completion, the next step queued); "
      f"{'each point in its own process' if meta['isolate'] else 'all points in one process'}",
      f"- {meta['ok']} of {meta['points']} points ok; wall {meta['wall_s']:.0f} s"
      + ("; **interrupted**: later points were not run" if meta.get("interrupted") else ""), "",
      "| point | status | params | batch×seq | attention | mesh d×f×t | remat | dtype | compile s "
      "| step ms median (p10–p90) | tokens/s | MFU % | peak MiB/device | XLA GFLOP/device "
      "| XLA GB accessed/device | $/M tokens |",
      "|" + "---|" * 16,
  ]
  for r in rows:
    ok = r["status"] == "ok"
    attn = attention_label(r)
    step = (f"{1e3 * r['step_time_s']:.2f} ({1e3 * r['step_time_p10_s']:.2f}–"
            f"{1e3 * r['step_time_p90_s']:.2f})" if ok else "–")
    lines.append(
        f"| {r['name']} | {r['status']} | {_fmt(r.get('params_total'), ',')} | "
        f"{r['global_batch_size']}×{r['seq_len']} | {attn} | "
        f"{r['mesh_data']}×{r['mesh_fsdp']}×{r['mesh_tensor']} | {r['remat']} | "
        f"{r['compute_dtype']} | {_fmt(r.get('compile_s'), '.1f')} | {step} | "
        f"{_fmt(r.get('tokens_per_s'), ',.0f')} | {_fmt(r.get('mfu'), '.2f', 100)} | "
        f"{_fmt(r.get('memory_peak_bytes'), ',.0f', 2**-20)} | "
        f"{_fmt(r.get('xla_flops'), '.3g', 1e-9)} | "
        f"{_fmt(r.get('xla_bytes_accessed'), '.3g', 1e-9)} | "
        f"{_fmt(r.get('cost_per_million_tokens'), '.4f')} |")
  failed = [r for r in rows if r["status"] != "ok"]
  if failed:
    lines += ["", "## Failed points", ""]
    lines += [f"- `{r['name']}` — **{r['status']}**: {str(r.get('error', ''))[:300]}"
              for r in failed]
  ok_rows = [r for r in rows if r["status"] == "ok"]
  if ok_rows:
    lines += ["", "## Fastest point per model (tokens/s)", ""]
    for model in dict.fromkeys(r["model"] for r in ok_rows):
      best = max((r for r in ok_rows if r["model"] == model), key=lambda r: r["tokens_per_s"])
      lines.append(f"- {model}: `{best['name']}` — {best['tokens_per_s']:,.0f} tokens/s, "
                   f"MFU {100 * best['mfu']:.2f}%")
  fits = meta.get("fits")
  if fits:
    lines += ["", f"## Step-time models (sweep `{fits['sweep']}`, {fits['n_points']} ok points)", ""]
    if fits.get("path"):
      lines.append(f"Measurements written to `{pathlib.Path(fits['path']).name}` "
                   f"(`chinchax plan --step-time-model`).")
    if fits.get("skipped"):
      lines.append(f"Not scored: {fits['skipped']}.")
    if fits.get("heldout"):
      lines += ["", f"Held out: {', '.join(fits['heldout_points'])}.", "",
                "| features | held-out mean abs error | errors (predicted/measured − 1) | model |",
                "|---|---|---|---|"]
      names = {"flops_only": "FLOPs (analytic)", "flops_and_bytes": "FLOPs + bytes (analytic)",
               "xla_flops_only": "FLOPs (XLA cost analysis)",
               "xla_flops_and_bytes": "FLOPs + bytes accessed (XLA cost analysis)"}
      for key, res in fits["heldout"].items():
        errs = ", ".join(f"{100 * e:+.1f}%" for e in res["errors"])
        lines.append(f"| {names.get(key, key)} | {100 * res['mean_abs_error']:.1f}% | {errs} | "
                     f"{res['model']} |")
  if meta.get("plots"):
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in meta["plots"]]
  return "\n".join(lines) + "\n"
