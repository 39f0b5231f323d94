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
import re

import ml_collections

from chinchax import errors

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
DISTRIBUTED_MODES = ("auto", "off", "explicit", "slurm", "tpu")
LR_SCHEDULES = ("cosine", "wsd")
DECAY_SHAPES = ("linear", "1-sqrt")
MAX_DECAY_FRACTION = 0.9  # a wsd decay starts no earlier than the 10% warmup cap (budget.max_warmup_steps)
CPU_COLLECTIVES = ("gloo", "mpi", "none")


class ConfigError(errors.UserError):
  """A config value is invalid; the message names the value and what is valid."""


def base_config() -> ml_collections.ConfigDict:
  """The default config: every knob with a one-line comment."""
  c = ml_collections.ConfigDict()
  c.seed = 0                      # seeds parameter init and the data order
  c.workdir = "runs/default"      # checkpoints, metrics.jsonl, config.json go here
  c.compile_cache_dir = "~/.cache/chinchax/jax"  # persistent XLA compilation cache ("" = off)

  c.model = m = ml_collections.ConfigDict()
  m.vocab_size = 0                # 0 = take the tokenizer's vocab size (bytes: 257)
  m.d_model = 64                  # residual width
  m.n_layers = 3                  # transformer blocks
  m.n_heads = 4                   # attention heads; head_dim = d_model / n_heads
  m.d_ff = 192                    # SwiGLU hidden width (gate, up and down matrices)
  m.tie_embeddings = True         # output head shares the token-embedding matrix
  m.rope_theta = 10_000.0         # RoPE base frequency (Su et al. 2021)
  m.norm_eps = 1e-6               # RMSNorm epsilon
  m.init = "fixed"                # fixed: normal(init_std) | small: normal(sqrt(2 / (5 d_model))), SmallInit (Nguyen & Salazar 2019), init_std unused
  m.init_std = 0.02               # normal init std for embeddings and projections (init = fixed)
  m.compute_dtype = "auto"        # auto = float32 on CPU, bfloat16 on GPU/TPU; params stay float32
  m.attention = "auto"            # auto | xla (einsum+softmax) | cudnn (jax.nn.dot_product_attention) | splash (Pallas, TPU)
  m.remat = "none"                # none | full | dots (save matmul outputs) rematerialisation
  m.document_mask = False         # attend only within each document of a packed window (segment ids at EOS; xla attention)
  m.scan_layers = False           # stack layers on a leading axis and nnx.scan them: compile time independent of n_layers (checkpoint layout differs)

  c.train = t = ml_collections.ConfigDict()
  t.global_batch_size = 16        # sequences per step, summed over all devices and processes
  t.seq_len = 128                 # tokens per sequence (each window is seq_len + 1 tokens)
  t.peak_lr = 3e-3                # AdamW peak learning rate
  t.warmup_steps = 100            # linear warmup steps (capped at 10% of the run)
  t.min_lr_ratio = 0.1            # cosine (or wsd) decays to this fraction of peak (Chinchilla, Sec. 3)
  t.schedule = "cosine"           # cosine (one cycle over the run, Chinchilla) | wsd: warmup, constant peak_lr, final decay (Hägele et al. 2024)
  t.decay_fraction = 0.2          # wsd: the decay spans the last fraction of the steps, in (0, 0.9] (10-20% matches cosine: Hägele et al. 2024, Sec. 3)
  t.decay_shape = "1-sqrt"        # wsd: linear | 1-sqrt decay to min_lr_ratio·peak_lr (1-sqrt beats linear: Hägele et al. 2024, Sec. 3)
  t.decay_start_step = 0          # wsd: step where the decay begins (0 = round(steps·(1 - decay_fraction))); at or past the last step: no decay (a trunk)
  t.save_steps = ""               # comma-separated steps whose checkpoints are saved and never deleted (a trunk's branch points)
  t.init_from = ""                # another run's workdir (or its checkpoints dir): start from its checkpoint (params, optimizer, step); ignored once this workdir has checkpoints
  t.init_step = 0                 # the step of init_from's checkpoint (0 = its latest)
  t.b1 = 0.9                      # AdamW beta1
  t.b2 = 0.95                     # AdamW beta2
  t.eps = 1e-8                    # AdamW epsilon
  t.weight_decay = 0.1            # decoupled weight decay on matrices (not norms)
  t.decay_embeddings = False      # also decay the token embedding / output head
  t.grad_clip = 1.0               # global-norm clipping threshold; 0 disables
  t.z_loss = 0.0                  # coefficient of z-loss (log Z)^2 (PaLM, Sec. 5); 0 disables
  t.eval_every = 200              # steps between eval-loss measurements (and at the end)
  t.eval_batches = 8              # validation batches per eval
  t.curve_eval_windows = 0        # with eval_windows: evals before the last step read only about this many of the windows (evenly spaced whole chunks; 0 = all), the final eval all of them
  t.eval_windows = 0              # > 0: every eval uses this many fixed, evenly spaced val windows (same for any batch size) and reports the loss's standard error; 0 = eval_batches batches of the run's own batch
  t.eval_points = 0               # extra evals at this many log-spaced steps (loss-vs-FLOPs curves)
  t.eval_points_from = 0.0        # the eval_points start at this fraction of the run's steps (0 = step 1; 0.1 = its last decade)
  t.log_every = 25                # steps between metric rows in metrics.jsonl
  t.checkpoint_every = 200        # steps between async checkpoints (and at the end)
  t.keep_checkpoints = 2          # checkpoints kept in the workdir
  t.peak_flops_per_device = 0.0   # FLOP/s peak for MFU; 0 = known accelerator table or CPU matmul calibration
  t.progress = True               # tqdm progress bar on process 0
  t.compiler_options = "auto"     # XLA options of the jitted programs: auto (chinchax's per backend; CPU: no YNNPACK dot fusions, train/compiler.py) | "" (XLA's defaults) | "xla_name=value,..."
  t.stop_on_nonfinite = True      # stop at the first NaN/Inf loss or grad norm (checked at log/checkpoint steps; no non-finite state is saved); False = warn and go on

  c.budget = b = ml_collections.ConfigDict()
  b.mode = "tokens_per_param"     # tokens_per_param | flops | tokens | steps: how D is set
  b.tokens_per_param = 20.0       # D = ratio × N (Chinchilla, Hoffmann et al. 2022, ≈20)
  b.flops = 0.0                   # C for mode=flops: D = C / (6 N)
  b.tokens = 0                    # D for mode=tokens
  b.steps = 0                     # steps for mode=steps: D = steps × batch × seq_len
  b.n_kind = "total"              # which N enters 6ND and D = ratio·N: total (Chinchilla) | non_embedding (Kaplan)

  c.data = d = ml_collections.ConfigDict()
  d.source = "stdlib"             # stdlib (this interpreter's standard-library .py files) | files | hf
  d.paths = ""                    # for source=files: comma-separated globs of .txt / .jsonl / .parquet files
  d.text_field = "text"           # jsonl / parquet / hf field holding the document text
  d.txt_documents = "file"        # .txt → documents: file (one each) | paragraph (at blank lines) | line
  d.hf_name = ""                  # for source=hf: dataset name on the hub, or a local dataset directory
  d.hf_config = ""                # for source=hf: dataset configuration name ("" = the default)
  d.hf_split = "train"            # for source=hf: split to read
  d.hf_streaming = False          # for source=hf: stream rows instead of materialising the dataset
  d.tokenizer = "bytes"           # bytes (256 byte values + EOS) | bpe (train a byte-level BPE) | hf (tokenizer.json)
  d.tokenizer_path = ""           # for tokenizer=hf: path of an HF `tokenizers` tokenizer.json
  d.eos_token = ""                # for tokenizer=hf: EOS token appended to documents ("" = detect a common one)
  d.bpe_vocab_size = 8192         # for tokenizer=bpe: vocab size of the trained BPE (incl. 256 bytes + EOS)
  d.decode_errors = "replace"     # invalid UTF-8 in a document: replace (with U+FFFD) | skip (drop the document)
  d.prepare_workers = 0           # tokenizer processes when building a store (0 = min(8, CPU count))
  d.shard_mb = 4.0                # MB of text per tokenization task; also the unit an interrupted build resumes from
  d.store_root = "~/.cache/chinchax/stores"  # token stores, one per (corpus, tokenizer)
  d.val_fraction = 0.05           # fraction of documents held out for validation (at least 1)
  d.allow_repeat = False          # permit more than one epoch over the training split
  d.read_threads = 2              # grain reader threads prefetching the next batches

  c.mesh = x = ml_collections.ConfigDict()
  x.data = -1                     # data-parallel axis size; -1 = fill with the remaining devices
  x.fsdp = 1                      # fully-sharded data-parallel axis size (params + batch)
  x.tensor = 1                    # tensor-parallel axis size (heads, mlp, vocab)
  x.num_cpu_devices = 8           # on CPU: expose this many virtual devices (0 = leave as is)

  c.distributed = r = ml_collections.ConfigDict()
  r.mode = "auto"                 # auto | off | explicit | slurm | tpu: how jax.distributed starts (chinchax.distributed)
  r.coordinator_address = ""      # host:port of process 0's coordinator (explicit; auto uses it when set)
  r.num_processes = 0             # processes in the run (explicit; 0 = from the cluster environment)
  r.process_id = -1               # this process's id in [0, num_processes) (explicit; -1 = from the environment)
  r.local_device_ids = ""         # comma-separated local accelerator ids this process uses ("" = JAX default)
  r.initialization_timeout_s = 300  # seconds for all processes to reach the coordinator before failing
  r.heartbeat_timeout_s = 100     # seconds without a heartbeat before a process is declared dead
  r.cpu_collectives = "gloo"      # gloo | mpi | none: cross-process collectives of the CPU backend
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
    c.model.update(d_model=768, n_layers=12, n_heads=12, d_ff=2048, scan_layers=True)
    c.train.update(global_batch_size=256, seq_len=1024, peak_lr=6e-4, warmup_steps=500,
                   eval_every=1000, checkpoint_every=1000, log_every=50)
    return c
  raise ConfigError(f"unknown config variant {name!r}; known: default, tiny, small, 125m")


