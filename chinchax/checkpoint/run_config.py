"""A workdir's ``config.json``: what its run was trained with, and the checks of a resume.

:func:`write_run_config` records the config, the model signature and the data
signature; :func:`check_compatible` refuses a resume whose model, data or any
of :data:`RESUME_KEYS` differs, and a workdir holding checkpoints but no
``config.json``.
"""

from __future__ import annotations

import json
import pathlib

from chinchax.storage import paths as paths_lib
from chinchax.checkpoint.integrity import CheckpointError, Unusable, check_shapes, saved_steps

MODEL_KEYS = ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "tie_embeddings",
              "scan_layers", "n_kv_heads")
# Knobs that decide the function trained, the data order, the schedule or the budget: a resume
# must keep them, or the run would silently become another run. (Mesh, dtype, attention kernel
# and remat may change.) data.tokenizer_path is checked by the tokenizer's content hash and the
# corpus by its fingerprint (DATA_SIGNATURE), not by their paths or globs.
RESUME_KEYS = (
    "seed",
    "model.rope_theta", "model.norm_eps", "model.init", "model.init_std", "model.document_mask",
    "train.global_batch_size", "train.seq_len", "train.peak_lr", "train.warmup_steps",
    "train.min_lr_ratio", "train.b1", "train.b2", "train.eps", "train.weight_decay",
    "train.decay_embeddings", "train.grad_clip", "train.z_loss",
    "train.lr_multipliers", "train.trial_seeds",
    "train.schedule", "train.decay_fraction", "train.decay_shape", "train.decay_start_step",
    "budget.mode", "budget.tokens_per_param", "budget.flops", "budget.tokens", "budget.steps",
    "budget.n_kind",
    "data.source", "data.paths", "data.text_field", "data.txt_documents", "data.tokenizer",
    "data.eos_token", "data.bpe_vocab_size", "data.decode_errors", "data.hf_name",
    "data.hf_config", "data.hf_split", "data.val_fraction",
    "data.allow_repeat", "data.shuffle_seed", "data.unique_tokens",
    "data.unique_order",
)


# config.json's "data_signature": what the run reads, by content. (name, what a change means)
DATA_SIGNATURE = {
    "tokenizer_sha256": "data.tokenizer_path (or data.tokenizer) names a tokenizer with other "
                        "contents",
    "store_fingerprint": "the corpus (data.paths / data.source) has other documents or contents",
}



def model_signature(config, vocab_size: int | None = None) -> dict:
  """The model's shape keys (:data:`MODEL_KEYS`) of ``config``, n_kv_heads resolved (0 → n_heads)
  and vocab_size replaced by ``vocab_size`` when given. A config.json written before
  n_kv_heads existed lacks that key; the checks skip keys the saved signature lacks."""
  m = config.model
  sig = {k: (m.get(k, 0) or m.n_heads) if k == "n_kv_heads" else m[k] for k in MODEL_KEYS}
  if vocab_size is not None:
    sig["vocab_size"] = vocab_size
  return sig


def saved_run(workdir: pathlib.Path, abstract_state=None) -> dict | None:
  """config.json of a workdir that holds checkpoints; None when there is no checkpoint.

  Without a config.json, and given ``abstract_state``, the newest checkpoint
  with readable metadata is first compared with it (a different model is
  reported as such), then the workdir is refused.

  Raises:
    CheckpointError: checkpoints without a readable config.json.
  """
  steps = saved_steps(workdir)
  if not steps:
    return None
  path = paths_lib.as_path(workdir) / "config.json"
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as e:
    for step in reversed(steps if abstract_state is not None else []):
      try:
        check_shapes(paths_lib.as_path(workdir) / "checkpoints", step, abstract_state)
        break
      except Unusable:
        continue
    why = "no config.json" if isinstance(e, FileNotFoundError) else f"an unreadable {path.name} ({e})"
    raise CheckpointError(
        f"workdir {workdir} holds checkpoints (steps {', '.join(map(str, steps))}) but {why}, so "
        f"the settings they were trained with cannot be checked; put the run's config.json back, "
        f"or use another workdir") from None


def check_data_signature(workdir: pathlib.Path, key: str, value: str,
                         payload: dict | None = None) -> None:
  """Refuses to resume when the saved ``data_signature[key]`` (see :data:`DATA_SIGNATURE`) differs.

  Raises:
    CheckpointError: naming the setting and both hashes; nothing is written.
  """
  payload = saved_run(workdir) if payload is None else payload
  saved = (payload or {}).get("data_signature", {}).get(key)
  if saved is not None and saved != value:
    raise CheckpointError(
        f"workdir {workdir} holds a run trained on other data: {DATA_SIGNATURE[key]} "
        f"({key} {value[:16]}, saved {saved[:16]}); use another workdir, or the saved data")


