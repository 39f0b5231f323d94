"""The checks of a config: one :class:`ConfigError` naming the bad value and what is valid.

:func:`validate` is called before any expensive work (corpus reading, model
init, compilation). The choice tuples (:data:`ATTENTION_IMPLS`, ...) are the
valid values of the knobs that take a name.
"""

from __future__ import annotations

import importlib.util
import math
import re

import ml_collections

from chinchax.config.base import ConfigError, check_choice, check_positive  # noqa: F401 (re-exported)

COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash")
REMAT_POLICIES = ("none", "full", "dots")
INIT_RULES = ("fixed", "small")
BUDGET_MODES = ("tokens_per_param", "flops", "tokens", "steps")
N_KINDS = ("total", "non_embedding")
DATA_SOURCES = ("stdlib", "files", "hf")
TOKENIZERS = ("bytes", "bpe", "hf")
DECODE_ERRORS = ("replace", "skip")
MESH_AXES = ("data", "fsdp", "tensor")
WANDB_MODES = ("online", "offline", "disabled")  # train.wandb_mode (chinchax.tracking.wandblog)
DISTRIBUTED_MODES = ("auto", "off", "explicit", "slurm", "tpu")
LR_SCHEDULES = ("cosine", "wsd")
DECAY_SHAPES = ("linear", "1-sqrt")
MAX_DECAY_FRACTION = 0.9  # a wsd decay starts no earlier than the 10% warmup cap (budget.max_warmup_steps)
CPU_COLLECTIVES = ("gloo", "mpi", "none")


def parse_save_steps(text) -> tuple[int, ...]:
  """``train.save_steps`` ("100,250" or "") as sorted distinct positive step numbers.

  Raises:
    ConfigError: an entry that is not a positive integer.
  """
  steps = set()
  for part in str(text).split(","):
    part = part.strip()
    if not part:
      continue
    if not part.isdigit() or int(part) < 1:
      raise ConfigError(f"train.save_steps={text!r}: {part!r} is not a positive step number; "
                        f"give comma-separated steps >= 1, e.g. '400,800', or ''")
    steps.add(int(part))
  return tuple(sorted(steps))


def parse_lr_multipliers(text) -> tuple[float, ...]:
  """``train.lr_multipliers`` ("0.5,1,2" or "") as distinct positive finite floats, in order.

  Raises:
    ConfigError: an entry that is not a positive finite number, or a repeated one.
  """
  out = []
  for part in str(text).split(","):
    part = part.strip()
    if not part:
      continue
    try:
      value = float(part)
    except ValueError:
      value = float("nan")
    if not (math.isfinite(value) and value > 0):
      raise ConfigError(f"train.lr_multipliers={text!r}: {part!r} is not a positive number; "
                        f"give comma-separated multipliers of train.peak_lr, e.g. '0.5,1,2', or ''")
    if value in out:
      raise ConfigError(f"train.lr_multipliers={text!r} repeats {part!r}; give distinct values")
    out.append(value)
  return tuple(out)


def parse_trial_seeds(text) -> tuple[int, ...]:
  """``train.trial_seeds`` ("0,1,2" or "") as distinct non-negative integers, in order.

  Raises:
    ConfigError: an entry that is not a non-negative integer, or a repeated one.
  """
  out = []
  for part in str(text).split(","):
    part = part.strip()
    if not part:
      continue
    if not (part.isascii() and part.isdigit()) or int(part) >= 2 ** 32:
      raise ConfigError(f"train.trial_seeds={text!r}: {part!r} is not an integer in [0, 2^32); "
                        f"give comma-separated init seeds, e.g. '0,1,2', or ''")
    if int(part) in out:
      raise ConfigError(f"train.trial_seeds={text!r} repeats {part!r}; give distinct seeds")
    out.append(int(part))
  return tuple(out)


def data_shuffle_seed(c) -> int:
  """The seed of the training data order: ``data.shuffle_seed``, or ``seed`` when it is -1
  (or absent, in a run config saved before the knob existed)."""
  value = c.data.get("shuffle_seed", -1)
  return c.seed if value == -1 else value


FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: a trial's LR must stay below it
GRAD_REDUCE = ("auto", "step", "microbatch")  # train.grad_reduce (chinchax.cost.work.resolve_grad_reduce)
TRIAL_BATCHING = ("auto", "vmap", "loop")  # train.trial_batching: how one program steps K trials

COMPILER_OPTIONS_AUTO = "auto"  # train.compiler_options: chinchax's choice per backend
_XLA_OPTION_NAME = re.compile(r"^xla_[a-z0-9_]+$")


def compiler_options_text(train_cfg) -> str:
  """``train.compiler_options``, or "auto" for a run config saved before the key existed."""
  return train_cfg.get("compiler_options", COMPILER_OPTIONS_AUTO)


def parse_compiler_options(text) -> dict[str, str]:
  """``train.compiler_options`` other than "auto" ("name=value,name=value" or "") as
  {name: value}; a value may be empty ("xla_cpu_experimental_ynn_fusion_type=").

  Only the syntax is checked here; ``chinchax.train.compiler.resolve`` asks XLA.

  Raises:
    ConfigError: not a string, an entry without ``=``, a name that is not an XLA
      option name (``xla_`` then lower-case letters, digits, underscores), or a
      name given twice.
  """
  if not isinstance(text, str):
    raise ConfigError(f"train.compiler_options={text!r} must be a string: "
                      f"{COMPILER_OPTIONS_AUTO!r}, '' or 'xla_name=value,...'")
  out: dict[str, str] = {}
  for item in (part.strip() for part in text.split(",")):
    if not item:
      continue
    name, eq, value = (x.strip() for x in item.partition("="))
    if not eq or not _XLA_OPTION_NAME.match(name):
      raise ConfigError(
          f"train.compiler_options={text!r}: {item!r} is not name=value with an XLA option "
          f"name (xla_…, e.g. xla_cpu_experimental_ynn_fusion_type=); give "
          f"{COMPILER_OPTIONS_AUTO!r}, '' (XLA's defaults) or comma-separated name=value")
    if name in out:
      raise ConfigError(f"train.compiler_options={text!r} names {name} twice")
    out[name] = value
  return out


def check_wandb(t) -> None:
  """The ``train.wandb*`` knobs (chinchax.tracking.wandblog); the wandb package only when logging is on.

  Raises:
    ConfigError: a knob of the wrong kind, an unknown wandb_mode, an empty wandb_project, or
      ``train.wandb=True`` without the wandb package installed.
  """
  if not isinstance(t.wandb, bool):
    raise ConfigError(f"train.wandb={t.wandb!r} must be True or False")
  check_choice(t.wandb_mode, WANDB_MODES, "train.wandb_mode")
  if not t.wandb:
    return
  if not str(t.wandb_project).strip():
    raise ConfigError("train.wandb_project is empty; name the W&B project the run logs to")
  if importlib.util.find_spec("wandb") is None:
    raise ConfigError("train.wandb=True needs the wandb package: pip install 'chinchax[wandb]' "
                      "(or set train.wandb=False)")