def base_ladder_config() -> ml_collections.ConfigDict:
  """The default miniature ladder: 5 IsoFLOP budgets × 5 sizes on the stdlib corpus (bytes)."""
  c = ml_collections.ConfigDict()
  c.workdir = "runs/ladder"       # results.jsonl, runs/<run_id>/ and fit/ go here
  c.ladder = l = ml_collections.ConfigDict()
  l.c_min = 2.5e10                # smallest IsoFLOP budget C (FLOPs, C = 6ND)
  l.c_max = 8e11                  # largest budget (FLOPs): 1.5 decades above c_min
  l.n_budgets = 5                 # budgets, geometrically spaced from c_min to c_max (2.4× apart: each size gets up to 3 horizons, for Approach 1's envelope)
  l.sizes_per_budget = 5          # model sizes per budget, log-spaced around N_opt(C)
  l.spread = 2.5                  # sizes run from N_opt/spread to N_opt·spread
  l.tokens_per_param = 50.0       # D/N at the grid's centre; byte-level models of 4k–100k params with per-size LR and batch optimise near 25–65 here (20 is Chinchilla's at scale)
  l.hparams = "deepseek"          # per-size peak_lr / batch / b2 / warmup rule (chinchax.hparams): fixed (train_config's values for every run) | deepseek | porian
  l.min_steps = 20                # refuse budgets whose runs would be shorter than this
  l.batch_min_steps = 1           # > 1: the deepseek / porian batch shrinks (down to 1 sequence) so every run takes at least this many steps (1000 lifts the few-step largest sizes off a loss plateau, but measured on the default grid it made the approaches disagree more: README)
  l.schedule = "cosine"           # cosine: each run its own cycle | wsd: per shape one trunk, the other runs cool down off it (chinchax.ladder.wsd; Hägele et al. 2024)
  l.cooldown_fraction = 0.2       # wsd: each run decays over its last fraction of steps, in (0, 0.9] (Hägele et al. 2024, Sec. 3: 10-20% match cosine)
  l.fit = True                    # fit Approaches 1-3 to the table when the ladder finishes
  l.validate = True               # after the fit, train a held-out run at validate_factor × c_max with the fitted law's N_opt; predicted vs measured loss in fit.json / fit.md
  l.validate_factor = 3.0         # the validation run's budget as a multiple of c_max (> 1: beyond the grid)
  l.bootstrap = 200               # bootstrap resamples for the fit's confidence intervals
  l.progress = True               # ladder progress bar with ETA
  l.worker = False                # be one of many workers sharing workdir: claim runs until none is left, no grid listing, fit only if this worker settles the ladder
  l.workers = 2                   # local worker processes to start (each on one CPU device / its own accelerators); 1 = run in this process; ignored with worker=True (that process is one worker)
  l.pin_cpus = True               # with workers > 1 on a machine with at least that many cores: pin worker i to CPU core i
  l.max_attempts = 3              # a failed run is retried (by another worker or a later invocation) until it has failed this many times
  l.lease_expiry_s = 300.0        # a run's lease whose heartbeat has not changed this long (observer's clock) is taken over by another worker
  l.heartbeat_s = 15.0            # seconds between heartbeats of a worker's lease (at most lease_expiry_s / 2)
  l.poll_s = 5.0                  # an idle worker (every unfinished run leased by live workers) looks again after this many seconds
  l.status = False                # print each run's state (pending, running on WORKER, done, failed) and exit
  t = base_config()
  t.workdir = "unused"            # each run gets <workdir>/runs/<run_id>
  t.mesh.num_cpu_devices = 1      # ladder models are tiny: one CPU device, no collectives to wait on
  # 0.02 (GPT-2's std, ≈ SmallInit at d_model 768) is 5-10× too small for d_model 8…68: runs sat on
  # a loss plateau for a seed-dependent time (README, "The miniature ladder").
  t.model.init = "small"
  # 16 curve evals over each run's last decade of FLOPs, 0.15 apart in ln FLOPs: Approach 1's lower
  # envelope reads the curves there (evals at step 1, 2, 5… are never on it).
  t.train.update(seq_len=64, eval_points=16, eval_points_from=0.1, eval_every=100_000,
                 eval_batches=4, log_every=50, checkpoint_every=500, keep_checkpoints=1,
                 warmup_steps=50)
  # The final eval: 2048 fixed windows (131k tokens); the eval_points curve evals read 256 of them.
  t.train.update(eval_windows=2048, curve_eval_windows=256)
  c.train_config = t              # the training config every run starts from
  return c


