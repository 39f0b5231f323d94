"""Every knob of a chinchax run, its default, and its validation.

Defaults live here and only here, each with a one-line comment; code reads
``config.section.knob`` and never ``config.get("knob", default)``. Named
variants (``configs/train.py:tiny``) are small edits of :func:`base_config`.

:func:`validate` is called before any expensive work (corpus reading, model
init, compilation) and raises :class:`ConfigError` naming the bad value and
what would be valid.
"""

from __future__ import annotations

import math

import ml_collections

COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
ATTENTION_IMPLS = ("auto", "xla", "cudnn")
REMAT_POLICIES = ("none", "full", "dots")
BUDGET_MODES = ("tokens_per_param", "flops", "tokens", "steps")
N_KINDS = ("total", "non_embedding")
DATA_SOURCES = ("stdlib", "files")
TOKENIZERS = ("bytes",)
MESH_AXES = ("data", "fsdp", "tensor")


class ConfigError(ValueError):
  """A config value is invalid; the message names the value and what is valid."""


def base_config() -> ml_collections.ConfigDict:
  """The default config: every knob with a one-line comment."""
  c = ml_collections.ConfigDict()
  c.seed = 0                      # seeds parameter init and the data order
  c.workdir = "runs/default"      # checkpoints, metrics.jsonl, config.json go here

  c.model = m = ml_collections.ConfigDict()
  m.vocab_size = 0                # 0 = take the tokenizer's vocab size (bytes: 257)
  m.d_model = 64                  # residual width
  m.n_layers = 3                  # transformer blocks
  m.n_heads = 4                   # attention heads; head_dim = d_model / n_heads
  m.d_ff = 192                    # SwiGLU hidden width (gate, up and down matrices)
  m.tie_embeddings = True         # output head shares the token-embedding matrix
  m.rope_theta = 10_000.0         # RoPE base frequency (Su et al. 2021)
  m.norm_eps = 1e-6               # RMSNorm epsilon
  m.init_std = 0.02               # normal init std for embeddings and projections
  m.compute_dtype = "auto"        # auto = float32 on CPU, bfloat16 on GPU/TPU; params stay float32
  m.attention = "auto"            # auto | xla (einsum+softmax) | cudnn (jax.nn.dot_product_attention)
  m.remat = "none"                # none | full | dots (save matmul outputs) rematerialisation

  c.train = t = ml_collections.ConfigDict()
  t.global_batch_size = 16        # sequences per step, summed over all devices and processes
  t.seq_len = 128                 # tokens per sequence (each window is seq_len + 1 tokens)
  t.peak_lr = 3e-3                # AdamW peak learning rate
  t.warmup_steps = 100            # linear warmup steps (capped at 10% of the run)
  t.min_lr_ratio = 0.1            # cosine decays to this fraction of peak (Chinchilla, Sec. 3)
  t.b1 = 0.9                      # AdamW beta1
  t.b2 = 0.95                     # AdamW beta2
  t.eps = 1e-8                    # AdamW epsilon
  t.weight_decay = 0.1            # decoupled weight decay on matrices (not norms)
  t.decay_embeddings = False      # also decay the token embedding / output head
  t.grad_clip = 1.0               # global-norm clipping threshold; 0 disables
  t.z_loss = 0.0                  # coefficient of z-loss (log Z)^2 (PaLM, Sec. 5); 0 disables
  t.eval_every = 200              # steps between eval-loss measurements (and at the end)
  t.eval_batches = 8              # validation batches per eval
  t.eval_points = 0               # extra evals at this many log-spaced steps (loss-vs-FLOPs curves)
  t.log_every = 25                # steps between metric rows in metrics.jsonl
  t.checkpoint_every = 200        # steps between async checkpoints (and at the end)
  t.keep_checkpoints = 2          # checkpoints kept in the workdir
  t.peak_flops_per_device = 0.0   # FLOP/s peak for MFU; 0 = known accelerator table or CPU matmul calibration
  t.progress = True               # tqdm progress bar on process 0

  c.budget = b = ml_collections.ConfigDict()
  b.mode = "tokens_per_param"     # tokens_per_param | flops | tokens | steps: how D is set
  b.tokens_per_param = 20.0       # D = ratio × N (Chinchilla, Hoffmann et al. 2022, ≈20)
  b.flops = 0.0                   # C for mode=flops: D = C / (6 N)
  b.tokens = 0                    # D for mode=tokens
  b.steps = 0                     # steps for mode=steps: D = steps × batch × seq_len
  b.n_kind = "total"              # which N enters 6ND and D = ratio·N: total (Chinchilla) | non_embedding (Kaplan)

  c.data = d = ml_collections.ConfigDict()
  d.source = "stdlib"             # stdlib (this interpreter's standard-library .py files) | files
  d.paths = ""                    # for source=files: comma-separated globs of .txt / .jsonl files
  d.text_field = "text"           # jsonl field holding the document text
  d.tokenizer = "bytes"           # bytes: 256 byte values + EOS
  d.store_root = "~/.cache/chinchax/stores"  # token stores, one per (corpus, tokenizer)
  d.val_fraction = 0.05           # fraction of documents held out for validation (at least 1)
  d.allow_repeat = False          # permit more than one epoch over the training split
  d.worker_count = 0              # grain worker processes (0 = in the main process)

  c.mesh = x = ml_collections.ConfigDict()
  x.data = -1                     # data-parallel axis size; -1 = fill with the remaining devices
  x.fsdp = 1                      # fully-sharded data-parallel axis size (params + batch)
  x.tensor = 1                    # tensor-parallel axis size (heads, mlp, vocab)
  x.num_cpu_devices = 8           # on CPU: expose this many virtual devices (0 = leave as is)
  return c


