"""A trained run as an HF Llama (``LlamaForCausalLM``) safetensors checkpoint (``chinchax export``).

  chinchax export WORKDIR --format safetensors [--out DIR] [--step N]
                  [--dtype float32|bfloat16] [--tokenizer tokenizer.json] [--overwrite] [--verify]

Writes ``DIR`` (default ``WORKDIR/export``): ``model.safetensors``,
``config.json`` (Llama layout), ``generation_config.json``, ``export_info.json``
(source run, step, trained seq_len, the tensor mapping), ``tokenizer.json`` and
``tokenizer_config.json``: the run's own tokenizer, found and checked by its sha256,
or for a byte-level run one built to give chinchax's ids (0–255 = the UTF-8 bytes,
256 = EOS); see :mod:`chinchax.export.tokenizer_files` (BOS: the tokenizer's own) and
:mod:`chinchax.export.generation` (a padded vocabulary's ids in ``suppress_tokens``). The output directory rules
(``--overwrite`` replaces only an earlier export) are in :mod:`chinchax.export.outdir`.

The architectures match one to one: pre-norm RMSNorm (``x·rsqrt(mean(x²)+eps)·w``),
multi-head or grouped-query attention without biases (num_key_value_heads = G,
chinchax's ``model.n_kv_heads``; = num_attention_heads for multi-head attention),
scores scaled by 1/√head_dim, SwiGLU MLP (``down(silu(gate(x))·up(x))``), final
RMSNorm, output head tied to the embedding or not. RoPE: chinchax rotates the
(first half, second half) pairs of each head with inverse frequencies
``θ^(-2i/K)``, which is HF Llama's ``rotate_half`` convention, so q/k weights
need no permutation (the permutation in Meta→HF conversions undoes Meta's
interleaved pairs, which chinchax does not use).

The tensor mapping, used by this export and by ``train.init_from=hf:DIR`` alike, is the
one table of :mod:`chinchax.export.llama_table`.
With tied embeddings ``lm_head.weight`` is omitted and ``tie_word_embeddings``
is true. Row h·K + k of q_proj (g·K + k of k/v_proj) is head h (g), dimension k, as
HF's ``view(B, T, -1, K)`` expects; HF's ``repeat_kv`` gives query head h the key/value
head h // (H/G), as chinchax does. A ``model.scan_layers`` run stores ``blocks.*``
stacked [n_layers, ...]; layer i is row i of each.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import tempfile

import numpy as np

from chinchax.cost import budget
from chinchax import console
from chinchax.model import transformer as model_lib
from chinchax.storage import diskfull
from chinchax.storage import paths as paths_lib
from chinchax.export import generation
from chinchax.export import hf_files
from chinchax.export import llama_table
from chinchax.export import outdir
from chinchax.export import tokenizer_files
from chinchax.export.error import ExportError

FORMATS = ("safetensors",)
DTYPES = ("float32", "bfloat16")
# (chinchax parameter, HF tensor, transform), i = layer index; recorded in export_info.json.
MAPPING = llama_table.mapping()


def _strip_values(tree):
  """Orbax's saved NNX state {"x": {"value": arr}} → {"x": arr}."""
  if isinstance(tree, dict):
    if set(tree) == {"value"}:
      return tree["value"]
    return {k: _strip_values(v) for k, v in tree.items()}
  return tree


def load_run(workdir) -> dict:
  """The run's ``config.json`` (config, model signature, budget).

  Raises:
    ExportError: no such directory, or no config.json in it, or a config.json that is not
      a chinchax run's (unreadable JSON, or an HF export's: no "config" and "model_signature").
  """
  path = paths_lib.as_path(workdir) / "config.json"
  if not path.parent.is_dir():
    what = "is a file, not a run directory" if path.parent.exists() else "does not exist"
    raise ExportError(f"run directory {str(workdir)!r} {what}; give the workdir of a chinchax "
                      f"train run (it holds config.json and checkpoints/)")
  if not path.is_file():
    raise ExportError(f"{str(workdir)!r} is not a chinchax run: it has no config.json")
  try:
    run = json.loads(path.read_text())
  except ValueError as e:
    raise ExportError(f"{str(path)!r} cannot be read as JSON ({e}); give the workdir of a "
                      f"chinchax train run") from None
  if not (isinstance(run, dict) and "config" in run and "model_signature" in run):
    hf = isinstance(run, dict) and "model_type" in run
    what = (" (an HF checkpoint's config.json: start a run from it with "
            f"--config.train.init_from=hf:{workdir})" if hf else "")
    raise ExportError(f"{str(workdir)!r} is not a chinchax run: its config.json has no "
                      f"'config' and 'model_signature'{what}; give the workdir of a chinchax "
                      f"train run")
  return run