def get_ladder_variant(name: str) -> ml_collections.ConfigDict:
  """Named ladder variants: default, gutenberg, tiny (for tests).

  Raises:
    ConfigError: for an unknown name.
  """
  c = base_ladder_config()
  if name == "default":
    return c
  if name == "gutenberg":
    # BPE tokens carry ~2.5 bytes each: fewer tokens per parameter are optimal, and the
    # 1024-token vocabulary keeps the embedding from dominating N at these sizes.
    c.workdir = "runs/ladder-gutenberg"
    c.ladder.update(c_min=8e10, c_max=2.56e12, tokens_per_param=25.0)
    c.train_config.data.update(source="files", paths="../shared/corpora/gutenberg-en/*.txt",
                               tokenizer="bpe", bpe_vocab_size=1024)
    return c
  if name == "tiny":
    c.workdir = "runs/ladder-tiny"
    c.ladder.update(c_min=1e9, c_max=4e9, n_budgets=3, sizes_per_budget=3, spread=3.0,
                    min_steps=3, batch_min_steps=1, workers=1, bootstrap=20, progress=False, heartbeat_s=1.0,
                    lease_expiry_s=20.0, poll_s=0.5)
    c.train_config.train.update(global_batch_size=8, seq_len=32, eval_points=4, eval_batches=2,
                                eval_windows=64, warmup_steps=2, checkpoint_every=10)
    c.train_config.mesh.num_cpu_devices = 0
    return c
  raise ConfigError(f"unknown ladder variant {name!r}; known: default, gutenberg, tiny")