def check_microbatches(global_batch_size: int, microbatches: int, dp: int) -> None:
  """Refuses ``microbatches`` M unless each microbatch's B/M rows split evenly over the
  data-parallel size ``dp`` = data×fsdp (one line naming the M that would work).

  Raises:
    ConfigError: M < 1, or (B/M) not a whole multiple of ``dp``.
  """
  check_positive(microbatches, "train.microbatches", integer=True)
  B, M = global_batch_size, microbatches
  if B % M == 0 and (B // M) % dp == 0:
    return
  ok = [m for m in range(1, B + 1) if B % m == 0 and (B // m) % dp == 0]
  raise ConfigError(
      f"train.microbatches={M} does not split train.global_batch_size={B} into microbatches "
      f"whose rows divide evenly over the data-parallel size data×fsdp = {dp} "
      f"(B/M = {B / M:g}); use one of {', '.join(map(str, ok)) or 'none: B < data×fsdp'}")


def parse_loss_chunk_size(value) -> int | str:
  """``train.loss_chunk_size``: "auto" or an integer >= 0 (0 = unchunked), also as the
  digits of a string (the knob's type is str: ``--config.train.loss_chunk_size=256``).

  Raises:
    ConfigError: anything else.
  """
  if value == "auto":
    return value
  if isinstance(value, str) and value.strip().isdigit():
    return int(value)
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ConfigError(f"train.loss_chunk_size={value!r} must be 'auto' or an integer >= 0 "
                      f"(0 = the whole sequence at once)")
  return value


def resolve_mesh_shape(mesh_cfg, n_devices: int) -> dict[str, int]:
  """Fills in the one -1 axis of the mesh so the product equals ``n_devices``.

  Returns:
    {"data": int, "fsdp": int, "tensor": int} with product ``n_devices``.
  Raises:
    ConfigError: more than one -1, a size 0 or below -1, a product that does not equal (or
      divide, with a -1) the device count, or data not a multiple of ``mesh.dcn_data``.
  """
  sizes = {a: mesh_cfg[a] for a in MESH_AXES}
  for a, s in sizes.items():
    if not isinstance(s, int) or isinstance(s, bool) or (s < 1 and s != -1):
      raise ConfigError(f"mesh.{a}={s!r} must be a positive integer or -1 (fill)")
  fill = [a for a, s in sizes.items() if s == -1]
  if len(fill) > 1:
    raise ConfigError(f"only one mesh axis may be -1, got {', '.join('mesh.' + a for a in fill)}")
  known = math.prod(s for s in sizes.values() if s != -1)
  if fill and n_devices % known:
    raise ConfigError(f"mesh {sizes} cannot fill -1: the other axes multiply to {known}, which "
                      f"does not divide the {n_devices} available devices")
  sizes.update({a: n_devices // known for a in fill})
  if not fill and known != n_devices:
    raise ConfigError(f"mesh data×fsdp×tensor = {'×'.join(map(str, sizes.values()))} = {known} "
                      f"but there are {n_devices} devices; make it {n_devices} or set one axis to -1")
  check_positive(dcn := mesh_cfg.get("dcn_data", 1), "mesh.dcn_data", integer=True)
  if sizes["data"] % dcn:  # data = dcn_data across slices × the data ways within one slice
    raise ConfigError(f"mesh.data={sizes['data']} must be a multiple of mesh.dcn_data={dcn} (or dcn_data=1)")
  return sizes


def parse_host_port(address: str, name: str = "distributed.coordinator_address") -> tuple[str, int]:
  """Splits ``host:port`` (``[v6addr]:port`` for IPv6) into (host, port).

  Raises:
    ConfigError: no port, a port outside 1..65535, or an empty host.
  """
  host, sep, port = str(address).rpartition(":")
  host = host.strip("[]")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ConfigError(f"{name}={address!r} must be host:port with a port in 1..65535, "
                      f"e.g. 10.0.0.2:12355")
  return host, int(port)


def validate_distributed(r: ml_collections.ConfigDict) -> None:
  """Checks ``config.distributed``; raises one :class:`ConfigError` naming the bad value.

  Raises:
    ConfigError: unknown mode or CPU collectives, a malformed coordinator
      address or device-id list, a non-positive timeout, a process count below
      0, or a process id outside [0, num_processes) (or below -1), and an
      ``explicit`` mode missing the address, count or id.
  """
  check_choice(r.mode, DISTRIBUTED_MODES, "distributed.mode")
  check_choice(r.cpu_collectives, CPU_COLLECTIVES, "distributed.cpu_collectives")
  check_positive(r.initialization_timeout_s, "distributed.initialization_timeout_s", integer=True)
  check_positive(r.heartbeat_timeout_s, "distributed.heartbeat_timeout_s", integer=True)
  check_positive(r.num_processes, "distributed.num_processes", allow_zero=True, integer=True)
  pid = r.process_id
  if not isinstance(pid, int) or isinstance(pid, bool) or pid < -1:
    raise ConfigError(f"distributed.process_id={pid!r} must be an integer >= 0 (or -1: from "
                      f"the environment)")
  if r.num_processes and pid >= r.num_processes:
    raise ConfigError(f"distributed.process_id={pid} is out of range for "
                      f"distributed.num_processes={r.num_processes}; use 0..{r.num_processes - 1}")
  if r.coordinator_address:
    parse_host_port(r.coordinator_address)
  ids = str(r.local_device_ids).strip()
  if ids and not all(part.strip().isdigit() for part in ids.split(",")):
    raise ConfigError(f"distributed.local_device_ids={r.local_device_ids!r} must be comma-separated "
                      f"non-negative integers, e.g. '0,1,2,3', or '' (JAX default)")
  if r.mode == "explicit" or (r.mode == "auto" and r.coordinator_address):
    if not r.coordinator_address:
      raise ConfigError("distributed.mode='explicit' needs distributed.coordinator_address=host:port")
    if r.num_processes < 1:
      raise ConfigError(f"distributed.num_processes={r.num_processes} must be >= 1 with a "
                        f"coordinator address ({r.coordinator_address!r})")
    if pid < 0:
      raise ConfigError(f"distributed.process_id={pid} must be set (0..{r.num_processes - 1}) "
                        f"with a coordinator address ({r.coordinator_address!r})")


def validate(c: ml_collections.ConfigDict, n_devices: int | None = None) -> None:
  """Checks every knob; raises one :class:`ConfigError` naming the first bad value.

  Args:
    c: the config.
    n_devices: global device count; when given, the mesh and batch are checked too.
  """
  m, t, b, d = c.model, c.train, c.budget, c.data
  check_positive(c.seed, "seed", allow_zero=True, integer=True)
  if not c.workdir:
    raise ConfigError("workdir is empty; give a directory for checkpoints and metrics")
  check_positive(m.vocab_size, "model.vocab_size", allow_zero=True, integer=True)
  for k in ("d_model", "n_layers", "n_heads", "d_ff"):
    check_positive(m[k], f"model.{k}", integer=True)
  if m.d_model % m.n_heads:
    raise ConfigError(
        f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}; "
        f"choose n_heads among the divisors of d_model, e.g. "
        f"{[h for h in range(1, min(m.d_model, 64) + 1) if m.d_model % h == 0][-4:]}")
  if (m.d_model // m.n_heads) % 2:
    raise ConfigError(f"head_dim = d_model/n_heads = {m.d_model // m.n_heads} must be even for RoPE")
  g, divisors = m.get("n_kv_heads", 0), [h for h in range(1, m.n_heads + 1) if m.n_heads % h == 0]
  if not isinstance(g, int) or isinstance(g, bool) or not (g == 0 or g in divisors):
    raise ConfigError(f"model.n_kv_heads={g!r} must divide model.n_heads={m.n_heads}: one of "
                      f"{divisors}, or 0 (= n_heads)")
  check_positive(m.rope_theta, "model.rope_theta")
  check_positive(m.norm_eps, "model.norm_eps")
  check_choice(m.init, INIT_RULES, "model.init")
  check_positive(m.init_std, "model.init_std")
  check_choice(m.compute_dtype, COMPUTE_DTYPES, "model.compute_dtype")
  check_choice(m.attention, ATTENTION_IMPLS, "model.attention")
  check_choice(m.remat, REMAT_POLICIES, "model.remat")
  if not isinstance(m.scan_layers, bool):
    raise ConfigError(f"model.scan_layers={m.scan_layers!r} must be True or False")
  if not isinstance(m.document_mask, bool):
    raise ConfigError(f"model.document_mask={m.document_mask!r} must be True or False")
  check_positive(t.stop_after_s, "train.stop_after_s", allow_zero=True)
  check_positive(t.stall_timeout_s, "train.stall_timeout_s", allow_zero=True)
  check_positive(t.eval_every_s, "train.eval_every_s", allow_zero=True)
  check_positive(t.checkpoint_every_s, "train.checkpoint_every_s", allow_zero=True)
  check_positive(t.profile_steps, "train.profile_steps", allow_zero=True, integer=True)
  check_positive(t.profile_first_step, "train.profile_first_step", integer=True)
  if not isinstance(t.profile_all_processes, bool):
    raise ConfigError(f"train.profile_all_processes={t.profile_all_processes!r} must be True or "
                      f"False")
  for mult in parse_lr_multipliers(t.lr_multipliers):
    if not t.peak_lr * mult < FLOAT32_MAX:
      raise ConfigError(f"train.lr_multipliers={t.lr_multipliers!r}: {mult:g} × train.peak_lr="
                        f"{t.peak_lr:g} overflows float32 (the LR would be inf); give multipliers "
                        f"below {FLOAT32_MAX / t.peak_lr:.3g}")
  parse_trial_seeds(t.trial_seeds)
  check_choice(t.trial_batching, TRIAL_BATCHING, "train.trial_batching")
  if not isinstance(t.stop_on_nonfinite, bool):
    raise ConfigError(f"train.stop_on_nonfinite={t.stop_on_nonfinite!r} must be True or False")
  check_wandb(t)
  options = compiler_options_text(t)
  if options != COMPILER_OPTIONS_AUTO:
    parse_compiler_options(options)

  check_positive(t.global_batch_size, "train.global_batch_size", integer=True)
  check_positive(t.microbatches, "train.microbatches", integer=True)
  check_choice(t.get("grad_reduce", "auto"), GRAD_REDUCE, "train.grad_reduce")
  parse_loss_chunk_size(t.loss_chunk_size)
  if not isinstance(t.seq_len, int) or t.seq_len < 2:
    raise ConfigError(f"train.seq_len={t.seq_len!r} must be an integer >= 2")
  check_positive(t.peak_lr, "train.peak_lr")
  check_positive(t.warmup_steps, "train.warmup_steps", allow_zero=True, integer=True)
  if not 0.0 <= t.min_lr_ratio <= 1.0:
    raise ConfigError(f"train.min_lr_ratio={t.min_lr_ratio!r} must lie in [0, 1]")
  for k in ("b1", "b2"):
    if not 0.0 <= t[k] < 1.0:
      raise ConfigError(f"train.{k}={t[k]!r} must lie in [0, 1)")
  check_positive(t.eps, "train.eps")
  for k in ("weight_decay", "grad_clip", "z_loss", "peak_flops_per_device"):
    check_positive(t[k], f"train.{k}", allow_zero=True)
  check_positive(t.eval_points, "train.eval_points", allow_zero=True, integer=True)
  if (not isinstance(t.eval_points_from, (int, float)) or isinstance(t.eval_points_from, bool)
      or not 0.0 <= t.eval_points_from < 1.0):
    raise ConfigError(f"train.eval_points_from={t.eval_points_from!r} must be a number in [0, 1)")
  check_positive(t.eval_windows, "train.eval_windows", allow_zero=True, integer=True)
  check_positive(t.curve_eval_windows, "train.curve_eval_windows", allow_zero=True, integer=True)
  for k in ("eval_every", "eval_batches", "log_every", "checkpoint_every", "keep_checkpoints"):
    check_positive(t[k], f"train.{k}", integer=True)
  check_choice(t.schedule, LR_SCHEDULES, "train.schedule")
  check_choice(t.decay_shape, DECAY_SHAPES, "train.decay_shape")
  f = t.decay_fraction
  if (not isinstance(f, (int, float)) or isinstance(f, bool) or not math.isfinite(f)
      or not 0.0 < f <= MAX_DECAY_FRACTION):
    raise ConfigError(f"train.decay_fraction={f!r} must lie in (0, {MAX_DECAY_FRACTION}] (the "
                      f"share of the steps in the final wsd decay; 0.1-0.2 match cosine)")
  check_positive(t.decay_start_step, "train.decay_start_step", allow_zero=True, integer=True)
  parse_save_steps(t.save_steps)
  if not isinstance(t.init_from, str):
    raise ConfigError(f"train.init_from={t.init_from!r} must be a path (a run's workdir), hf:DIR "
                      f"(an HF Llama checkpoint) or ''")
  check_positive(t.init_step, "train.init_step", allow_zero=True, integer=True)
  if t.init_step and not t.init_from.strip():
    raise ConfigError(f"train.init_step={t.init_step} needs train.init_from, the workdir of the "
                      f"run whose checkpoint to start from")

  check_choice(b.mode, BUDGET_MODES, "budget.mode")
  check_choice(b.n_kind, N_KINDS, "budget.n_kind")
  if b.mode == "tokens_per_param":
    check_positive(b.tokens_per_param, "budget.tokens_per_param")
  elif b.mode == "flops":
    check_positive(b.flops, "budget.flops")
  elif b.mode == "tokens":
    check_positive(b.tokens, "budget.tokens", integer=True)
  else:
    check_positive(b.steps, "budget.steps", integer=True)

  check_choice(d.source, DATA_SOURCES, "data.source")
  check_choice(d.txt_documents, ("file", "paragraph", "line"), "data.txt_documents")
  check_choice(d.tokenizer, TOKENIZERS, "data.tokenizer")
  check_choice(d.decode_errors, DECODE_ERRORS, "data.decode_errors")
  if d.source == "hf" and not str(d.hf_name).strip():
    raise ConfigError("data.source='hf' needs data.hf_name, a dataset name or a local dataset directory")
  if d.tokenizer == "hf" and not str(d.tokenizer_path).strip():
    raise ConfigError("data.tokenizer='hf' needs data.tokenizer_path, the path of a tokenizer.json")
  check_positive(d.bpe_vocab_size, "data.bpe_vocab_size", integer=True)
  if d.tokenizer == "bpe" and not 258 <= d.bpe_vocab_size <= 2**31 - 1:
    raise ConfigError(f"data.bpe_vocab_size={d.bpe_vocab_size!r} must be at least 258 "
                      f"(256 byte tokens + EOS + one merge)")
  check_positive(d.prepare_workers, "data.prepare_workers", allow_zero=True, integer=True)
  check_positive(d.shard_mb, "data.shard_mb")
  if d.source == "files" and not str(d.paths).strip():
    raise ConfigError("data.source='files' needs data.paths, e.g. --config.data.paths='corpus/*.txt'")
  if not 0.0 < d.val_fraction < 1.0:
    raise ConfigError(f"data.val_fraction={d.val_fraction!r} must lie strictly between 0 and 1")
  check_positive(d.read_threads, "data.read_threads", integer=True)
  check_choice(d.store_reader, ("auto", "mmap", "memory", "ranged", "tensorstore"),
               "data.store_reader")
  check_positive(d.store_cache_mb, "data.store_cache_mb", allow_zero=True)
  if (not isinstance(d.shuffle_seed, int) or isinstance(d.shuffle_seed, bool)
      or d.shuffle_seed < -1):
    raise ConfigError(f"data.shuffle_seed={d.shuffle_seed!r} must be an integer >= 0, or -1 "
                      f"(follow seed)")
  check_positive(c.mesh.num_cpu_devices, "mesh.num_cpu_devices", allow_zero=True, integer=True)
  validate_distributed(c.distributed)

  if n_devices is not None:
    sizes = resolve_mesh_shape(c.mesh, n_devices)
    if m.n_heads % sizes["tensor"]:
      raise ConfigError(f"model.n_heads={m.n_heads} is not divisible by mesh.tensor={sizes['tensor']}")
    if (m.get("n_kv_heads", 0) or m.n_heads) % sizes["tensor"]:
      raise ConfigError(f"model.n_kv_heads={m.n_kv_heads} is not divisible by mesh.tensor="
                        f"{sizes['tensor']} (key/value heads shard over tensor); use a multiple of "
                        f"{sizes['tensor']} dividing n_heads={m.n_heads}, or a smaller mesh.tensor")
    dp = sizes["data"] * sizes["fsdp"]
    if t.global_batch_size % dp:
      raise ConfigError(
          f"train.global_batch_size={t.global_batch_size} is not divisible by the data-parallel "
          f"size data×fsdp = {sizes['data']}×{sizes['fsdp']} = {dp}; use a multiple of {dp}")
    check_microbatches(t.global_batch_size, t.microbatches, dp)
