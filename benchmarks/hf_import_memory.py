"""Peak host memory of ``train.init_from=hf:DIR``: a ~1B-parameter synthetic Llama, 8 CPU devices.

Writes a synthetic ``LlamaForCausalLM`` checkpoint with the ``safetensors`` library
(sharded ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``, float32
by default, so the placed float32 params are as large as the files) to a temporary
directory, then, in a fresh process, checks it (:func:`chinchax.export.hf_source.open_source`),
builds the run's program on a (data=1, fsdp=8) mesh of 8 CPU devices (parameters split, not
replicated: one copy in all) and streams the tensors onto it
(:func:`chinchax.export.hf_load.load_params`). It reports, against the checkpoint's size
on disk:

* RSS before the import (JAX, the program; no parameters) and the peak during it
  (``VmHWM`` of /proc/self/status: anonymous and file-backed pages together), and the
  peak of the anonymous part alone (``RssAnon``, sampled every 10 ms): on CPU devices the
  placed parameters are themselves host memory, so the import's peak can be no lower
  than 1× the float32 params; streaming keeps it near that, where reading the whole
  checkpoint first would need 2×;
* the wall time of the check and of the load.

Usage: python benchmarks/hf_import_memory.py [--params 1e9] [--dtype float32|bfloat16]
         [--shard-gb 2] [--dir DIR (keep the checkpoint there)]
Needs: safetensors, ml_dtypes (the ``export`` extra). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np


def shape_for(params: float) -> dict:
  """A Llama-like shape (GQA, untied) of about ``params`` parameters: d_model 2048, 16 heads,
  8 key/value heads, d_ff 5632, vocab 32000, layers to fill the rest."""
  D, H, G, F, V = 2048, 16, 8, 5632, 32000
  K = D // H
  per_layer = 2 * D * H * K + 2 * D * G * K + 3 * D * F + 2 * D
  L = max(1, round((params - 2 * V * D - D) / per_layer))
  return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D,
          "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": G,
          "intermediate_size": F, "vocab_size": V, "tie_word_embeddings": False,
          "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
          "rope_scaling": None, "attention_bias": False, "mlp_bias": False}


def _tensor_shapes(cfg: dict) -> dict:
  D, H, G = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
  F, V, K = cfg["intermediate_size"], cfg["vocab_size"], D // H
  out = {"model.embed_tokens.weight": (V, D)}
  for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}."
    out.update({p + "input_layernorm.weight": (D,), p + "self_attn.q_proj.weight": (H * K, D),
                p + "self_attn.k_proj.weight": (G * K, D),
                p + "self_attn.v_proj.weight": (G * K, D),
                p + "self_attn.o_proj.weight": (D, H * K),
                p + "post_attention_layernorm.weight": (D,),
                p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                p + "mlp.down_proj.weight": (D, F)})
  out.update({"model.norm.weight": (D,), "lm_head.weight": (V, D)})
  return out


def write_checkpoint(directory: pathlib.Path, params: float, dtype: str, shard_gb: float) -> None:
  """Writes the synthetic checkpoint, one shard's tensors in memory at a time."""
  import ml_dtypes
  import safetensors.numpy as st

  cfg = shape_for(params)
  (directory / "config.json").write_text(json.dumps(cfg))
  np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
  item = np.dtype(np_dtype).itemsize
  shapes = _tensor_shapes(cfg)
  groups, cur, size = [], [], 0
  for name, shape in shapes.items():
    n = int(np.prod(shape)) * item
    if cur and size + n > shard_gb * 2**30:
      groups.append(cur)
      cur, size = [], 0
    cur.append(name)
    size += n
  groups.append(cur)
  rng = np.random.default_rng(0)
  weight_map = {}
  for k, names in enumerate(groups):
    f = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
    tensors = {n: (rng.standard_normal(shapes[n], dtype=np.float32) * 0.02).astype(np_dtype)
               for n in names}
    st.save_file(tensors, str(directory / f), metadata={"format": "pt"})
    weight_map.update({n: f for n in names})
    del tensors
  (directory / "model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {"total_size": sum(int(np.prod(s)) * item for s in shapes.values())},
       "weight_map": weight_map}))


def _status_kb(field: str) -> int:
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith(field + ":"):
      return int(line.split()[1])
  return 0