def bench_model(d_model: int, n_layers: int, n_heads: int, d_ff: int) -> ml_collections.ConfigDict:
  """A named model shape of a bench config (``c.models.NAME``)."""
  return ml_collections.ConfigDict(dict(d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                        d_ff=d_ff))


def bench_sweep(models: str, global_batch_size: str = "16", seq_len: str = "128",
                attention: str = "xla", mesh: str = "dp", remat: str = "none",
                compute_dtype: str = "float32") -> ml_collections.ConfigDict:
  """One sub-grid of a bench config (``c.sweeps.NAME``); its points are the product of its lists.

  Every field is a comma-separated list (a string, so ``--config.sweeps.size.global_batch_size=8,32``
  overrides it): ``models`` names entries of ``c.models``; ``global_batch_size`` and ``seq_len``
  are integers; ``attention`` and ``remat`` take the values of ``model.attention`` and
  ``model.remat``; ``compute_dtype`` is float32 or bfloat16; ``mesh`` is ``dp`` (data=-1),
  ``fsdp`` (fsdp=-1), ``tp`` (tensor=-1) or ``DATAxFSDPxTENSOR`` such as ``2x2x2`` (one may be -1).
  """
  return ml_collections.ConfigDict(dict(
      models=models, global_batch_size=global_batch_size, seq_len=seq_len, attention=attention,
      mesh=mesh, remat=remat, compute_dtype=compute_dtype))