def load_params(workdir, step: int | None = None) -> tuple[dict, int]:
  """Restores the model parameters of a checkpoint as numpy arrays (no devices needed).

  Args:
    workdir: the run directory (holds ``checkpoints/``).
    step: checkpoint step; None = the latest.
  Returns:
    (params as nested dicts of numpy float32 arrays with chinchax names, step).
  Raises:
    ExportError: no checkpoint, or no checkpoint at ``step``.
  """
  import jax
  import orbax.checkpoint as ocp

  root = paths_lib.as_path(workdir) / "checkpoints"
  steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()
                 and (p / "default").is_dir()) if root.is_dir() else []
  if not steps:
    raise ExportError(f"{str(workdir)!r} has no checkpoint under {root}")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise ExportError(f"{str(workdir)!r} has no checkpoint at step {step}; steps: {steps}")
  path = root / str(step) / "default"
  with ocp.PyTreeCheckpointer() as ckptr:
    item = {"params": _tree_metadata(ckptr, path)["params"]}
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    out = ckptr.restore(path, args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args,
                                                          partial_restore=True))
  return _strip_values(out["params"]), step


# checkpoint path, its mtime → orbax's tree metadata; the most recent few. Orbax's metadata read
# keeps about 0.37 MB per call alive in the process (measured: benchmarks/sample_programs.py), so
# a process that samples one checkpoint again and again reads it once.
_TREES: dict = {}
_MAX_TREES = 8


def _tree_metadata(ckptr, path: pathlib.Path):
  """Orbax's tree metadata of the checkpoint at ``path`` (read once per path and mtime)."""
  st = path.stat()  # a gs:// object's stat has st_mtime (or nothing), not st_mtime_ns
  key = (str(path), getattr(st, "st_mtime_ns", None) or getattr(st, "st_mtime", None))
  if key not in _TREES:
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # orbax warns that the per-item metadata file is absent
    try:
      meta = ckptr.metadata(path)
    finally:
      absl_logger.setLevel(level)
    tree = getattr(meta, "item_metadata", meta)
    while len(_TREES) >= _MAX_TREES:
      _TREES.pop(next(iter(_TREES)))
    _TREES[key] = getattr(tree, "tree", tree)
  return _TREES[key]


def pick_trial(params: dict, run: dict, workdir: pathlib.Path, trial: int | None) -> tuple:
  """(params of one trial, its index or None) of a run's params; a trials run's (``train.trials``)
  carry a leading trial axis: ``trial``, else ``best_trial`` of its summary.json.

  Raises:
    ExportError: ``trial`` given for a plain run or out of range, or a trials run with no
      finished summary (and no ``trial``) or whose trials all diverged.
  """
  t = run.get("config", {}).get("train", {})
  counts = [len([x for x in str(t.get(key, "")).split(",") if x.strip()])
            for key in ("lr_multipliers", "trial_seeds")]
  k = max(counts[0], 1) * max(counts[1], 1)
  if not any(counts):
    if trial is not None:
      raise ExportError(f"--trial {trial}: {str(workdir)!r} is a single run, not a trials run")
    return params, None
  if trial is None:
    summary = workdir / "summary.json"
    trial = json.loads(summary.read_text()).get("best_trial") if summary.is_file() else None
    if trial is None:
      raise ExportError(f"{str(workdir)!r} holds {k} trials and no finished summary names the "
                        f"best (or all diverged); choose one with --trial 0…{k - 1}")
  if not 0 <= trial < k:
    raise ExportError(f"--trial {trial} is out of range: {str(workdir)!r} holds trials 0…{k - 1}")
  return _index_tree(params, trial), trial


