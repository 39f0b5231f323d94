"""The bench's figures: tokens/s vs batch, MFU vs model size, peak memory vs batch (PNG)."""

from __future__ import annotations

import pathlib

from chinchax.bench.report import attention_label

_LABEL_PREFIX = {"global_batch_size": "b", "seq_len": "T", "mesh": "mesh ", "remat": "remat "}


def _group_lines(rows, x_key, y_fn, group_keys):
  groups: dict[tuple, list] = {}
  for r in rows:
    r = {**r, "attention": attention_label(r)}
    y = y_fn(r)
    if y is None:
      continue
    groups.setdefault(tuple(r[k] for k in group_keys), []).append((r[x_key], y))
  return {k: sorted(v) for k, v in groups.items()}


def _label(key: tuple, keys: tuple, rows: list[dict]) -> str:
  varying = [k for k in keys if len({attention_label(r) if k == "attention" else r[k]
                                     for r in rows}) > 1] or [keys[0]]
  return " ".join(f"{_LABEL_PREFIX.get(k, '')}{v}" for k, v in zip(keys, key) if k in varying)


def write_plots(workdir: pathlib.Path, rows: list[dict]) -> list[pathlib.Path]:
  """The three PNGs: tokens/s vs batch per attention kernel, MFU vs size, memory vs batch."""
  import matplotlib  # here, not at the top: bench's child processes never draw
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ok = [r for r in rows if r["status"] == "ok"]
  out = []
  specs = (
      ("tokens_per_s_vs_batch.png", "global_batch_size", lambda r: r["tokens_per_s"],
       ("model", "attention", "seq_len", "mesh", "remat", "compute_dtype"),
       "global batch size (sequences)", "tokens/s", "Throughput vs batch, per attention kernel"),
      ("mfu_vs_size.png", "params_total", lambda r: 100 * r["mfu"],
       ("attention", "global_batch_size", "seq_len", "mesh", "remat", "compute_dtype"),
       "parameters (total)", "MFU (%)", "MFU vs model size"),
      ("memory_vs_batch.png", "global_batch_size",
       lambda r: r["memory_peak_bytes"] / 2**20 if r.get("memory_peak_bytes") else None,
       ("model", "remat", "attention", "mesh", "seq_len", "compute_dtype"),
       "global batch size (sequences)", "peak memory per device (MiB)",
       "Peak device memory vs batch"),
  )
  for fname, x_key, y_fn, keys, xlabel, ylabel, title in specs:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)
    for key, pts in sorted(_group_lines(ok, x_key, y_fn, keys).items(), key=lambda kv: str(kv[0])):
      xs, ys = zip(*pts)
      ax.plot(xs, ys, marker="o", label=_label(key, keys, ok))
    if ok:  # batch sizes and parameter counts: log axes
      ax.set_xscale("log", base=2 if x_key == "global_batch_size" else 10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title + ("" if ok else " (no successful points)"))
    ax.grid(True, alpha=0.3)
    if ok:
      ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(workdir / fname, dpi=110)
    plt.close(fig)
    out.append(workdir / fname)
  return out