def base_bench_config() -> ml_collections.ConfigDict:
  """The default throughput sweep (``chinchax bench``): ~19 points on 8 virtual CPU devices."""
  c = ml_collections.ConfigDict()
  c.workdir = "runs/bench"        # results.jsonl/.csv, summary.md, bench.json, step_time.json, plots
  c.bench = b = ml_collections.ConfigDict()
  b.warmup_steps = 2              # untimed steps after the compiling one
  b.timed_steps = 5               # steps timed completion to completion, the next one queued (as in train)
  b.isolate = True                # each point in its own process: true peak memory; crashes recorded
  b.point_timeout_s = 900         # with isolate: a point running longer is recorded as timed out
  b.hardware = ""                 # accelerator-table spec for peak FLOP/s and $/hour, e.g. h200 ("" = device kind)
  b.memory_limit_gb = 0.0         # per-device GB above which a point is recorded oom unrun (0 = device limit)
  b.fit_sweep = "size"            # sweep whose points fit the two step-time models ("" = no fit)
  b.fit_heldout = 4               # points of the fit sweep held out to score the step-time models
  b.plots = True                  # write tokens/s-vs-batch, MFU-vs-size and memory-vs-batch PNGs
  c.models = m = ml_collections.ConfigDict()  # named shapes (d_model, n_layers, n_heads, d_ff)
  m.s1 = bench_model(32, 2, 2, 96)
  m.s2 = bench_model(64, 2, 8, 192)  # 8 heads: pure tensor parallelism over 8 devices
  m.s3 = bench_model(96, 2, 4, 256)
  m.s4 = bench_model(64, 4, 4, 192)
  m.s5 = bench_model(128, 2, 4, 352)
  m.huge = bench_model(16384, 2, 128, 43776)  # ~6.4e9 parameters: over any CPU's memory
  c.sweeps = s = ml_collections.ConfigDict()  # named sub-grids (see bench_sweep), run in name order
  s.size = bench_sweep("s1,s2,s3,s4,s5", global_batch_size="8,32")
  s.mesh = bench_sweep("s2", global_batch_size="32", mesh="fsdp,tp,2x2x2")
  s.remat = bench_sweep("s2", global_batch_size="32", remat="full,dots")
  s.attention = bench_sweep("s2", global_batch_size="32", attention="cudnn")
  s.dtype = bench_sweep("s1", global_batch_size="8", compute_dtype="bfloat16")
  s.limits = bench_sweep("s1", global_batch_size="8", mesh="3x1x1")  # a mesh that does not fit 8 devices
  s.huge = bench_sweep("huge", global_batch_size="8")  # recorded oom from the compiled memory analysis
  t = base_config()
  t.workdir = "unused"            # the bench reads no data and writes no checkpoints
  t.compile_cache_dir = ""        # compile time is measured, so no persistent cache
  t.budget.update(mode="steps", steps=1000)  # the LR schedule's horizon only
  c.train_config = t              # the training config every point starts from
  return c