def get_variant(name: str) -> ml_collections.ConfigDict:
  """Returns a named variant of :func:`base_config`.

  Raises:
    ConfigError: for an unknown name.
  """
  c = base_config()
  if name == "default":
    return c
  if name == "tiny":
    c.workdir = "runs/tiny"
    c.model.update(d_model=32, n_layers=2, n_heads=2, d_ff=64)
    c.train.update(global_batch_size=8, seq_len=32, warmup_steps=5, eval_every=10,
                   eval_batches=2, log_every=5, checkpoint_every=10, progress=False)
    c.budget.update(mode="steps", steps=20)
    c.data.val_fraction = 0.02
    return c
  if name == "small":
    c.workdir = "runs/small"
    c.model.update(d_model=256, n_layers=6, n_heads=4, d_ff=704)
    c.train.update(global_batch_size=64, seq_len=256, peak_lr=2e-3, warmup_steps=200)
    return c
  if name == "125m":
    c.workdir = "runs/125m"
    c.model.update(d_model=768, n_layers=12, n_heads=12, d_ff=2048)
    c.train.update(global_batch_size=256, seq_len=1024, peak_lr=6e-4, warmup_steps=500,
                   eval_every=1000, checkpoint_every=1000, log_every=50)
    return c
  raise ConfigError(f"unknown config variant {name!r}; known: default, tiny, small, 125m")


def _check_choice(value, choices, name):
  if value not in choices:
    raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def _check_positive(value, name, *, allow_zero=False, integer=False):
  ok_type = isinstance(value, int) and not isinstance(value, bool) if integer else (
      isinstance(value, (int, float)) and not isinstance(value, bool))
  if not ok_type or (isinstance(value, float) and not math.isfinite(value)):
    raise ConfigError(f"{name}={value!r} must be a finite {'integer' if integer else 'number'}")
  if value < 0 or (value == 0 and not allow_zero):
    raise ConfigError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def resolve_mesh_shape(mesh_cfg, n_devices: int) -> dict[str, int]:
  """Fills in the one -1 axis of the mesh so the product equals ``n_devices``.

  Returns:
    {"data": int, "fsdp": int, "tensor": int} with product ``n_devices``.
  Raises:
    ConfigError: more than one -1, a size that is 0 or below -1, or a product
      that does not equal (or divide, with a -1) the device count.
  """
  sizes = {a: mesh_cfg[a] for a in MESH_AXES}
  for a, s in sizes.items():
    if not isinstance(s, int) or isinstance(s, bool) or (s < 1 and s != -1):
      raise ConfigError(f"mesh.{a}={s!r} must be a positive integer or -1 (fill)")
  fill = [a for a, s in sizes.items() if s == -1]
  if len(fill) > 1:
    raise ConfigError(f"only one mesh axis may be -1, got {', '.join('mesh.' + a for a in fill)}")
  known = math.prod(s for s in sizes.values() if s != -1)
  if fill:
    if n_devices % known:
      raise ConfigError(
          f"mesh {sizes} cannot fill -1: the other axes multiply to {known}, which does not "
          f"divide the {n_devices} available devices")
    sizes[fill[0]] = n_devices // known
  elif known != n_devices:
    raise ConfigError(
        f"mesh data×fsdp×tensor = {sizes['data']}×{sizes['fsdp']}×{sizes['tensor']} = {known} "
        f"but there are {n_devices} devices; make the product {n_devices} or set one axis to -1")
  return sizes