def measure(directory: pathlib.Path, devices: int) -> dict:
  """Imports ``directory`` onto ``devices`` CPU devices in this (fresh) process; the figures."""
  from chinchax.runtime import jax_settings as runtime
  runtime.setup_cpu_devices(devices)
  import jax

  from chinchax import config as config_lib
  from chinchax.model import sharding as sharding_lib
  from chinchax.export import hf_load, hf_source
  from chinchax.train import spec as spec_lib
  from chinchax.train import step as step_lib

  c = config_lib.get_variant("default")
  c.train.init_from = f"hf:{directory}"
  c.mesh.update(data=1, fsdp=devices)
  c.mesh.num_cpu_devices = 0
  c.train.update(global_batch_size=devices, seq_len=128)
  t0 = time.perf_counter()
  src = hf_source.open_source(c)
  t_check = time.perf_counter() - t0
  spec = spec_lib.resolve(c, devices)
  program = step_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh, jax.devices()))
  rss_before = _status_kb("VmRSS")
  file_before = _status_kb("RssFile")
  peak_anon = [_status_kb("RssAnon")]
  peak_file = [_status_kb("RssFile")]
  done = threading.Event()

  def sample():
    while not done.is_set():
      peak_anon[0] = max(peak_anon[0], _status_kb("RssAnon"))
      peak_file[0] = max(peak_file[0], _status_kb("RssFile"))
      time.sleep(0.01)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  t0 = time.perf_counter()
  params = hf_load.load_params(src, program.abstract_state["params"],
                               program.shardings["params"], spec.model.n_layers)
  jax.block_until_ready(params)
  t_load = time.perf_counter() - t0
  done.set()
  sampler.join()
  n = sum(x.size for x in jax.tree.leaves(params))
  per_device = max(sum(s.data.nbytes for x in jax.tree.leaves(params)
                       for s in x.addressable_shards if s.device == d) for d in jax.devices())
  return {"n_params": int(n), "param_bytes_f32": int(n) * 4, "devices": devices,
          "largest_device_bytes": int(per_device), "rss_before_kb": rss_before,
          "peak_rss_kb": _status_kb("VmHWM"), "peak_anon_kb": peak_anon[0],
          "peak_file_kb": peak_file[0],
          "file_before_kb": file_before,
          "rss_after_kb": _status_kb("VmRSS"), "check_s": t_check, "load_s": t_load}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--params", type=float, default=1e9)
  ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  ap.add_argument("--shard-gb", type=float, default=2.0)
  ap.add_argument("--devices", type=int, default=8)
  ap.add_argument("--dir", default="", help="write (and keep) the checkpoint here")
  ap.add_argument("--measure", default="", help=argparse.SUPPRESS)  # the child's directory
  a = ap.parse_args(argv)
  if a.measure:
    print(json.dumps(measure(pathlib.Path(a.measure), a.devices)))
    return 0
  directory = pathlib.Path(a.dir) if a.dir else pathlib.Path(tempfile.mkdtemp(prefix="hf1b-"))
  directory.mkdir(parents=True, exist_ok=True)
  try:
    t0 = time.perf_counter()
    write_checkpoint(directory, a.params, a.dtype, a.shard_gb)
    files = sorted(directory.glob("*.safetensors"))
    disk = sum(f.stat().st_size for f in files)
    print(f"wrote {len(files)} {a.dtype} shards, {disk / 2**30:.2f} GiB, in "
          f"{time.perf_counter() - t0:.0f} s to {directory}", flush=True)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, __file__, "--measure", str(directory),
                          "--devices", str(a.devices)], env=env, check=True,
                         capture_output=True, text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    gib = lambda kb: kb / 2**20  # noqa: E731
    print(json.dumps(dict(r, disk_bytes=disk, dtype=a.dtype)))
    print(f"{r['n_params'] / 1e9:.3f}B params ({a.dtype} on disk: {disk / 2**30:.2f} GiB; float32 "
          f"placed: {r['param_bytes_f32'] / 2**30:.2f} GiB over {r['devices']} CPU devices)")
    print(f"RSS before import {gib(r['rss_before_kb']):.2f} GiB; peak {gib(r['peak_rss_kb']):.2f} "
          f"GiB (anonymous {gib(r['peak_anon_kb']):.2f} GiB); after "
          f"{gib(r['rss_after_kb']):.2f} GiB")
    print(f"peak - before = {gib(r['peak_rss_kb'] - r['rss_before_kb']):.2f} GiB = "
          f"{(r['peak_rss_kb'] - r['rss_before_kb']) * 1024 / disk:.2f}× the checkpoint on disk, "
          f"{(r['peak_rss_kb'] - r['rss_before_kb']) * 1024 / r['param_bytes_f32']:.2f}× the "
          f"float32 params; check {r['check_s']:.1f} s, load {r['load_s']:.1f} s")
  finally:
    if not a.dir:
      shutil.rmtree(directory, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