def _index_tree(tree, i: int):
  return {k: _index_tree(v, i) if isinstance(v, dict) else np.asarray(v)[i]
          for k, v in tree.items()}


def model_config(run: dict):
  """The float32 ``chinchax.model.transformer.ModelConfig`` of a run's config.json."""

  m, sig = run["config"]["model"], run["model_signature"]
  shape = budget.ModelShape.from_config(sig, seq_len=run["config"]["train"]["seq_len"])
  return model_lib.ModelConfig(
      **dataclasses.asdict(shape), rope_theta=m["rope_theta"], norm_eps=m["norm_eps"],
      init_std=model_lib.init_std(m.get("init", "fixed"), m["init_std"], shape.d_model),
      compute_dtype="float32", attention="xla", remat="none",
      scan_layers=bool(sig.get("scan_layers", False)))


def _param(params: dict, name: str, stacked: bool) -> np.ndarray:
  """The parameter ``name`` (``blocks.3.attn.wq_DHK``) of a restored tree; of a stacked
  (``model.scan_layers``) tree, row 3 of ``blocks.attn.wq_DHK``."""
  parts = name.split(".")
  layer = None
  if parts[0] == "blocks" and stacked:
    layer, parts = int(parts[1]), parts[:1] + parts[2:]
  node = params
  for part in parts:
    node = node[part] if part in node else node[int(part)]
  return np.asarray(node) if layer is None else np.asarray(node)[layer]


def to_llama(params: dict, cfg) -> dict[str, np.ndarray]:
  """chinchax parameters → HF Llama float32 tensors, by :mod:`chinchax.export.llama_table`.

  Args:
    params: nested dicts of arrays with chinchax names (layers as ``blocks.<i>`` or, for
      ``model.scan_layers``, stacked [n_layers, ...] under ``blocks``).
    cfg: the model's ``ModelConfig`` (n_layers, tie_embeddings).
  Returns:
    HF tensor name → contiguous float32 array, in the table's order.
  """
  blocks = params["blocks"]
  stacked = not any(str(k) == "0" for k in blocks)  # model.scan_layers: leaves are [L, ...]
  return {hf: llama_table.to_hf(_param(params, name, stacked).astype(np.float32), e.transform)
          for name, hf, e in llama_table.pairs(cfg.n_layers, cfg.tie_embeddings)}


def llama_config(cfg, run: dict, eos_id: int | None, dtype: str,
                 bos_id: int | None = None) -> dict:
  """HF ``LlamaConfig`` fields for the model (config.json of the export); ``bos_id`` None =
  ``eos_id``."""
  return {
      "architectures": ["LlamaForCausalLM"],
      "model_type": "llama",
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.d_model,
      "intermediate_size": cfg.d_ff,
      "num_hidden_layers": cfg.n_layers,
      "num_attention_heads": cfg.n_heads,
      "num_key_value_heads": cfg.kv_heads,
      "head_dim": cfg.d_model // cfg.n_heads,
      "hidden_act": "silu",
      "max_position_embeddings": run["config"]["train"]["seq_len"],
      "rms_norm_eps": cfg.norm_eps,
      "rope_theta": cfg.rope_theta,
      "rope_scaling": None,
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "attention_bias": False,
      "attention_dropout": 0.0,
      "mlp_bias": False,
      "pretraining_tp": 1,
      "tie_word_embeddings": cfg.tie_embeddings,
      "initializer_range": cfg.init_std,
      "bos_token_id": eos_id if bos_id is None else bos_id,
      "eos_token_id": eos_id,
      "use_cache": True,
      "torch_dtype": dtype,
  }


