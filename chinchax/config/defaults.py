"""Every knob of a chinchax run and its default, and the named variants.

Defaults live here and only here, each with a one-line comment; code reads
``config.section.knob`` and never ``config.get("knob", default)``. Named
variants (``configs/train.py:tiny``) are small edits of :func:`base_config`;
ladder and bench configs (:func:`base_ladder_config`, :func:`base_bench_config`)
hold a training config as ``train_config``. :func:`knob_comments` reads the
one-line comments back for ``--help``.
"""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import ml_collections

from chinchax.config import ladders as config_ladders
from chinchax.config.checks import ConfigError


def base_config() -> ml_collections.ConfigDict:
  """The default config: every knob with a one-line comment."""
  c = ml_collections.ConfigDict()
  c.seed = 0                      # seeds parameter init and the data order (data.shuffle_seed, if set, seeds the order)
  c.workdir = "runs/default"      # checkpoints, metrics.jsonl, config.json go here
  c.compile_cache_dir = "~/.cache/chinchax/jax"  # persistent XLA compilation cache ("" = off)

  c.model = m = ml_collections.ConfigDict()
  m.vocab_size = 0                # 0 = take the tokenizer's vocab size (bytes: 257)
  m.d_model = 64                  # residual width
  m.n_layers = 3                  # transformer blocks
  m.n_heads = 4                   # attention heads; head_dim = d_model / n_heads
  m.n_kv_heads = 0                # key/value heads (grouped-query attention; 1 = multi-query); 0 = n_heads; must divide n_heads
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
  t.init_from = ""                # another run's workdir (or its checkpoints dir): start from its checkpoint (params, optimizer, step); hf:DIR = an HF Llama safetensors checkpoint: its params, model shape and tokenizer, fresh optimizer, step 0 (docs/export.md); ignored once this workdir has checkpoints
  t.init_step = 0                 # the step of init_from's checkpoint (0 = its latest)
  t.b1 = 0.9                      # AdamW beta1
  t.b2 = 0.95                     # AdamW beta2
  t.eps = 1e-8                    # AdamW epsilon
  t.weight_decay = 0.1            # decoupled weight decay on matrices (not norms)
  t.decay_embeddings = False      # also decay the token embedding / output head
  t.grad_clip = 1.0               # global-norm clipping threshold; 0 disables
  t.z_loss = 0.0                  # coefficient of z-loss (log Z)^2 (PaLM, Sec. 5); 0 disables
  t.eval_every = 200              # steps between eval-loss measurements (and at the end)
  t.eval_every_s = 0.0            # > 0: also evaluate at the first log step (train.log_every) after this many seconds of wall clock since the last eval (a pod run's cadence in time; decided on process 0)
  t.eval_batches = 8              # validation batches per eval
  t.curve_eval_windows = 0        # with eval_windows: evals before the last step read only about this many of the windows (evenly spaced whole chunks; 0 = all), the final eval all of them
  t.eval_windows = 0              # > 0: every eval uses this many fixed, evenly spaced val windows (same for any batch size) and reports the loss's standard error; 0 = eval_batches batches of the run's own batch
  t.eval_points = 0               # extra evals at this many log-spaced steps (loss-vs-FLOPs curves)
  t.eval_points_from = 0.0        # the eval_points start at this fraction of the run's steps (0 = step 1; 0.1 = its last decade)
  t.log_every = 25                # steps between metric rows in metrics.jsonl
  t.checkpoint_every = 200        # steps between async checkpoints (and at the end)
  t.checkpoint_every_s = 0.0      # > 0: also checkpoint at the first log step after this many seconds of wall clock since the last checkpoint (decided on process 0)
  t.keep_checkpoints = 2          # checkpoints kept in the workdir
  t.peak_flops_per_device = 0.0   # FLOP/s peak for MFU; 0 = known accelerator table or CPU matmul calibration
  t.progress = True               # tqdm progress bar on process 0
  t.compiler_options = "auto"     # XLA options of the jitted programs: auto (chinchax's per backend; CPU: no YNNPACK dot fusions, train/compiler.py) | "" (XLA's defaults) | "xla_name=value,..."
  t.profile_steps = 0             # > 0: a jax.profiler trace of this many steps into <workdir>/profile/ (xprof / TensorBoard's profile plugin); 0 = off
  t.profile_first_step = 3        # the first step traced (1-based; never a call's first step, which compiles)
  t.profile_all_processes = False # trace on every process, not only process 0
  t.stall_timeout_s = 900.0       # a step (or its checkpoint write) making no progress this long ends the run in one line (exit 69; a stalled XLA collective, a storage server that froze); 0 = never
  t.stop_after_s = 0.0            # > 0: stop (evaluated and checkpointed, summary stopped_by_time) at the first step after this many seconds of timed training in this call (compilation, evals, checkpoints excluded); 0 = train all steps
  t.lr_multipliers = ""           # trials in one program: comma-separated multipliers of peak_lr, e.g. "0.5,1,2" ("" = one trial, ×1); see train/trials.py
  t.trial_seeds = ""              # trials in one program: comma-separated init seeds ("" = seed only); trials = lr_multipliers × trial_seeds, one shared batch stream
  t.trial_batching = "auto"       # trials: auto (loop on CPU, where it measured as fast as vmap; vmap elsewhere) | vmap (batched kernels; sums may be reordered: ~1e-7 after 10 steps) | loop (the K single steps in one program: bitwise equal to single runs)
  t.stop_on_nonfinite = True      # stop at the first NaN/Inf loss or grad norm (checked at log/checkpoint steps; no non-finite state is saved); False = warn and go on
  t.microbatches = 1              # gradient accumulation: the global batch is split into this many microbatches inside one jitted step (lax.scan), gradients summed over tokens in float32, one optimizer update; may change on resume
  t.grad_reduce = "auto"          # microbatches > 1: step (each device sums its own microbatches' gradients in float32 and they are reduced once per step, in the dtype the unsplit step reduces in: bytes independent of M; on fsdp every device holds a full float32 gradient, twice in the scan, and all the weights in compute_dtype: 10 bytes per parameter under bf16) | microbatch (one reduction per microbatch; the accumulator sharded like the weights) | auto = step without fsdp (free there; the splash kernel's shard_map compiles nested in the per-shard one), microbatch with fsdp (step would undo the sharding fsdp was chosen for; set step where chinchax compile shows it fits)
  t.loss_chunk_size = "auto"      # logits + cross-entropy in chunks of this many sequence positions (never the whole [B, T, V]); 0 = unchunked; auto = 0 on CPU, else min(seq_len, 512) when vocab_size >= 32768
  t.wandb = False                 # also log to Weights & Biases (pip install 'chinchax[wandb]'): TensorBoard's scalars and the config; a ladder: one group, a run per ladder run, a run "fit" with the fit's figures (chinchax.tracking.wandblog)
  t.wandb_project = "chinchax"    # W&B project
  t.wandb_entity = ""             # W&B entity (team or user); "" = the account's default
  t.wandb_name = ""               # W&B run name; "" = the workdir's name (a ladder's runs: their run ids)
  t.wandb_group = ""              # W&B group; "" = none (a ladder: the ladder workdir's name)
  t.wandb_mode = "online"         # online | offline (files under <workdir>/wandb/; `wandb sync` uploads them later) | disabled

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
  d.shuffle_seed = -1             # seed of the training data order; -1 = follow seed (trial_seeds share this order)
  d.allow_repeat = False          # permit more than one epoch over the training split
  d.unique_tokens = 0             # train on only the first U tokens of the training split (whole documents, nearest boundary), in epochs of fresh permutations; 0 = the whole split (chinchax.data.unique)
  d.unique_order = "store"        # which documents data.unique_tokens keeps: store (the first of the training split: a prefix) | shuffled (the first of a permutation seeded by the data order's seed: a uniform sample; a larger U keeps a superset)
  d.max_epochs = 0.0              # refuse a run that reads its training tokens (the unique prefix) more than this many times; 0 = no limit
  d.read_threads = 2              # threads reading the next training batches ahead (each reads whole batches)
  d.store_reader = "auto"         # how the token store is read: auto (local: mmap its chunk files; else RAM up to 2^28 tokens, else ranged reads) | mmap | memory | ranged | tensorstore
  d.store_cache_mb = 256.0        # MB of chunk cache per split for store_reader=tensorstore

  c.mesh = x = ml_collections.ConfigDict()
  x.data = -1                     # data-parallel axis size; -1 = fill with the remaining devices
  x.fsdp = 1                      # fully-sharded data-parallel axis size (params + batch)
  x.tensor = 1                    # tensor-parallel axis size (heads, mlp, vocab)
  x.dcn_data = 1                  # of mesh.data, the factor split across slices over the data-center network (TPU slices; CPU/GPU: process groups); divides the slice count
  x.num_cpu_devices = 8           # on CPU: expose this many virtual devices (0 = leave as is)

  c.distributed = r = ml_collections.ConfigDict()
  r.mode = "auto"                 # auto | off | explicit | slurm | tpu: how jax.distributed starts (chinchax.runtime.distributed)
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
                   eval_batches=2, log_every=5, checkpoint_every=10)
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
  l.budget_kind = "flops"         # flops: IsoFLOP budgets c_min … c_max | seconds: IsoTime budgets t_min … t_max seconds of training per run on this hardware, several depths per N (chinchax.ladder.isotime; Inbar & Sernau 2024)
  l.c_min = 2.5e10                # smallest IsoFLOP budget C (FLOPs, C = 6ND)
  l.c_max = 8e11                  # largest budget (FLOPs): 1.5 decades above c_min
  l.n_budgets = 5                 # budgets, geometrically spaced from c_min to c_max (2.4× apart: each size gets up to 3 horizons, for Approach 1's envelope)
  l.sizes_per_budget = 5          # model sizes per budget, log-spaced around N_opt(C)
  l.spread = 2.5                  # sizes run from N_opt/spread to N_opt·spread
  l.tokens_per_param = 50.0       # D/N at the grid's centre; byte-level models of 4k–100k params with per-size LR and batch optimise near 25–65 here (20 is Chinchilla's at scale)
  l.t_min = 4.0                   # seconds: smallest time budget (training seconds of a run; compilation and evals excluded)
  l.t_max = 40.0                  # seconds: largest time budget
  l.depths = "1,2,4"              # seconds: n_layers of every N level (d_model chosen to keep N), comma-separated
  l.flops_per_s = 2e10            # seconds: assumed throughput (6ND FLOPs per second) that centres each budget's N levels on N_opt(T × flops_per_s) and gives the hparams rule its C; the steps come from the step time
  l.step_time = "probe"           # seconds: probe (time each shape's compiled step before its run, cached per shape and host) | PATH of a step-time file (chinchax.cost.step_time) whose model sets the steps
  l.time_control = "fixed"        # seconds: fixed (each run's steps set before it starts from its probe or the step-time file; cosine) | decay (warmup-stable-decay: the constant-LR phase runs on the run's own clock to (1 - cooldown_fraction)·T, then the step count is fixed from the step time measured in it and the decay fills the rest; chinchax.ladder.isoclock)
  l.probe_steps = 100             # seconds: timed steps of a probe (a short `chinchax train` of the run's config, after its compiling step); their mean sets the run's steps
  l.hardware = ""                 # "" = this host's devices | a hardware spec (v5e-8, v5p-32, h100x8, cpu): every run laid out for it by the planner (FSDP over all devices, per run microbatches, remat, loss chunks) and priced by --dry-run (chinchax.ladder.pod)
  l.budget_hours = 0.0            # with ladder.hardware: hours of the whole target the ladder (grid and validation run) may take; ladder.c_max = 0 sizes the budgets to it
  l.decades = 1.5                 # with ladder.c_max = 0: c_min = c_max / 10^decades
  l.shape_rule = "ladder"         # the grid's shape rule (chinchax.planning.shapes.PRESETS): ladder (2 layers, width in steps of 4) | accelerator (multiples of 128, depth by aspect ratio) | cpu
  l.microbatch_rows = 0           # > 0 with ladder.hardware: at most this many sequences per device per microbatch (M raised to meet it); 0 = the planner's smallest M that fits
  l.fit_noise = 0.005             # dry_run: the assumed standard deviation of ln(final eval loss) between reruns of one run (ladder.seeds=2 measures it as seed_sd), for the expected interval of a (synthetic ladders)
  l.hparams = "deepseek"          # per-size peak_lr / batch / b2 / warmup rule (chinchax.cost.hparams): fixed (train_config's values for every run) | deepseek | porian
  l.min_steps = 20                # refuse budgets whose runs would be shorter than this
  l.lr_trials = 1                 # K > 1: every run trains K learning rates in one program (rule's LR × lr_trial_center × lr_trial_factor^u, u = -(K-1)/2 … (K-1)/2; an odd K holds the centre itself, so tuning.md can compare the untuned ×1 trials); the fit reads each point's best (chinchax.ladder.tuning)
  l.lr_trial_factor = 2.0         # ratio of neighbouring LR trials' peak LRs (K = 3: ×0.5, ×1, ×2)
  l.lr_trial_center = 1.0         # the middle trial's multiplier of the rule's LR (2: K = 3 tries ×1, ×2, ×4)
  l.seeds = 1                     # S > 1: every LR trial with S init seeds (seed, seed+1, …) on one batch stream; the point is their mean, seed_sd its noise
  l.batch_min_steps = 1           # > 1: the deepseek / porian batch shrinks (down to 1 sequence) so every run takes at least this many steps (1000 lifts the few-step largest sizes off a loss plateau, but measured on the default grid it made the approaches disagree more: docs/ladder.md)
  l.schedule = "cosine"           # cosine: each run its own cycle | wsd: per shape one trunk, the other runs cool down off it (chinchax.ladder.wsd; Hägele et al. 2024)
  l.unique_tokens = ""            # comma-separated unique-data sizes U (tokens; 0 = the whole split): every (C, N) of the grid trains once per U with data.unique_tokens=U, in epochs (chinchax.ladder.repeat); "" = no axis
  l.validate_unique_tokens = 0    # with a unique_tokens axis: the validation run's data.unique_tokens (its C is validate_factor × c_max, its N the grid's centre rule; no fit needed)
  l.cooldown_fraction = 0.2       # wsd: each run decays over its last fraction of steps, in (0, 0.9] (Hägele et al. 2024, Sec. 3: 10-20% match cosine)
  l.fit = True                    # fit Approaches 1-3 to the table when the ladder finishes
  l.validate = True               # after the fit, train a held-out run at validate_factor × c_max with the fitted law's N_opt; predicted vs measured loss in fit.json / fit.md
  l.validate_factor = 3.0         # the validation run's budget as a multiple of c_max (> 1: beyond the grid)
  l.bootstrap = 200               # bootstrap resamples for the fit's confidence intervals
  l.fit_grid = ""                 # Approach 3's L-BFGS start grid, a `chinchax fit --grid` spec ("alpha=0:1:11,beta=0.2/0.5"; unnamed coordinates keep Chinchilla's values) | "" = the default grid of 4500+ starts
  l.progress = True               # ladder progress bar with ETA
  l.worker = False                # be one of many workers sharing workdir: claim runs until none is left, no grid listing, fit only if this worker settles the ladder
  l.workers = 2                   # local worker processes to start (each on one CPU device / its own accelerators); 1 = run in this process; ignored with worker=True (that process is one worker)
  l.pin_cpus = True               # with workers > 1 on a machine with at least that many cores: pin worker i to CPU core i
  l.max_attempts = 3              # a failed run is retried (by another worker or a later invocation) until it has failed this many times
  l.lease_expiry_s = 300.0        # a run's lease whose heartbeat has not changed this long (observer's clock) is taken over by another worker
  l.heartbeat_s = 15.0            # seconds between heartbeats of a worker's lease (at most lease_expiry_s / 2)
  l.poll_s = 5.0                  # an idle worker (every unfinished run leased by live workers) looks again after this many seconds
  l.dry_run = False               # with ladder.hardware: print each run's layout, memory, step time, hours and dollars, the totals and the expected interval of a, and exit; writes nothing, reads no data (also: chinchax ladder --dry-run)
  l.status = False                # print each run's state (pending, running on WORKER, done, failed) and exit
  t = base_config()
  t.workdir = "unused"            # each run gets <workdir>/runs/<run_id>
  t.mesh.num_cpu_devices = 1      # ladder models are tiny: one CPU device, no collectives to wait on
  # 0.02 (GPT-2's std, ≈ SmallInit at d_model 768) is 5-10× too small for d_model 8…68: runs sat on
  # a loss plateau for a seed-dependent time (docs/ladder.md).
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
  """Named ladder variants: default, gutenberg, isotime, pod, pod_cpu, repeat, tiny and
  repeat_tiny (tests).

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
  if name == "isotime":
    # 3 time budgets × 3 N levels × 3 depths on one CPU core per worker: equal N, equal seconds.
    c.workdir = "runs/ladder-isotime"
    c.ladder.update(budget_kind="seconds", n_budgets=3, sizes_per_budget=3, t_min=4.0,
                    t_max=40.0, depths="1,2,4", time_control="decay")
    c.train_config.train.eval_points = 0  # the fit reads final losses only: no curve evals
    # One reader thread beside the step on a worker's one core: with two, the same run's step
    # time varied 25-37 ms over 8 repeats on this 2-core host, with one 23-28 ms (docs/time-budgets.md).
    c.train_config.data.read_threads = 1
    return c
  if name in config_ladders.REPEAT_VARIANTS:  # data-constrained: a unique_tokens axis
    return config_ladders.repeat_variant(get_ladder_variant("tiny") if name == "repeat_tiny"
                                         else c, name)
  if name in config_ladders.POD_VARIANTS:  # an accelerator ladder (ladder.hardware) and its CPU scale-down
    return config_ladders.pod_variant(c, name)
  if name == "tiny":
    c.workdir = "runs/ladder-tiny"
    c.ladder.update(c_min=1e9, c_max=4e9, n_budgets=3, sizes_per_budget=3, spread=3.0,
                    min_steps=3, batch_min_steps=1, workers=1, bootstrap=20, progress=False, heartbeat_s=1.0,
                    lease_expiry_s=20.0, poll_s=0.5)
    c.train_config.train.update(global_batch_size=8, seq_len=32, eval_points=4, eval_batches=2,
                                eval_windows=64, warmup_steps=2, checkpoint_every=10)
    c.train_config.mesh.num_cpu_devices = 0
    return c
  raise ConfigError(f"unknown ladder variant {name!r}; known: default, gutenberg, isotime, "
                    f"pod, pod_cpu, repeat, repeat_tiny, tiny")


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
  b.profile_steps = 0             # > 0: trace this many more steps per point (after the timed ones) into <workdir>/profile/<point>/
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


_SECTIONED = {"train": "base_config", "ladder": "base_ladder_config", "bench": "base_bench_config"}

# A bench config's named shapes and sub-grids (``models.NAME.FIELD``, ``sweeps.NAME.FIELD``).
BENCH_FIELD_COMMENTS = {
    "models.d_model": "residual width of this shape",
    "models.n_layers": "transformer blocks of this shape",
    "models.n_heads": "attention heads of this shape",
    "models.d_ff": "MLP hidden width of this shape",
    "sweeps.models": "comma-separated names of models.* entries this sub-grid runs",
    "sweeps.global_batch_size": "comma-separated global batch sizes (sequences per step)",
    "sweeps.seq_len": "comma-separated sequence lengths (tokens)",
    "sweeps.attention": "comma-separated model.attention values (xla, cudnn, ...)",
    "sweeps.mesh": "comma-separated meshes: dp, fsdp, tp or DATAxFSDPxTENSOR such as 2x2x2",
    "sweeps.remat": "comma-separated model.remat values (none, full, dots)",
    "sweeps.compute_dtype": "comma-separated compute dtypes (float32, bfloat16)",
}


def knob_comments(kind: str = "train") -> dict[str, str]:
  """The one-line comment of every knob of one kind of config, by dotted path.

  Args:
    kind: "train" (:func:`base_config`), "ladder" (:func:`base_ladder_config`) or "bench"
      (:func:`base_bench_config`).
  Returns:
    {"model.d_model": "residual width", ...}: the knobs as they sit in that config;
    a ladder's or bench's ``train_config`` keys only where that function sets them
    anew (look up the rest in ``knob_comments("train")`` without the prefix); a
    bench's ``models.NAME.FIELD`` / ``sweeps.NAME.FIELD`` as ``models.FIELD`` /
    ``sweeps.FIELD``.
  Raises:
    KeyError: an unknown kind.
  """
  wanted = _SECTIONED[kind]
  source = pathlib.Path(__file__).read_text()
  comments = {tok.start[0]: tok.string.lstrip("#").strip()
              for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT}
  out: dict[str, str] = {}
  for fn in ast.parse(source).body:
    if not (isinstance(fn, ast.FunctionDef) and fn.name == wanted):
      continue
    assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)]
    where = {"c": ""}  # local name -> its section's dotted path
    for n in assigns:  # c.model = m = ConfigDict() and c.train_config = t
      attrs = [t for t in n.targets if isinstance(t, ast.Attribute)
               and isinstance(t.value, ast.Name) and t.value.id == "c"]
      names = [t.id for t in n.targets if isinstance(t, ast.Name)]
      if isinstance(n.value, ast.Name):
        names.append(n.value.id)
      for a in attrs:
        for name in names:
          where[name] = a.attr
    for n in assigns:
      for t in n.targets:
        if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id in where and n.lineno in comments):
          out[".".join(p for p in (where[t.value.id], t.attr) if p)] = comments[n.lineno]
  if kind == "bench":
    out.update(BENCH_FIELD_COMMENTS)
  return out