def get_bench_variant(name: str) -> ml_collections.ConfigDict:
  """Named bench variants: default (CPU, 8 virtual devices), h200 (one GPU), tiny (for tests).

  Raises:
    ConfigError: for an unknown name.
  """
  c = base_bench_config()
  if name == "default":
    return c
  if name == "h200":
    c.workdir = "runs/bench-h200"
    c.bench.update(warmup_steps=3, timed_steps=10, fit_sweep="", point_timeout_s=240)
    c.models = m = ml_collections.ConfigDict()
    m.m125 = bench_model(768, 12, 12, 2048)    # 110M parameters with a 32768 vocab
    m.m350 = bench_model(1024, 24, 16, 2816)   # 342M parameters with a 32768 vocab
    c.sweeps = s = ml_collections.ConfigDict()
    # Sweeps run in name order: "big" first, cuDNN before XLA, so a stopped run keeps those.
    s.big = bench_sweep("m350", global_batch_size="16,8", seq_len="1024",
                        attention="cudnn,xla", compute_dtype="bfloat16")
    s.small = bench_sweep("m125", global_batch_size="32,16", seq_len="1024",
                          attention="cudnn,xla", compute_dtype="bfloat16")
    c.train_config.model.update(vocab_size=32768, scan_layers=True)  # compile once per shape, not per layer
    c.train_config.mesh.num_cpu_devices = 0
    return c
  if name == "tiny":
    c.workdir = "runs/bench-tiny"
    c.bench.update(warmup_steps=1, timed_steps=2, isolate=False, fit_sweep="", plots=True)
    c.models = m = ml_collections.ConfigDict()
    m.t1 = bench_model(32, 1, 2, 64)
    c.sweeps = s = ml_collections.ConfigDict()
    s.batch = bench_sweep("t1", global_batch_size="8,16", seq_len="32")
    s.limits = bench_sweep("t1", global_batch_size="8", seq_len="32", mesh="3x1x1")
    return c
  raise ConfigError(f"unknown bench variant {name!r}; known: default, h200, tiny")


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
  _check_choice(r.mode, DISTRIBUTED_MODES, "distributed.mode")
  _check_choice(r.cpu_collectives, CPU_COLLECTIVES, "distributed.cpu_collectives")
  _check_positive(r.initialization_timeout_s, "distributed.initialization_timeout_s", integer=True)
  _check_positive(r.heartbeat_timeout_s, "distributed.heartbeat_timeout_s", integer=True)
  _check_positive(r.num_processes, "distributed.num_processes", allow_zero=True, integer=True)
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
  _check_choice(m.init, INIT_RULES, "model.init")
  _check_positive(m.init_std, "model.init_std")
  _check_choice(m.compute_dtype, COMPUTE_DTYPES, "model.compute_dtype")
  _check_choice(m.attention, ATTENTION_IMPLS, "model.attention")
  _check_choice(m.remat, REMAT_POLICIES, "model.remat")
  if not isinstance(m.scan_layers, bool):
    raise ConfigError(f"model.scan_layers={m.scan_layers!r} must be True or False")
  if not isinstance(m.document_mask, bool):
    raise ConfigError(f"model.document_mask={m.document_mask!r} must be True or False")
  if not isinstance(t.stop_on_nonfinite, bool):
    raise ConfigError(f"train.stop_on_nonfinite={t.stop_on_nonfinite!r} must be True or False")
  options = compiler_options_text(t)
  if options != COMPILER_OPTIONS_AUTO:
    parse_compiler_options(options)

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
  if (not isinstance(t.eval_points_from, (int, float)) or isinstance(t.eval_points_from, bool)
      or not 0.0 <= t.eval_points_from < 1.0):
    raise ConfigError(f"train.eval_points_from={t.eval_points_from!r} must be a number in [0, 1)")
  _check_positive(t.eval_windows, "train.eval_windows", allow_zero=True, integer=True)
  _check_positive(t.curve_eval_windows, "train.curve_eval_windows", allow_zero=True, integer=True)
  for k in ("eval_every", "eval_batches", "log_every", "checkpoint_every", "keep_checkpoints"):
    _check_positive(t[k], f"train.{k}", integer=True)
  _check_choice(t.schedule, LR_SCHEDULES, "train.schedule")
  _check_choice(t.decay_shape, DECAY_SHAPES, "train.decay_shape")
  f = t.decay_fraction
  if (not isinstance(f, (int, float)) or isinstance(f, bool) or not math.isfinite(f)
      or not 0.0 < f <= MAX_DECAY_FRACTION):
    raise ConfigError(f"train.decay_fraction={f!r} must lie in (0, {MAX_DECAY_FRACTION}] (the "
                      f"share of the steps in the final wsd decay; 0.1-0.2 match cosine)")
  _check_positive(t.decay_start_step, "train.decay_start_step", allow_zero=True, integer=True)
  parse_save_steps(t.save_steps)
  if not isinstance(t.init_from, str):
    raise ConfigError(f"train.init_from={t.init_from!r} must be a path (a run's workdir) or ''")
  _check_positive(t.init_step, "train.init_step", allow_zero=True, integer=True)
  if t.init_step and not t.init_from.strip():
    raise ConfigError(f"train.init_step={t.init_step} needs train.init_from, the workdir of the "
                      f"run whose checkpoint to start from")

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
  _check_choice(d.txt_documents, ("file", "paragraph", "line"), "data.txt_documents")
  _check_choice(d.tokenizer, TOKENIZERS, "data.tokenizer")
  _check_choice(d.decode_errors, DECODE_ERRORS, "data.decode_errors")
  if d.source == "hf" and not str(d.hf_name).strip():
    raise ConfigError("data.source='hf' needs data.hf_name, a dataset name or a local dataset directory")
  if d.tokenizer == "hf" and not str(d.tokenizer_path).strip():
    raise ConfigError("data.tokenizer='hf' needs data.tokenizer_path, the path of a tokenizer.json")
  _check_positive(d.bpe_vocab_size, "data.bpe_vocab_size", integer=True)
  if d.tokenizer == "bpe" and not 258 <= d.bpe_vocab_size <= 2**31 - 1:
    raise ConfigError(f"data.bpe_vocab_size={d.bpe_vocab_size!r} must be at least 258 "
                      f"(256 byte tokens + EOS + one merge)")
  _check_positive(d.prepare_workers, "data.prepare_workers", allow_zero=True, integer=True)
  _check_positive(d.shard_mb, "data.shard_mb")
  if d.source == "files" and not str(d.paths).strip():
    raise ConfigError("data.source='files' needs data.paths, e.g. --config.data.paths='corpus/*.txt'")
  if not 0.0 < d.val_fraction < 1.0:
    raise ConfigError(f"data.val_fraction={d.val_fraction!r} must lie strictly between 0 and 1")
  _check_positive(d.read_threads, "data.read_threads", integer=True)
  _check_positive(c.mesh.num_cpu_devices, "mesh.num_cpu_devices", allow_zero=True, integer=True)
  validate_distributed(c.distributed)

  if n_devices is not None:
    sizes = resolve_mesh_shape(c.mesh, n_devices)
    if m.n_heads % sizes["tensor"]:
      raise ConfigError(f"model.n_heads={m.n_heads} is not divisible by mesh.tensor={sizes['tensor']}")
    dp = sizes["data"] * sizes["fsdp"]
    if t.global_batch_size % dp:
      raise ConfigError(
          f"train.global_batch_size={t.global_batch_size} is not divisible by the data-parallel "
          f"size data×fsdp = {sizes['data']}×{sizes['fsdp']} = {dp}; use a multiple of {dp}")
