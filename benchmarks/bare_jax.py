"""A minimal bare-JAX twin of chinchax's model and optimizer, timed against chinchax's train step.

The framework-overhead check of ``chinchax bench`` (issue 5, acceptance 3):
the same decoder-only transformer as ``chinchax.model.transformer`` — token embedding,
pre-norm RMSNorm, causal multi-head attention with RoPE, SwiGLU MLP, final
RMSNorm, output head tied to the embedding, no biases, float32 parameters with
matmuls in the compute dtype and float32 logits — and the same optimizer as
``chinchax.train.make_optimizer`` — global-norm clipping, then AdamW with
decoupled weight decay on matrices only, under a linear-warmup cosine
schedule — written with nothing but ``jax.numpy`` on a dict of arrays. No
Flax, no optax, no mesh.

Run (one CPU device, alternating chinchax / bare blocks in one process)::

  python benchmarks/bare_jax.py [--d_model 128 --n_layers 6 --global_batch_size 16 ...]
      [--rounds 12 --steps 2] [--out DIR]

It prints the per-step medians of both and their ratio (chinchax / bare;
issue 5 asks for ≤ 1.10) and writes ``bare_jax.json`` to ``--out``.
Tensor names carry their shapes as in ``chinchax.model.transformer``: B batch, T tokens,
D d_model, H heads, K head_dim, F d_ff, V vocab.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import statistics
import sys
import time

if __name__ == "__main__":  # one CPU device unless told otherwise, before JAX starts
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class BareConfig:
  """Model and optimizer hyper-parameters (same meaning as in ``chinchax.config``)."""

  vocab_size: int = 257
  d_model: int = 128
  n_layers: int = 6
  n_heads: int = 4
  d_ff: int = 384
  seq_len: int = 128
  global_batch_size: int = 16
  compute_dtype: str = "float32"
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6
  init_std: float = 0.02
  peak_lr: float = 3e-3
  warmup_steps: int = 100
  decay_steps: int = 1000
  min_lr_ratio: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1
  grad_clip: float = 1.0

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads


# ----------------------------------------------------------------------------
# Model.


def init_params(cfg: BareConfig, seed: int = 0) -> dict:
  """Normal(init_std) matrices (output projections scaled by 1/√(2·n_layers)), unit norm scales."""
  D, H, K, F, V, L = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size, cfg.n_layers
  keys = iter(jax.random.split(jax.random.key(seed), 1 + 7 * L))
  normal = lambda shape, std: std * jax.random.normal(next(keys), shape, jnp.float32)
  out_std = cfg.init_std / math.sqrt(2 * L)
  blocks = []
  for _ in range(L):
    blocks.append({
        "attn_norm": jnp.ones((D,), jnp.float32),
        "wq": normal((D, H, K), cfg.init_std), "wk": normal((D, H, K), cfg.init_std),
        "wv": normal((D, H, K), cfg.init_std), "wo": normal((H, K, D), out_std),
        "mlp_norm": jnp.ones((D,), jnp.float32),
        "w_gate": normal((D, F), cfg.init_std), "w_up": normal((D, F), cfg.init_std),
        "w_down": normal((F, D), out_std),
    })
  return {"embed": normal((V, D), cfg.init_std), "blocks": blocks,
          "final_norm": jnp.ones((D,), jnp.float32)}


def params_from_chinchax(pure: dict) -> dict:
  """Converts ``nnx.to_pure_dict`` of a chinchax Transformer's params (tied) into this layout."""
  blocks = []
  for i in range(len(pure["blocks"])):
    b = pure["blocks"][i]
    blocks.append({
        "attn_norm": b["attn_norm"]["scale"], "wq": b["attn"]["wq_DHK"],
        "wk": b["attn"]["wk_DHK"], "wv": b["attn"]["wv_DHK"], "wo": b["attn"]["wo_HKD"],
        "mlp_norm": b["mlp_norm"]["scale"], "w_gate": b["mlp"]["w_gate_DF"],
        "w_up": b["mlp"]["w_up_DF"], "w_down": b["mlp"]["w_down_FD"]})
  return {"embed": pure["embed_VD"], "blocks": blocks, "final_norm": pure["final_norm"]["scale"]}


def rms_norm(x_BTD, scale_D, eps):
  x32 = x_BTD.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (x32 * scale_D).astype(x_BTD.dtype)


def rope(x_BTHK, sin_TK2, cos_TK2):
  x1, x2 = jnp.split(x_BTHK.astype(jnp.float32), 2, axis=-1)
  s, c = sin_TK2[None, :, None, :], cos_TK2[None, :, None, :]
  return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x_BTHK.dtype)


