"""chinchax's compiled train step beside MaxText's, per device, on the same target: a table.

Both stacks build the same Llama-style model (RMSNorm, RoPE, SwiGLU, untied output head,
bf16 compute over float32 parameters, AdamW) for the same target, global batch, seq_len,
remat, scanned layers, attention family and microbatches, over the same libtpu
compile-only devices (``chinchax.aot.topology.compile_devices``: no TPU present), and both
programs are read the same way, by ``chinchax.aot.program.compile_lowered``: XLA's memory
analysis (temporaries), its cost analysis (FLOPs, bytes accessed; a scanned layer counted
once) and the optimized HLO's collectives (``chinchax.aot.hlo.collectives``: operand bytes
per step by kind).

Runs in its own environment (maxtext needs Python >= 3.12 and brings jax 0.12; chinchax is
installed into it with --no-deps): ``bash benchmarks/maxtext_compare.sh``. Never in CI.

usage: python benchmarks/maxtext_compare.py [--cases NAME,...] [--out DIR] [--timeout S]
                                           [--stack STACK] [--redo STACK]
       python benchmarks/maxtext_compare.py --one STACK CASE      (one compile, JSON on stdout)

Writes DIR/results.json (every compile, cumulative: a rerun compiles only the (stack, case)
pairs it lacks, or a stack named by --redo again, e.g. chinchax after a change; each chinchax
row records the commit it was compiled from) and DIR/table.md (chinchax ÷ MaxText per case).

Settings that are not matched (said again in table.md):
  * MaxText's batch carries positions and segment ids beside the tokens ([B, T] int32 each);
    chinchax's is one [B, T+1] int32 window.
  * Loss: MaxText casts the logits to float32 (``cast_logits_to_fp32``, its default);
    chinchax's loss is its own (``model.loss``); both are kept as each stack ships them.
  * RMSNorm epsilon (1e-5 MaxText, 1e-6 chinchax) and init: numerics only, not the program.
  * MaxText's remat ``full`` and chinchax's ``full`` both save only each layer's input.
  * GPU flash attention: MaxText's ``cudnn_flash_jax`` and chinchax's ``cudnn`` are both
    ``jax.nn.dot_product_attention(implementation="cudnn")``; a deviceless compile lowers it
    when ``nvidia-cudnn-cu12`` is installed (the .sh installs it), else JAX says "cuDNN not
    found". MaxText's default GPU flash (``cudnn_flash_te``) needs Transformer Engine.
  * Splash blocks: MaxText's default 512 (``sa_block_*``); chinchax's per seq_len
    (``chinchax.model.attention.splash_block``: 512 where seq_len allows).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

MODELS = {
    # d_model, n_layers, n_heads, n_kv_heads, d_ff, vocab (Llama-style; GPT-3 Small's width)
    "125m": dict(d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, d_ff=2048, vocab=32000),
    "1b": dict(d_model=2048, n_layers=16, n_heads=16, n_kv_heads=8, d_ff=7168, vocab=32000),
}

# name: model, target, mesh (data, fsdp), global batch, seq_len, attention family, microbatches
CASES = {
    "125m-v5e16-data16": ("125m", "v5e-16", (16, 1), 256, 1024, "xla", 1),
    "125m-v5e16-fsdp16": ("125m", "v5e-16", (1, 16), 256, 1024, "xla", 1),
    "1b-v5p32-fsdp16": ("1b", "v5p-32", (1, 16), 64, 2048, "xla", 1),
    "1b-v5p32-fsdp16-flash": ("1b", "v5p-32", (1, 16), 64, 2048, "flash", 1),
    "125m-v5e16-seq2048-flash": ("125m", "v5e-16", (1, 16), 128, 2048, "flash", 1),
    "125m-v5e8-data8": ("125m", "v5e-8", (8, 1), 128, 1024, "xla", 1),
    "125m-v5e16-data16-M4": ("125m", "v5e-16", (16, 1), 256, 1024, "xla", 4),
    "125m-v5e16-data16-M8": ("125m", "v5e-16", (16, 1), 256, 1024, "xla", 8),
    "125m-v5e16-fsdp16-M4": ("125m", "v5e-16", (1, 16), 256, 1024, "xla", 4),
    "125m-v5e16-fsdp16-M8": ("125m", "v5e-16", (1, 16), 256, 1024, "xla", 8),
    "125m-v5e16-fsdp16-M4-step": ("125m", "v5e-16", (1, 16), 256, 1024, "xla", 4),
    "125m-v5e16-fsdp16-M8-step": ("125m", "v5e-16", (1, 16), 256, 1024, "xla", 8),
    "125m-h100x8-data8": ("125m", "h100x8", (8, 1), 128, 1024, "xla", 1),
    "1b-h100x8-fsdp8": ("1b", "h100x8", (1, 8), 32, 2048, "xla", 1),
    "125m-h100x8-data8-cudnn": ("125m", "h100x8", (8, 1), 128, 1024, "flash", 1),
}
REMAT = "full"
# chinchax settings beside a case's defaults: on fsdp, train.grad_reduce=auto reduces per
# microbatch (the sharded accumulator fsdp is chosen for); "step" reduces once per step
CHINCHAX_TRAIN = {"125m-v5e16-fsdp16-M4-step": {"grad_reduce": "step"},
                  "125m-v5e16-fsdp16-M8-step": {"grad_reduce": "step"}}
MAXTEXT_TOPOLOGY = {"h100x8": "a3"}  # MaxText's name for one host of 8 H100s (GCP's A3)
STACKS = ("chinchax", "maxtext")


def chinchax_program(case: str):
  """chinchax's train step for ``case``: (ProgramResult, devices)."""
  from chinchax import config as config_lib
  from chinchax.aot import program as program_lib
  from chinchax.aot import topology
  name, spec, (data, fsdp), batch, seq_len, attention, micro = CASES[case]
  m = MODELS[name]
  target = topology.parse_target(spec)
  c = config_lib.get_variant("125m")
  c.model.update(vocab_size=m["vocab"], d_model=m["d_model"], n_layers=m["n_layers"],
                 n_heads=m["n_heads"], n_kv_heads=m["n_kv_heads"], d_ff=m["d_ff"],
                 tie_embeddings=False, remat=REMAT, scan_layers=True, compute_dtype="bfloat16",
                 attention={"xla": "xla", "flash": "splash" if target.platform == "tpu"
                            else "cudnn"}[attention])
  c.train.update(global_batch_size=batch, seq_len=seq_len, microbatches=micro,
                 **CHINCHAX_TRAIN.get(case, {}))
  c.mesh.update(data=data, fsdp=fsdp, tensor=1)
  run = program_lib.compile_run(c, target, eval_step=False)
  return run.train, target


