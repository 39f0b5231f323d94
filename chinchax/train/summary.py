"""The run's summary (``summary.json``) and its result lines."""

from __future__ import annotations

import json
import math
import pathlib

from chinchax.data import unique as unique_lib
from chinchax.train.rundata import RunData
from chinchax.train.steplog import StepLog


def summarize(workdir: pathlib.Path, spec, data: RunData, log: StepLog, *, final_step: int,
             unigram: float, peak_src: str, resumed: bool, wall_s: float,
             init: dict | None = None, compiler_options: dict | None = None) -> dict:
  """The run's summary (also written to ``summary.json``): tokens, N, C, losses, speed.

  ``final_eval_loss_se`` is the standard error of ``final_eval_loss`` over the
  ``eval_windows`` fixed windows (:func:`window_stats`); None when
  ``train.eval_windows`` = 0 (eval batches, no SE).
  """
  train_loss, eval_loss = log.last_train_loss, log.eval_loss
  timed = log.timed_steps > 0
  step_time = log.timed_seconds / log.timed_steps if timed else float("nan")
  manifest = data.train_split.manifest
  return {
      "workdir": str(workdir), "steps": final_step, "tokens": final_step * spec.tokens_per_step,
      "planned_tokens": spec.tokens, "target_tokens": spec.target_tokens,
      "N": spec.n_params, "n_kind": spec.n_kind, "params_total": spec.counts.total,
      "params_non_embedding": spec.counts.non_embedding, "params_embedding": spec.counts.embedding,
      "C_6nd": spec.flops_6nd, "tokens_per_param": spec.tokens_per_param,
      "final_train_loss": train_loss, "final_eval_loss": eval_loss,
      "final_eval_loss_se": json_float(log.eval_loss_se),
      "eval_windows": 0 if data.windows is None else data.windows.n_windows,
      "final_train_bits_per_byte": data.train_bits_per_byte(train_loss),
      "tokenizer": manifest["tokenizer"]["name"], "val_bytes": data.val_split.n_bytes,
      "eval_tokens": (len(data.evals) * spec.global_batch_size * spec.seq_len
                      if data.windows is None else data.windows.n_windows * spec.seq_len),
      "final_eval_bits_per_byte": data.val_bits_per_byte(eval_loss),
      "val_unigram_entropy_nats": unigram,
      "val_unigram_entropy_bits_per_byte": data.val_bits_per_byte(unigram),
      **unigram_gap(eval_loss, unigram),
      "step_time_s": step_time,
      "tokens_per_s": spec.tokens_per_step / step_time if timed else float("nan"),
      "mfu": log.mfu(step_time) if timed else float("nan"),
      "peak_flops": log.peak_total, "peak_flops_source": log.peak_src or peak_src,
      "compile_s": log.compile_s, "wall_s": wall_s, "resumed": resumed,
      "timed_steps": log.timed_steps, "timed_seconds": log.timed_seconds,
      "stopped_by_time": log.stopped_by_time,
      "mesh": {k: int(v) for k, v in spec.mesh.items()},
      "microbatches": spec.microbatches, "loss_chunk_size": spec.loss_chunk_size,
      "compiler_options": dict(compiler_options or {}),
      "init_from": (init or {}).get("from", ""), "init_step": (init or {}).get("step", 0),
      "store": str(data.directory), "store_fingerprint": manifest["fingerprint"],
      # unique_tokens, epochs, repeated_tokens: how often the run read its training tokens
      **unique_lib.epoch_fields(final_step * spec.tokens_per_step,
                                data.unique_tokens or data.train_split.n_tokens),
  }


def unigram_gap(eval_loss: float, unigram: float) -> dict[str, float]:
  """How far the eval loss lies below or above the validation split's unigram entropy.

  Both are fractions of the unigram entropy (the losses in nats/token). ``eval_below_unigram`` = max(0, 1 − eval_loss / unigram): the
  fraction of the unigram entropy the model has learned to save (0.25: a quarter below
  it; 0 while it is not below). ``eval_above_unigram`` = max(0, eval_loss / unigram − 1):
  how much worse than a unigram model it still is (an early or diverged run). At most one
  of them is non-zero; both are NaN when the eval loss is.
  """
  r = eval_loss / unigram
  if not math.isfinite(r):
    return {"eval_below_unigram": float("nan"), "eval_above_unigram": float("nan")}
  return {"eval_below_unigram": max(0.0, 1.0 - r), "eval_above_unigram": max(0.0, r - 1.0)}


def json_float(x: float | None) -> float | None:
  """``x``, or None for None or NaN (an SE of one window)."""
  return None if x is None or not math.isfinite(x) else float(x)


# What only a run that took steps measures: a rerun of a finished run keeps the earlier figures.
SPEED_KEYS = ("step_time_s", "tokens_per_s", "mfu", "compile_s")


def keep_measured_speed(summary: dict, previous: pathlib.Path) -> dict:
  """``summary`` with the speed figures of ``previous`` (summary.json) when this call timed none."""
  if summary["compile_s"] is not None or not previous.exists():
    return summary
  try:
    old = json.loads(previous.read_text())
  except (OSError, ValueError):
    return summary
  return {**summary, **{k: old[k] for k in SPEED_KEYS if k in old}}


def report(s: dict, spec, say) -> None:
  """The result lines: steps and tokens, losses vs the unigram entropy, speed."""
  say(f"done    step {s['steps']}/{spec.steps}, tokens {s['tokens']:,} "
      f"(planned D {spec.tokens:,})")
  se = s["final_eval_loss_se"]
  over = (f" ± {se:.4f} (s.e. over {s['eval_windows']:,} windows)" if se is not None else "")
  say(f"loss    final train {s['final_train_loss']:.4f} nats/token; final eval "
      f"{s['final_eval_loss']:.4f}{over} nats/token = {s['final_eval_bits_per_byte']:.3f} "
      f"bits/byte")
  say(f"        val unigram entropy {s['val_unigram_entropy_nats']:.4f} nats/token = "
      f"{s['val_unigram_entropy_bits_per_byte']:.3f} bits/byte; eval loss is "
      + (f"{100 * s['eval_above_unigram']:.1f}% above it (not yet better than a unigram model)"
         if s["eval_above_unigram"] > 0 else f"{100 * s['eval_below_unigram']:.1f}% below it"))
  say(f"speed   {s['tokens_per_s']:,.0f} tokens/s, {s['step_time_s'] * 1e3:.1f} ms/step, MFU "
      f"{100 * s['mfu']:.2f}% (peak {s['peak_flops']:.3g} FLOP/s: {s['peak_flops_source']}); "
      f"wall {s['wall_s']:.1f}s")