def numpy_forward(tensors: dict[str, np.ndarray], config: dict,
                  tokens_BT: np.ndarray) -> np.ndarray:
  """Float64 numpy forward pass of an HF Llama checkpoint (HF names and conventions).

  Args:
    tensors: HF tensor name → array, as in ``model.safetensors``.
    config: the export's config.json.
    tokens_BT: int [B, T] token ids.
  Returns:
    float64 logits [B, T, V].
  """
  w = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
  H, K = config["num_attention_heads"], config["head_dim"]
  G = config.get("num_key_value_heads") or H
  eps, theta = config["rms_norm_eps"], config["rope_theta"]
  B, T = tokens_BT.shape

  def rms_norm(x, weight):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight

  def rotate_half(x):
    x1, x2 = x[..., : K // 2], x[..., K // 2:]
    return np.concatenate([-x2, x1], axis=-1)

  inv_freq = 1.0 / theta ** (np.arange(0, K, 2, dtype=np.float64) / K)
  freqs = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]
  emb = np.concatenate([freqs, freqs], axis=-1)             # [T, K]
  cos, sin = np.cos(emb)[None, None], np.sin(emb)[None, None]  # [1, 1, T, K]
  mask = np.triu(np.full((T, T), -np.inf), k=1)

  x = w["model.embed_tokens.weight"][tokens_BT]             # [B, T, D]
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}."
    h = rms_norm(x, w[p + "input_layernorm.weight"])
    heads = lambda y, n: y.reshape(B, T, n, K).transpose(0, 2, 1, 3)  # [B, n, T, K]
    q = heads(h @ w[p + "self_attn.q_proj.weight"].T, H)
    # HF's repeat_kv: key/value head g serves query heads g·H/G … (g+1)·H/G − 1.
    k = np.repeat(heads(h @ w[p + "self_attn.k_proj.weight"].T, G), H // G, axis=1)
    v = np.repeat(heads(h @ w[p + "self_attn.v_proj.weight"].T, G), H // G, axis=1)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(K) + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    att = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, H * K)
    x = x + att @ w[p + "self_attn.o_proj.weight"].T
    h = rms_norm(x, w[p + "post_attention_layernorm.weight"])
    gate = h @ w[p + "mlp.gate_proj.weight"].T
    up = h @ w[p + "mlp.up_proj.weight"].T
    x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
  x = rms_norm(x, w["model.norm.weight"])
  head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
  return x @ head.T


def chinchax_logits(params: dict, cfg, tokens_BT: np.ndarray) -> np.ndarray:
  """float32 logits [B, T, V] of the chinchax model itself with ``params`` (JAX, default device)."""
  import jax.numpy as jnp
  from flax import nnx


  abstract = nnx.eval_shape(lambda: model_lib.Transformer(cfg, nnx.Rngs(params=0)))
  graphdef, state = nnx.split(abstract, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  model = nnx.merge(graphdef, state)
  return np.asarray(model(jnp.asarray(tokens_BT, jnp.int32)))


def export(workdir, out=None, *, fmt: str = "safetensors", step: int | None = None,
           dtype: str = "float32", tokenizer_path: str = "", overwrite: bool = False,
           verify: bool = False, trial: int | None = None) -> pathlib.Path:
  """Exports a run's checkpoint as an HF Llama directory; returns its path.

  Args:
    workdir: the run directory.
    out: output directory (default ``WORKDIR/export``).
    fmt: "safetensors".
    step: checkpoint step (default: latest).
    dtype: tensor dtype written, "float32" or "bfloat16".
    tokenizer_path: a tokenizer.json to include instead of the run's own.
    overwrite: replace ``out`` if it is an earlier export (never anything else).
    verify: compare a float64 numpy forward pass of the exported tensors with
      chinchax's logits on a fixed batch and print the largest difference.
    trial: of a trials run (``train.lr_multipliers`` / ``trial_seeds``), the trial to
      export (default: its summary's ``best_trial``; see :func:`pick_trial`).
  Raises:
    ExportError: unknown format or dtype, not a run, no checkpoint, an ``out`` that
      :func:`chinchax.export.outdir.check_out` refuses (the run itself, an ancestor of it,
      a non-empty directory that is not an earlier export, an earlier export without
      ``overwrite``), or a tokenizer with more ids than the model's vocab_size.
      A tokenizer that is not the run's (sha256), or the run's found nowhere
      (:func:`chinchax.export.tokenizer_files.find`).
    TokenizerError: the tokenizer file is missing or corrupt.
  """
  if fmt not in FORMATS:
    raise ExportError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
  if dtype not in DTYPES:
    raise ExportError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
  try:
    import safetensors.numpy as st
  except ImportError:
    raise ExportError("export needs safetensors: pip install 'chinchax[export]'") from None
  workdir = paths_lib.resolved(workdir)  # local, or gs://bucket/...
  paths_lib.check_reachable(workdir, "run directory")
  if out is not None:
    paths_lib.check_reachable(out, "--out")
  with paths_lib.storage_failures(f"exporting {workdir} to {out or workdir / 'export'}",
                                  workdir, out or ""):
    return _export(workdir, out, fmt, step, dtype, tokenizer_path, overwrite, verify, trial, st)


def _export(workdir, out, fmt, step, dtype, tokenizer_path, overwrite, verify, trial, st):
  """:func:`export` once its arguments are checked and its storage answers."""
  run = load_run(workdir)
  out = outdir.check_out(out or workdir / "export", workdir, overwrite)
  paths_lib.check_writable_dir(out, "--out")
  cfg = model_config(run)
  tok = tokenizer_files.find(workdir, run, tokenizer_path)
  eos_id = tok.eos_id
  if tok.tokenizer.vocab_size > cfg.vocab_size:
    raise ExportError(
        f"tokenizer {tok.info.get('found_at', tok.info['kind'])} has {tok.tokenizer.vocab_size} "
        f"ids but the checkpoint's model has vocab_size={cfg.vocab_size}; it was trained with "
        f"another tokenizer")
  params, step = load_params(workdir, step)
  params, trial = pick_trial(params, run, workdir, trial)
  if params["embed_VD"].shape != (cfg.vocab_size, cfg.d_model):
    raise ExportError(f"checkpoint embedding is {params['embed_VD'].shape}, but config.json "
                      f"says vocab_size={cfg.vocab_size}, d_model={cfg.d_model}")
  tensors = to_llama(params, cfg)
  if dtype == "bfloat16":
    import ml_dtypes
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
  hf_config = llama_config(cfg, run, eos_id, dtype, tok.bos_id)
  gen_config, padded = generation.generation_config(tok, cfg.vocab_size)

  def fill(tmp: pathlib.Path) -> None:
    hf_files.write_hf_files(tmp, tensors, hf_config, gen_config, padded, tok, {
        "workdir": str(workdir), "step": step, "trial": trial, "format": fmt, "dtype": dtype,
        "trained_seq_len": run["config"]["train"]["seq_len"]})

  try:
    outdir.write_atomically(out, fill)
  except Exception as e:
    if not diskfull.is_disk_full(e):
      raise
    local = out if not paths_lib.is_url(out) else tempfile.gettempdir()
    raise diskfull.disk_full(f"writing the export of step {step}", local,
                             sum(v.nbytes for v in tensors.values()),
                             then=f"{out} is as it was") from None
  if padded:
    console.say(f"padded vocabulary: {padded}")
  if verify:
    tokens = (np.arange(2 * 16).reshape(2, 16) * 7919) % cfg.vocab_size
    ref = chinchax_logits(params, cfg, tokens)
    got = numpy_forward(st.load_file(paths_lib.local_copy(out / "model.safetensors")),
                        hf_config, tokens)
    diff, tol = float(np.abs(got - ref).max()), verify_tolerance(dtype, ref)
    verdict = "ok" if diff <= tol else "FAILED"
    console.say(f"verify: {verdict}: max |numpy(export) - chinchax| logit difference "
                f"{diff:.3g} over {tokens.size} positions (tolerance {tol:.3g} for {dtype} "
                f"tensors)")
    if diff > tol:
      raise ExportError(f"the export of {workdir} does not reproduce the run's logits: max "
                        f"difference {diff:.3g} > {tol:.3g} ({dtype}); the files are in {out}")
  return out


def verify_tolerance(dtype: str, ref: np.ndarray) -> float:
  """The largest logit difference ``--verify`` accepts: float32 tensors, 1e-3 × (1 + max |logit|)
  (float32 against float64 arithmetic); bfloat16 tensors, their rounding (2^-8 relative, 8 bits
  of mantissa) carried through the layers: 2^-5 × (1 + max |logit|)."""
  scale = 1.0 + float(np.abs(ref).max())
  return (2.0 ** -5 if dtype == "bfloat16" else 1e-3) * scale