def forward(params: dict, tokens_BT: jax.Array, cfg: BareConfig) -> jax.Array:
  """Float32 logits [B, T, V] of int32 tokens [B, T]."""
  dt = jnp.dtype(cfg.compute_dtype)
  T, K = tokens_BT.shape[1], cfg.head_dim
  inv_freq = 1.0 / cfg.rope_theta ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K)
  angles_TK2 = jnp.arange(T, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  sin_TK2, cos_TK2 = jnp.sin(angles_TK2), jnp.cos(angles_TK2)
  causal_TT = jnp.tril(jnp.ones((T, T), bool))
  x_BTD = params["embed"][tokens_BT].astype(dt)
  for p in params["blocks"]:
    h_BTD = rms_norm(x_BTD, p["attn_norm"], cfg.norm_eps)
    q_BTHK = rope(jnp.einsum("btd,dhk->bthk", h_BTD, p["wq"].astype(dt)), sin_TK2, cos_TK2)
    k_BTHK = rope(jnp.einsum("btd,dhk->bthk", h_BTD, p["wk"].astype(dt)), sin_TK2, cos_TK2)
    v_BTHK = jnp.einsum("btd,dhk->bthk", h_BTD, p["wv"].astype(dt))
    s_BHTT = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BTHK,
                        preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(K))
    s_BHTT = jnp.where(causal_TT, s_BHTT, jnp.finfo(jnp.float32).min)
    a_BHTT = jax.nn.softmax(s_BHTT, axis=-1).astype(dt)
    o_BTHK = jnp.einsum("bhts,bshk->bthk", a_BHTT, v_BTHK)
    x_BTD = x_BTD + jnp.einsum("bthk,hkd->btd", o_BTHK, p["wo"].astype(dt))
    h_BTD = rms_norm(x_BTD, p["mlp_norm"], cfg.norm_eps)
    g_BTF = jnp.einsum("btd,df->btf", h_BTD, p["w_gate"].astype(dt))
    u_BTF = jnp.einsum("btd,df->btf", h_BTD, p["w_up"].astype(dt))
    x_BTD = x_BTD + jnp.einsum("btf,fd->btd", jax.nn.silu(g_BTF) * u_BTF, p["w_down"].astype(dt))
  x_BTD = rms_norm(x_BTD, params["final_norm"], cfg.norm_eps)
  return jnp.einsum("btd,vd->btv", x_BTD, params["embed"].astype(dt),
                    preferred_element_type=jnp.float32)


def loss_fn(params: dict, batch_BT1: jax.Array, cfg: BareConfig) -> jax.Array:
  """Mean next-token cross-entropy in nats/token."""
  logits_BTV = forward(params, batch_BT1[:, :-1], cfg)
  targets_BT = batch_BT1[:, 1:]
  log_z_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
  return jnp.mean(log_z_BT - jnp.take_along_axis(logits_BTV, targets_BT[..., None], -1)[..., 0])


# ----------------------------------------------------------------------------
# Optimizer: clipping + AdamW + warmup-cosine schedule.


def learning_rate(step: jax.Array, cfg: BareConfig) -> jax.Array:
  """Linear warmup 0 → peak over warmup_steps, then cosine to min_lr_ratio·peak at decay_steps."""
  step = step.astype(jnp.float32)
  peak, w = cfg.peak_lr, cfg.warmup_steps
  warm = peak * step / w if w else jnp.float32(peak)
  frac = jnp.clip((step - w) / max(cfg.decay_steps - w, 1), 0.0, 1.0)
  alpha = cfg.min_lr_ratio
  cosine = peak * ((1 - alpha) * 0.5 * (1 + jnp.cos(jnp.pi * frac)) + alpha)
  return jnp.where(step < w, warm, cosine)


def init_state(params: dict) -> dict:
  zeros = jax.tree.map(jnp.zeros_like, params)
  return {"step": jnp.zeros((), jnp.int32), "params": params, "m": zeros,
          "v": jax.tree.map(jnp.zeros_like, params)}