def maxtext_program(case: str):
  """MaxText's train step for ``case``, as its train_compile.py builds it: (ProgramResult,
  target). The mesh is MaxText's own over the same compile-only devices."""
  import jax
  from flax.core.spmd import logical_axis_rules as axis_rules
  from jax.sharding import AxisType, Mesh
  from maxtext.configs import pyconfig
  from maxtext.trainers.pre_train import train
  from maxtext.trainers.pre_train import train_compile as tc
  from maxtext.utils import maxtext_utils
  from maxtext.utils import sharding
  from chinchax.aot import program as program_lib
  from chinchax.aot import topology
  name, spec, (data, fsdp), batch, seq_len, attention, micro = CASES[case]
  m = MODELS[name]
  target = topology.parse_target(spec)
  devices = topology.compile_devices(target)
  base = pathlib.Path(pyconfig.__file__).with_name("base.yml")
  attn = {"xla": "dot_product", "flash": "flash" if target.platform == "tpu"
          else "cudnn_flash_jax"}[attention]
  argv = ["", str(base), f"run_name=compare_{case}", "base_output_directory=/tmp/maxtext_compare",
          f"base_emb_dim={m['d_model']}", f"base_num_query_heads={m['n_heads']}",
          f"base_num_kv_heads={m['n_kv_heads']}", f"base_mlp_dim={m['d_ff']}",
          f"base_num_decoder_layers={m['n_layers']}", f"head_dim={m['d_model'] // m['n_heads']}",
          f"vocab_size={m['vocab']}", "decoder_block=llama2", "logits_via_embedding=False",
          f"per_device_batch_size={batch / len(devices)}", f"max_target_length={seq_len}",
          f"remat_policy={REMAT}", "scan_layers=True", f"attention={attn}",
          f"ici_data_parallelism={data}", f"ici_fsdp_parallelism={fsdp}",
          f"gradient_accumulation_steps={micro}", "dataset_type=synthetic",
          "enable_checkpointing=False", "enable_dropout=False", "dtype=bfloat16",
          "weight_dtype=float32", "opt_type=adamw",
          f"compile_topology={MAXTEXT_TOPOLOGY.get(spec, spec)}",
          "compile_topology_num_slices=1", "skip_jax_distributed_system=True",
          f"hardware={'tpu' if target.platform == 'tpu' else 'gpu'}"]
  config = pyconfig.initialize(argv)
  mesh = Mesh(maxtext_utils.create_device_mesh(config, devices), config.mesh_axes,
              axis_types=(AxisType.Auto,) * len(config.mesh_axes))
  args, kwargs, state_shardings, _, model = tc.get_shaped_inputs(mesh, config)
  params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
      config, state_shardings)
  in_state = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings,
                                                             params_shardings)
  data_sharding = sharding.get_input_data_sharding(config, mesh)
  fn, in_shard, out_shard, static, donate = maxtext_utils.get_functional_train_with_signature(
      train.train_step, data_sharding, in_state, model, config, params_shardings)

  def lower():
    with jax.set_mesh(mesh), axis_rules(config.logical_axis_rules):
      return jax.jit(fn, in_shardings=in_shard, out_shardings=out_shard, static_argnums=static,
                     donate_argnums=donate).lower(*args, **kwargs)

  return program_lib.compile_lowered("train_step", lower, len(devices)), target