def check_compatible(workdir: pathlib.Path, config, vocab_size: int | None = None,
                     tokenizer_sha256: str | None = None, abstract_state=None) -> None:
  """Refuses to resume in ``workdir`` with a model, data or settings that differ from its run.

  Args:
    workdir: the run directory.
    config: the run's config.
    vocab_size: the resolved vocab size (``model.vocab_size``, or the
      tokenizer's when that is 0); None skips the check for ``vocab_size=0``.
    tokenizer_sha256: the tokenizer's content hash (None: not known yet, as for
      a BPE still to be trained; the corpus fingerprint covers it).
    abstract_state: the run's abstract train state: without a config.json the
      checkpoint's array shapes are compared with it first.
  Raises:
    CheckpointError: checkpoints but no config.json; or naming each mismatched
      field (saved vs config), for the vocab size the saved and current
      tokenizers, for the tokenizer its content hash.
  """
  payload = saved_run(workdir, abstract_state)
  if payload is None:
    return
  saved = payload.get("model_signature", {})
  now = model_signature(config, vocab_size)
  for k, v in saved.items():
    if k == "vocab_size" and now[k] == 0:
      continue
    if k == "vocab_size" and now[k] != v:
      saved_tok = payload.get("config", {}).get("data", {}).get("tokenizer", "?")
      raise CheckpointError(
          f"workdir {workdir} holds a checkpoint of a model with vocab_size={v} (tokenizer "
          f"{saved_tok!r}), but this run's tokenizer {config.data.tokenizer!r} and "
          f"model.vocab_size={config.model.vocab_size} give vocab_size={now[k]}; use the "
          f"tokenizer the checkpoint was trained with, or another workdir")
    if k in now and now[k] != v:
      raise CheckpointError(
          f"workdir {workdir} holds a checkpoint of a model with model.{k}={v!r}, but the config "
          f"says model.{k}={now[k]!r}; use another workdir or the saved "
          f"{'layout' if k == 'scan_layers' else 'shape'}")
  saved_cfg = payload.get("config", {})
  changed = []
  for key in RESUME_KEYS:
    old_v, new_v, missing = saved_cfg, config, False
    for part in key.split("."):
      if not isinstance(old_v, dict) or part not in old_v:
        missing = True
        break
      old_v, new_v = old_v[part], new_v[part]
    if not missing and _normal(key, old_v) != _normal(key, new_v):
      changed.append(f"{key}={new_v!r} (saved {old_v!r})")
  if changed:
    raise CheckpointError(
        f"workdir {workdir} holds a run started with other settings; resuming would silently "
        f"change it: {', '.join(changed)}. Use another workdir, or the saved settings")
  if tokenizer_sha256 is not None:  # same settings, but the tokenizer file has other contents
    check_data_signature(workdir, "tokenizer_sha256", tokenizer_sha256, payload)


def _normal(key: str, value):
  """A resume key's value as compared: a trials list by its numbers ("0.5,1" equals "0.5,1.0")."""
  if key in ("train.lr_multipliers", "train.trial_seeds") and isinstance(value, str):
    try:
      return tuple(float(x) for x in value.split(",") if x.strip())
    except ValueError:
      return value
  return value


def saved_init(workdir: pathlib.Path) -> dict | None:
  """The ``init`` record of a workdir's config.json ({"from", "step"}: the checkpoint the run
  started from, ``train.init_from``), or None."""
  try:
    return json.loads((paths_lib.as_path(workdir) / "config.json").read_text()).get("init")
  except (OSError, ValueError):
    return None


def write_run_config(workdir: pathlib.Path, config, spec, data_signature: dict | None = None,
                     init: dict | None = None) -> None:
  """Writes ``config.json``: the full config, the resolved model signature, the data
  signature (keys of :data:`DATA_SIGNATURE`), the budget and, for a run started from
  another run's checkpoint, ``init`` = {"from": its checkpoints directory, "step": s}."""
  payload = {
      "config": json.loads(config.to_json_best_effort()),
      "model_signature": model_signature(config, spec.model.vocab_size),
      "data_signature": dict(data_signature or {}),
      "budget": {"N": spec.n_params, "n_kind": spec.n_kind, "D": spec.tokens,
                 "steps": spec.steps, "C_6nd": spec.flops_6nd},
  }
  if init:
    payload["init"] = dict(init)
  paths_lib.write_text_atomic(paths_lib.as_path(workdir) / "config.json",
                              json.dumps(payload, indent=2))