def validate(c: ml_collections.ConfigDict, n_devices: int | None = None) -> None:
  """Checks every knob; raises one :class:`ConfigError` naming the first bad value.

  Args:
    c: the config.
    n_devices: global device count; when given, the mesh and batch are checked too.
  """
  m, t, b, d = c.model, c.train, c.budget, c.data
  _check_positive(c.seed, "seed", allow_zero=True, integer=True)
  if not c.workdir:
    raise ConfigError("workdir is empty; give a directory for checkpoints and metrics")
  _check_positive(m.vocab_size, "model.vocab_size", allow_zero=True, integer=True)
  for k in ("d_model", "n_layers", "n_heads", "d_ff"):
    _check_positive(m[k], f"model.{k}", integer=True)
  if m.d_model % m.n_heads:
    raise ConfigError(
        f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}; "
        f"choose n_heads among the divisors of d_model, e.g. "
        f"{[h for h in range(1, min(m.d_model, 64) + 1) if m.d_model % h == 0][-4:]}")
  if (m.d_model // m.n_heads) % 2:
    raise ConfigError(f"head_dim = d_model/n_heads = {m.d_model // m.n_heads} must be even for RoPE")
  _check_positive(m.rope_theta, "model.rope_theta")
  _check_positive(m.norm_eps, "model.norm_eps")
  _check_positive(m.init_std, "model.init_std")
  _check_choice(m.compute_dtype, COMPUTE_DTYPES, "model.compute_dtype")
  _check_choice(m.attention, ATTENTION_IMPLS, "model.attention")
  _check_choice(m.remat, REMAT_POLICIES, "model.remat")

  _check_positive(t.global_batch_size, "train.global_batch_size", integer=True)
  if not isinstance(t.seq_len, int) or t.seq_len < 2:
    raise ConfigError(f"train.seq_len={t.seq_len!r} must be an integer >= 2")
  _check_positive(t.peak_lr, "train.peak_lr")
  _check_positive(t.warmup_steps, "train.warmup_steps", allow_zero=True, integer=True)
  if not 0.0 <= t.min_lr_ratio <= 1.0:
    raise ConfigError(f"train.min_lr_ratio={t.min_lr_ratio!r} must lie in [0, 1]")
  for k in ("b1", "b2"):
    if not 0.0 <= t[k] < 1.0:
      raise ConfigError(f"train.{k}={t[k]!r} must lie in [0, 1)")
  _check_positive(t.eps, "train.eps")
  for k in ("weight_decay", "grad_clip", "z_loss", "peak_flops_per_device"):
    _check_positive(t[k], f"train.{k}", allow_zero=True)
  _check_positive(t.eval_points, "train.eval_points", allow_zero=True, integer=True)
  for k in ("eval_every", "eval_batches", "log_every", "checkpoint_every", "keep_checkpoints"):
    _check_positive(t[k], f"train.{k}", integer=True)

  _check_choice(b.mode, BUDGET_MODES, "budget.mode")
  _check_choice(b.n_kind, N_KINDS, "budget.n_kind")
  if b.mode == "tokens_per_param":
    _check_positive(b.tokens_per_param, "budget.tokens_per_param")
  elif b.mode == "flops":
    _check_positive(b.flops, "budget.flops")
  elif b.mode == "tokens":
    _check_positive(b.tokens, "budget.tokens", integer=True)
  else:
    _check_positive(b.steps, "budget.steps", integer=True)

  _check_choice(d.source, DATA_SOURCES, "data.source")
  _check_choice(d.tokenizer, TOKENIZERS, "data.tokenizer")
  if d.source == "files" and not str(d.paths).strip():
    raise ConfigError("data.source='files' needs data.paths, e.g. --config.data.paths='corpus/*.txt'")
  if not 0.0 < d.val_fraction < 1.0:
    raise ConfigError(f"data.val_fraction={d.val_fraction!r} must lie strictly between 0 and 1")
  _check_positive(d.worker_count, "data.worker_count", allow_zero=True, integer=True)
  _check_positive(c.mesh.num_cpu_devices, "mesh.num_cpu_devices", allow_zero=True, integer=True)

  if n_devices is not None:
    sizes = resolve_mesh_shape(c.mesh, n_devices)
    if m.n_heads % sizes["tensor"]:
      raise ConfigError(f"model.n_heads={m.n_heads} is not divisible by mesh.tensor={sizes['tensor']}")
    dp = sizes["data"] * sizes["fsdp"]
    if t.global_batch_size % dp:
      raise ConfigError(
          f"train.global_batch_size={t.global_batch_size} is not divisible by the data-parallel "
          f"size data×fsdp = {sizes['data']}×{sizes['fsdp']} = {dp}; use a multiple of {dp}")