def one(stack: str, case: str, hlo_dir: str | None = None) -> dict:
  """Compiles one stack's program for one case; the numbers the table reads. With
  ``hlo_dir``, the optimized HLO text goes to ``hlo_dir/STACK-CASE.hlo.gz`` (the text the
  collectives are counted on)."""
  import gzip
  import jax
  from chinchax.aot import hlo as hlo_lib
  if hlo_dir:
    count = hlo_lib.collectives

    def keep(text, *args, **kwargs):
      pathlib.Path(hlo_dir).mkdir(parents=True, exist_ok=True)
      with gzip.open(pathlib.Path(hlo_dir) / f"{stack}-{case}.hlo.gz", "wt") as f:
        f.write(text)
      return count(text, *args, **kwargs)

    hlo_lib.collectives = keep
  commit = _commit() if stack == "chinchax" else None  # before the compile reads the tree
  start = time.perf_counter()
  result, target = (chinchax_program if stack == "chinchax" else maxtext_program)(case)
  coll = result.collectives.to_dict() if result.collectives is not None else {}
  return {"stack": stack, "case": case, "target": target.spec, "fits": result.fits,
          "error": result.error, "oom": result.oom, "memory": result.memory,
          "flops": result.xla_flops, "bytes_accessed": result.xla_bytes,
          "collectives": {k: v for k, v in coll.items() if isinstance(v, dict) and "count" in v},
          "seconds": time.perf_counter() - start, "jax": jax.__version__,
          "commit": commit}


def _commit() -> str | None:
  """chinchax's git commit (``+dirty`` when the tree differs), or None outside a checkout."""
  root = pathlib.Path(__file__).resolve().parent.parent
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                          capture_output=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           text=True, capture_output=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None
  return head + ("+dirty" if dirty else "")


def _mb(n: float) -> str:
  """Bytes as MB: whole MB from 10 MB, else two significant digits."""
  return f"{n / 1e6:.0f}" if n >= 1e7 else f"{n / 1e6:.2g}"


def _pair(a, b, unit: float, digits: int) -> str:
  """" (a/b)" in ``unit``s, or nothing where XLA gave no figure (GPU cost analysis without a
  GPU)."""
  return f" ({a / unit:.{digits}f}/{b / unit:.{digits}f})" if a is not None and b else ""


def _ratio(a, b) -> str:
  return f"{a / b:.3f}" if a is not None and b else "–"