def make_train_step(cfg: BareConfig):
  """(state, batch int32 [B, T+1]) → (state, {"loss", "grad_norm", "lr"})."""

  def train_step(state, batch_BT1):
    params = state["params"]
    loss, grads = jax.value_and_grad(loss_fn)(params, batch_BT1, cfg)
    leaves = jax.tree.leaves(grads)
    grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in leaves))
    if cfg.grad_clip > 0:
      factor = jnp.where(grad_norm < cfg.grad_clip, 1.0, cfg.grad_clip / grad_norm)
      grads = jax.tree.map(lambda g: g * factor, grads)
    count = state["step"] + 1
    lr = learning_rate(state["step"], cfg)
    m = jax.tree.map(lambda m, g: cfg.b1 * m + (1 - cfg.b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: cfg.b2 * v + (1 - cfg.b2) * g * g, state["v"], grads)
    c1 = 1 - cfg.b1 ** count.astype(jnp.float32)
    c2 = 1 - cfg.b2 ** count.astype(jnp.float32)

    def update(p, m, v, decay):
      u = (m / c1) / (jnp.sqrt(v / c2) + cfg.eps)
      if decay:
        u = u + cfg.weight_decay * p
      return p - lr * u

    new = {"embed": update(params["embed"], m["embed"], v["embed"], False),
           "final_norm": update(params["final_norm"], m["final_norm"], v["final_norm"], False),
           "blocks": [{k: update(b[k], mb[k], vb[k], b[k].ndim >= 2) for k in b}
                      for b, mb, vb in zip(params["blocks"], m["blocks"], v["blocks"])]}
    return ({"step": count, "params": new, "m": m, "v": v},
            {"loss": loss, "grad_norm": grad_norm, "lr": lr})

  return train_step


# ----------------------------------------------------------------------------
# The alternating timing against chinchax.


def chinchax_config(cfg: BareConfig):
  """The chinchax config of the same model and optimizer (one device, mesh 1×1×1).

  chinchax runs ``decay_steps + 1`` steps (its cosine ends on the last one) and
  caps warm-up at a tenth of the run.

  Raises:
    ValueError: ``warmup_steps`` above that cap (the schedules would differ).
  """
  from chinchax import config as config_lib
  if cfg.warmup_steps > (cfg.decay_steps + 1) // 10:
    raise ValueError(f"warmup_steps={cfg.warmup_steps} exceeds chinchax's cap of a tenth of "
                     f"the {cfg.decay_steps + 1} steps; raise decay_steps")
  c = config_lib.base_config()
  c.model.update(vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                 n_heads=cfg.n_heads, d_ff=cfg.d_ff, compute_dtype=cfg.compute_dtype,
                 attention="xla", remat="none", rope_theta=cfg.rope_theta, norm_eps=cfg.norm_eps,
                 init_std=cfg.init_std)
  c.train.update(global_batch_size=cfg.global_batch_size, seq_len=cfg.seq_len,
                 peak_lr=cfg.peak_lr, warmup_steps=cfg.warmup_steps, min_lr_ratio=cfg.min_lr_ratio,
                 b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                 grad_clip=cfg.grad_clip)
  c.budget.update(mode="steps", steps=cfg.decay_steps + 1)
  c.mesh.update(data=1, fsdp=1, tensor=1, num_cpu_devices=0)
  c.compile_cache_dir = ""
  return c


def _time_block(step, state, batches, device_put) -> tuple:
  times = []
  for b in batches:
    t0 = time.perf_counter()
    state, metrics = step(state, device_put(b))
    jax.block_until_ready((state["step"], metrics))
    times.append(time.perf_counter() - t0)
  return state, times


def compare(cfg: BareConfig, rounds: int = 12, steps: int = 2, warmup: int = 2,
            seed: int = 0) -> dict:
  """Times chinchax's train step and the bare one in alternating blocks on one device.

  Each round runs ``steps`` synchronised steps of one implementation, then
  ``steps`` of the other (the order swaps every round), on the same host
  batches, each batch copied host → device inside the timed step as
  ``chinchax train`` does. On a shared, loaded host the per-round ratio is
  the steadier figure: both halves of a round see nearly the same load.

  Returns:
    {"chinchax": {...}, "bare": {...}, "ratio": chinchax median / bare median,
    "round_ratios": per-round ratios, ...}; seconds per step.
  """
  from flax import nnx
  from chinchax.model import sharding as sharding_lib
  from chinchax import train as train_lib
  device = jax.devices()[0]
  c = chinchax_config(cfg)
  spec = train_lib.resolve(c, 1)
  mesh = sharding_lib.make_mesh(spec.mesh, [device])
  program = train_lib.build_program(c, spec, mesh)
  cx_state, cx_step, cx_put = program.init_state(), program.step, program.global_batch

  pure = nnx.to_pure_dict(jax.device_get(cx_state["params"]))
  bare_state = jax.device_put(init_state(params_from_chinchax(pure)), device)
  bare_step = jax.jit(make_train_step(cfg), donate_argnums=0)
  bare_put = lambda b: jax.device_put(b, device)

  rng = np.random.default_rng(seed)
  batches = [rng.integers(0, cfg.vocab_size, (cfg.global_batch_size, cfg.seq_len + 1),
                          dtype=np.int32) for _ in range(steps)]
  programs = {}
  for name, step, state, put in (("chinchax", cx_step, cx_state, cx_put),
                                 ("bare", bare_step, bare_state, bare_put)):
    compiled = step.lower(state, put(batches[0])).compile()  # the calls below reuse it
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    entry = compiled.as_text().split("\nENTRY", 1)[-1]
    programs[name] = {"xla_flops": float(cost["flops"]),
                      "xla_bytes_accessed": float(cost["bytes accessed"]),
                      "fusions": entry.count(" fusion("), "dots": entry.count(" dot(")}
  t0 = time.perf_counter()
  cx_state, _ = _time_block(cx_step, cx_state, batches[:1], cx_put)
  cx_compile = time.perf_counter() - t0
  t0 = time.perf_counter()
  bare_state, _ = _time_block(bare_step, bare_state, batches[:1], bare_put)
  bare_compile = time.perf_counter() - t0
  cx_state, _ = _time_block(cx_step, cx_state, batches[:warmup], cx_put)
  bare_state, _ = _time_block(bare_step, bare_state, batches[:warmup], bare_put)
  cx_times, bare_times, round_ratios = [], [], []
  for r in range(rounds):
    if r % 2 == 0:
      cx_state, tc = _time_block(cx_step, cx_state, batches, cx_put)
      bare_state, tb = _time_block(bare_step, bare_state, batches, bare_put)
    else:
      bare_state, tb = _time_block(bare_step, bare_state, batches, bare_put)
      cx_state, tc = _time_block(cx_step, cx_state, batches, cx_put)
    cx_times += tc
    bare_times += tb
    round_ratios.append(statistics.median(tc) / statistics.median(tb))

  def stats(ts, compile_s):
    return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
            "p10_s": float(np.percentile(ts, 10)), "p90_s": float(np.percentile(ts, 90)),
            "n": len(ts), "first_step_s": compile_s}

  out = {"config": dataclasses.asdict(cfg), "params_total": spec.counts.total,
         "device": str(device), "rounds": rounds, "steps_per_round": steps,
         "chinchax": {**stats(cx_times, cx_compile), **programs["chinchax"]},
         "bare": {**stats(bare_times, bare_compile), **programs["bare"]}}
  out["ratio"] = out["chinchax"]["median_s"] / out["bare"]["median_s"]
  out["round_ratios"] = round_ratios
  out["median_round_ratio"] = statistics.median(round_ratios)
  return out


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  defaults = BareConfig()
  for f in dataclasses.fields(BareConfig):
    p.add_argument(f"--{f.name}", type=type(getattr(defaults, f.name)),
                   default=getattr(defaults, f.name))
  p.add_argument("--rounds", type=int, default=12, help="alternating rounds")
  p.add_argument("--steps", type=int, default=2, help="timed steps per implementation per round")
  p.add_argument("--out", default="", help="directory for bare_jax.json")
  args = p.parse_args(argv)
  cfg = BareConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BareConfig)})
  res = compare(cfg, rounds=args.rounds, steps=args.steps)
  cx, bare = res["chinchax"], res["bare"]
  print(f"model   d_model={cfg.d_model} n_layers={cfg.n_layers} n_heads={cfg.n_heads} "
        f"d_ff={cfg.d_ff} vocab={cfg.vocab_size} params={res['params_total']:,} "
        f"batch={cfg.global_batch_size}x{cfg.seq_len} {cfg.compute_dtype} on {res['device']}")
  for name, s in (("chinchax", cx), ("bare JAX", bare)):
    print(f"{name:9s} median {1e3 * s['median_s']:8.1f} ms/step  p10-p90 "
          f"{1e3 * s['p10_s']:.1f}-{1e3 * s['p90_s']:.1f} ms  (n={s['n']}); XLA "
          f"{s['xla_flops']:.4g} FLOPs, {s['xla_bytes_accessed']:.4g} bytes, {s['fusions']} "
          f"fusions, {s['dots']} dots")
  print(f"ratio   chinchax / bare = {res['ratio']:.3f} (median of per-round ratios "
        f"{res['median_round_ratio']:.3f}; target <= 1.10)")
  if args.out:
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bare_jax.json").write_text(json.dumps(res, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
