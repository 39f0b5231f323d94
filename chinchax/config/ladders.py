"""The data-constrained ladder variants ``repeat`` and ``repeat_tiny`` (a unique-data axis).

Kept beside :mod:`chinchax.config.defaults`, which returns them from
``get_ladder_variant``; see ``configs/ladder.py`` and docs/repeat.md.
"""

from __future__ import annotations

REPEAT_VARIANTS = ("repeat", "repeat_tiny")


def repeat_variant(c, name: str):
  """``c`` (the default ladder for ``repeat``, the ``tiny`` one for ``repeat_tiny``) made a
  data-constrained ladder: every (C, N) of its grid at each unique-data size of
  ``ladder.unique_tokens`` (0 = the whole split: the base grid), repetition allowed, and a
  validation run at a unique size and epoch count the grid never trains.

  ``repeat`` on the stdlib corpus (bytes, seq_len 64): 4 budgets 1e10 … 2.56e11 FLOPs × 5 sizes
  (N_opt/2.5 … N_opt·2.5, D 0.08 … 4.1 M tokens) at U = whole split (≤ 0.14 epochs), 400,000
  and 100,000 tokens (whole documents drawn in a seeded random order, ``data.unique_order``:
  about 0.2 … 10 and 0.9 … 45 epochs); validation at U = 200,000, C = 2 × 2.56e11 (≈ 11
  epochs). Smaller sets (40,000 tokens: 6 documents) sit 0.19 nats/token above fresh data at
  two epochs, a sampling gap that no repetition law describes.
  """
  if name == "repeat":
    c.workdir = "runs/ladder-repeat"
    c.ladder.update(c_min=1e10, c_max=2.56e11, n_budgets=4, sizes_per_budget=5, spread=2.5,
                    unique_tokens="0,400000,100000", validate_unique_tokens=200000,
                    validate_factor=2.0)
    # A uniform sample of whole documents: the store's first ones are the alphabetically first
    # stdlib modules, unlike the validation split (docs/data-constrained.md).
    c.train_config.data.update(allow_repeat=True, max_epochs=200.0, unique_order="shuffled")
    return c
  c.workdir = "runs/ladder-repeat-tiny"
  c.ladder.update(unique_tokens="0,5000", validate_unique_tokens=8000, validate_factor=1.5)
  c.train_config.data.update(allow_repeat=True, max_epochs=500.0)
  return c


POD_VARIANTS = ("pod", "pod_cpu")


def pod_variant(c, name: str):
  """``c`` (the default ladder) made the accelerator ladder ``pod``, or its CPU scale-down
  ``pod_cpu`` (the same code paths at widths and budgets two CPU cores train in minutes).

  ``pod``: ``ladder.hardware`` (default v5e-8; v5p-32, h100x8, any spec of the accelerator
  table) lays out and prices every run (chinchax.ladder.pod); ``ladder.c_max = 0`` sizes 5
  budgets over ``ladder.decades`` = 1.5 decades so the grid (5 sizes each) and the validation
  run are predicted to take ``ladder.budget_hours`` = 24 hours of the target (on v5e-8: about
  1e17 … 3e18 FLOPs, models ~20M … 1B parameters). seq_len 2048; a 32,768-token BPE trained
  by ``chinchax prepare`` on the corpus (``data.tokenizer=hf`` with ``data.tokenizer_path``
  takes a local HF tokenizer.json instead); fineweb-edu's 10B-token sample streamed from HF
  datasets (or any ``data.hf_name``, local directory, or a gs:// ``data.store_root``).
  Hyperparameters: DeepSeek LLM's batch and LR laws (Bi et al. 2024, arXiv 2401.02954,
  Sec. 3.1, eq. 1), fitted on 1e17 … 2e19 FLOPs, the range of this ladder. Shapes: the
  planner's accelerator rule (widths in multiples of 128, aspect ratio ≈ 64). Evals and
  checkpoints every 30 minutes of wall clock (``train.eval_every_s``,
  ``train.checkpoint_every_s``) besides Approach 1's 16 curve evals; one worker per host,
  each run on all its devices; TensorBoard under each run, W&B (``train.wandb=True``) groups
  the runs by the ladder's workdir name.

  ``pod_cpu``: the same with ``ladder.hardware=cpu``: 3 budgets 1e9 … 3.2e10 FLOPs × 3
  sizes of the 2-layer ``ladder`` shape rule, seq_len 64, a 512-token BPE, an HF-datasets
  directory of local files (``data.hf_name``, which the test writes), at most 4 sequences
  per microbatch (M up to 7), a loss in chunks of 16 positions, evals every 3 s and
  checkpoints every 10 s of wall clock, validation at 2 × c_max.
  """
  c.workdir = "runs/ladder-pod" if name == "pod" else "runs/ladder-pod-cpu"
  c.ladder.update(hardware="v5e-8", budget_hours=24.0, c_min=0.0, c_max=0.0, decades=1.5,
                  n_budgets=5, sizes_per_budget=5, spread=3.0, shape_rule="accelerator",
                  hparams="deepseek", min_steps=100, workers=1, bootstrap=200)
  t = c.train_config
  t.mesh.num_cpu_devices = 0  # every device of the host
  t.model.update(init="fixed", init_std=0.02, scan_layers=True)  # GPT-2's std at these widths
  t.data.update(source="hf", hf_name="HuggingFaceFW/fineweb-edu", hf_config="sample-10BT",
                hf_streaming=True, tokenizer="bpe", bpe_vocab_size=32768)
  t.train.update(seq_len=2048, warmup_steps=200, log_every=50, eval_every=10**9,
                 checkpoint_every=10**9, eval_every_s=1800.0, checkpoint_every_s=1800.0,
                 eval_points=16, eval_points_from=0.1, eval_windows=512, curve_eval_windows=64,
                 keep_checkpoints=1)
  if name == "pod":
    return c
  c.ladder.update(hardware="cpu", budget_hours=0.0, c_min=1e9, c_max=3.2e10, n_budgets=3,
                  sizes_per_budget=3, shape_rule="ladder", min_steps=10, microbatch_rows=4,
                  validate_factor=2.0, bootstrap=20, progress=False, heartbeat_s=1.0,
                  lease_expiry_s=20.0, poll_s=0.5)
  t.model.update(init="small", scan_layers=False)
  t.data.update(hf_name="", hf_config="", hf_streaming=False, bpe_vocab_size=512)
  t.mesh.num_cpu_devices = 1
  t.train.update(seq_len=64, warmup_steps=5, log_every=5, eval_every_s=3.0,
                 checkpoint_every_s=10.0, eval_points=4, eval_windows=128, curve_eval_windows=32,
                 loss_chunk_size="16")
  return c