def table(rows: dict) -> str:
  """The markdown table: chinchax ÷ MaxText per case (temporaries, XLA bytes accessed,
  collective operand bytes and op counts by kind, FLOPs), each followed by the two stacks'
  absolute figures (chinchax/MaxText)."""
  out = ["| case | temporaries (GB) | XLA bytes accessed (GB) | collective bytes (MB) by kind "
         "| FLOPs (TFLOP) |",
         "|---|---|---|---|---|"]
  for case in CASES:
    c, x = rows.get(("chinchax", case)), rows.get(("maxtext", case))
    if not c or not x or not c.get("fits") or not x.get("fits"):
      why = "; ".join(f"{s}: {r.get('error') or ('out of HBM' if r.get('oom') else 'not run')}"
                      for s, r in (("chinchax", c or {}), ("maxtext", x or {}))
                      if not r or not r.get("fits"))
      out.append(f"| {case} | – | – | {why[:200]} | – |")
      continue
    ct, xt = c["memory"].get("temp"), x["memory"].get("temp")
    kinds = []
    for k in sorted(set(c["collectives"]) | set(x["collectives"])):
      cb = c["collectives"].get(k, {}).get("operand_bytes", 0.0)
      xb = x["collectives"].get(k, {}).get("operand_bytes", 0.0)
      if cb or xb:
        cn, xn = c["collectives"].get(k, {}).get("count", 0), x["collectives"].get(k, {}).get(
            "count", 0)
        kinds.append(f"{k} {_ratio(cb, xb)} ({_mb(cb)}/{_mb(xb)}; {cn}/{xn} ops)")
    cb, xb, cf, xf = c["bytes_accessed"], x["bytes_accessed"], c["flops"], x["flops"]
    out.append(f"| {case} | {_ratio(ct, xt)} ({ct / 1e9:.3f}/{xt / 1e9:.3f}) | "
               f"{_ratio(cb, xb)}{_pair(cb, xb, 1e9, 2)} | {', '.join(kinds) or '–'} | "
               f"{_ratio(cf, xf)}{_pair(cf, xf, 1e12, 3)} |")
  return "\n".join(out) + "\n"


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--one", nargs=2, metavar=("STACK", "CASE"))
  p.add_argument("--cases", default=",".join(CASES))
  p.add_argument("--out", default="benchmarks/figures/maxtext_compare")
  p.add_argument("--timeout", type=float, default=3600.0)
  p.add_argument("--stack", choices=STACKS, help="compile only this stack's programs")
  p.add_argument("--redo", choices=STACKS, help="compile this stack's cases again even when "
                 "results.json holds them")
  a = p.parse_args()
  if a.one:
    stack, case = a.one
    if stack not in STACKS or case not in CASES:
      print(f"error: --one takes a stack of {STACKS} and a case of {list(CASES)}", file=sys.stderr)
      return 2
    print(json.dumps(one(stack, case, os.environ.get("COMPARE_HLO_DIR")), default=float))
    return 0
  cases = [c for c in a.cases.split(",") if c]
  bad = [c for c in cases if c not in CASES]
  if bad:
    print(f"error: unknown case(s) {bad}; known: {', '.join(CASES)}", file=sys.stderr)
    return 2
  out = pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  path = out / "results.json"
  done = {(r["stack"], r["case"]): r for r in
          (json.loads(path.read_text()) if path.exists() else [])}
  for case in cases:
    for stack in STACKS:
      if (stack, case) in done and not done[(stack, case)].get("error") and stack != a.redo:
        continue
      if a.stack and stack != a.stack:
        continue
      r = subprocess.run([sys.executable, __file__, "--one", stack, case], capture_output=True,
                         text=True, timeout=a.timeout,
                         env=dict(os.environ, COMPARE_HLO_DIR=str(out / "hlo")))
      try:
        done[(stack, case)] = json.loads(r.stdout.strip().splitlines()[-1])
      except (IndexError, json.JSONDecodeError):
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        done[(stack, case)] = {"stack": stack, "case": case, "fits": False, "error": tail[:300]}
      print(f"{case} {stack}: {json.dumps(done[(stack, case)], default=float)[:300]}", flush=True)
      path.write_text(json.dumps(list(done.values()), indent=1, default=float))
      (out / "table.md").write_text(table(done))
  print(table(done))
  return 0


if __name__ == "__main__":
  sys.exit(main())
