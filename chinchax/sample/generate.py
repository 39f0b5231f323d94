"""Autoregressive generation: a jitted prefill, then a jitted ``lax.while_loop`` of decode steps.

With the cache (:mod:`chinchax.sample.cache`) the prompt's P tokens run once (prefill) and
each new token is one position through the model over a cache of S positions. Without it
(``use_cache=False``, the reference and the baseline of the tokens/s figure) every step
recomputes the full forward pass, ``model(tokens)``, over a window of P + N positions (N the
new tokens; positions not generated yet hold 0 and, being later, change nothing before them).
Both choose token i with the key ``fold_in(PRNGKey(seed), i)``, so with the same seed they
draw the same tokens wherever their logits agree.

The loop stops when every sequence has produced EOS (``stop_at_eos``) or after N tokens.

**A handful of programs per process.** The prompt is padded to a bucket, the smallest of
:data:`MIN_BUCKET` · 2^k that holds it (at most S), and the prefill reads the logits of the
last real position; the decode loop takes P and N as values, not shapes, and writes into an
[B, S] buffer. So with the cache one process compiles one prefill per bucket (16, 32, 64, …:
log2(S/16) + 1 of them) and one decode loop per (B, S, sampling rule), whatever the prompt
lengths; ``benchmarks/sample_programs.py`` counts them over many calls. The compiled programs
are kept in a least-recently-used table of :data:`MAX_PROGRAMS` entries (the uncached
reference path still compiles per prompt length and N).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from chinchax.model import transformer as model_lib
from chinchax.sample import cache as cache_lib
from chinchax.sample import strategies
from chinchax.sample.error import SampleError


@dataclasses.dataclass
class Generation:
  """What :func:`generate` made.

  Attributes:
    tokens: per sequence, the new token ids (int32 [n_b]), up to and including EOS when
      generation stopped there.
    stopped_at_eos: per sequence, whether it ended with EOS.
    compile_s: seconds compiling prefill and decode (both XLA programs).
    compiled: programs compiled by this call (0 when both were compiled before).
    prefill_s: seconds running the prompt (with the cache; 0 without).
    decode_s: seconds of the decode loop.
  """
  tokens: list[np.ndarray]
  stopped_at_eos: list[bool]
  compile_s: float
  prefill_s: float
  decode_s: float
  compiled: int = 0

  @property
  def new_tokens(self) -> int:
    """New tokens over all sequences."""
    return int(sum(len(t) for t in self.tokens))

  @property
  def tokens_per_s(self) -> float:
    """New tokens per second of prefill plus decode (compile excluded)."""
    return self.new_tokens / max(self.prefill_s + self.decode_s, 1e-12)


MIN_BUCKET = 16   # the shortest padded prompt; buckets double from here up to S
MAX_PROGRAMS = 32  # compiled programs kept per process (least recently used dropped first)


def bucket(P: int, S: int) -> int:
  """The padded prompt length for a prompt of P tokens over a cache of S positions: the smallest
  MIN_BUCKET · 2^k ≥ P, at most S (P ≤ S)."""
  Q = MIN_BUCKET
  while Q < P:
    Q *= 2
  return min(Q, S)


def _prefill(graphdef, state, prompt_BQ, n_prompt, positions: int):
  """The prompt (padded to Q ≥ n_prompt tokens) into a new cache; logits after its last real
  token [B, V]."""
  model = nnx.merge(graphdef, state)
  kv = cache_lib.init_cache(model, prompt_BQ.shape[0], positions)
  logits_BQV, kv = cache_lib.forward(model, prompt_BQ, kv, 0, n_valid=n_prompt)
  return jax.lax.dynamic_index_in_dim(logits_BQV, n_prompt - 1, axis=1, keepdims=False), kv


def _loop(first_logits_BV, key, max_new, n_buf: int, rule, eos_id: int, stop: bool,
          next_logits, params, carry_state):
  """The decode loop shared by both paths: ``next_logits(model, carry_state, tok_B, i)`` →
  (logits_BV of the token after ``tok_B``, new carry_state). The parameters ride in the loop's
  carry, so the model is made inside the loop's trace (as ``nnx.scan`` asks). ``max_new`` (N,
  a value, traced or not) tokens at most go into an int32 [B, n_buf] buffer (n_buf ≥ N)."""
  B = first_logits_BV.shape[0]
  pad = max(eos_id, 0)

  def cond(c):
    i, _, _, _, _, done_B = c
    return (i < max_new) & ~jnp.all(done_B)

  def body(c):
    i, logits_BV, params, state, out_BN, done_B = c
    tok_B = strategies.choose(jax.random.fold_in(key, i), logits_BV, rule)
    tok_B = jnp.where(done_B, pad, tok_B)
    out_BN = out_BN.at[:, i].set(tok_B)
    if stop:
      done_B = done_B | (tok_B == eos_id)
    logits_BV, state = next_logits(params, state, tok_B, i)
    return i + 1, logits_BV, params, state, out_BN, done_B

  init = (jnp.int32(0), first_logits_BV, params, carry_state, jnp.full((B, n_buf), pad, jnp.int32),
          jnp.zeros((B,), bool))
  return jax.lax.while_loop(cond, body, init)[4]


def _decode_cached(graphdef, state, logits_BV, kv, key, P, max_new, *, rule, eos_id, stop):
  """The decode loop over the cache: P (prompt tokens) and max_new are values, so one program
  serves every prompt length; the buffer has the cache's S columns."""
  def next_logits(params, kv, tok_B, i):
    logits_B1V, kv = cache_lib.forward(nnx.merge(graphdef, params), tok_B[:, None], kv, P + i)
    return logits_B1V[:, 0], kv

  n_buf = kv.k_LBSGK.shape[2]
  return _loop(logits_BV, key, max_new, n_buf, rule, eos_id, stop, next_logits, state, kv)


def _decode_uncached(graphdef, state, prompt_BP, key, *, max_new, rule, eos_id, stop):
  B, P = prompt_BP.shape
  window_BL = jnp.zeros((B, P + max_new), jnp.int32).at[:, :P].set(prompt_BP)

  def next_logits(params, window_BL, tok_B, i):
    window_BL = jax.lax.dynamic_update_slice(window_BL, tok_B[:, None], (0, P + i))
    logits_BLV = nnx.merge(graphdef, params)(window_BL)  # the whole forward pass again
    return jax.lax.dynamic_index_in_dim(logits_BLV, P + i, axis=1, keepdims=False), window_BL

  first_BV = nnx.merge(graphdef, state)(window_BL)[:, P - 1]
  return _loop(first_BV, key, max_new, max_new, rule, eos_id, stop, next_logits, state,
               window_BL)


# (fn, static arguments, graphdef, argument shapes) → compiled program, least recently used first.
_COMPILED: collections.OrderedDict = collections.OrderedDict()


def _compiled(fn, graphdef, *args, **static):
  """``fn(graphdef, *args, **static)`` jitted and compiled for ``args``' shapes (kept for
  later calls alike, :data:`MAX_PROGRAMS` at most); (compiled, seconds spent compiling now)."""
  shapes = jax.tree.map(lambda a: (jnp.shape(a), str(jnp.result_type(a))), args)
  key = (fn, tuple(sorted(static.items())), graphdef, jax.tree.structure(args), str(shapes))
  if key in _COMPILED:
    _COMPILED.move_to_end(key)
    return _COMPILED[key], 0.0
  while len(_COMPILED) >= MAX_PROGRAMS:
    _COMPILED.popitem(last=False)
  t0 = time.perf_counter()
  jitted = jax.jit(functools.partial(fn, **static), static_argnums=0)
  _COMPILED[key] = jitted.lower(graphdef, *args).compile()
  return _COMPILED[key], time.perf_counter() - t0


def generate(model: model_lib.Transformer, prompt_BP, *, max_new_tokens: int,
             rule: strategies.Sampling, seed: int = 0, eos_id: int = -1,
             stop_at_eos: bool = True, use_cache: bool = True,
             positions: int | None = None) -> Generation:
  """Continues each of B prompts of P tokens by up to ``max_new_tokens`` (N) tokens.

  Args:
    model: the transformer with its parameters.
    prompt_BP: int [B, P] prompt token ids, P ≥ 1.
    max_new_tokens: N ≥ 1.
    rule: how each token is chosen (:class:`chinchax.sample.strategies.Sampling`).
    seed: the PRNG seed of the draws (unused when greedy).
    eos_id: the tokenizer's EOS id (-1: none).
    stop_at_eos: a sequence ends at its first EOS; the loop ends when all have.
    use_cache: decode over the KV cache (else recompute the full forward pass each token).
    positions: S, the cache's positions (default P + N; the CLI passes the run's seq_len).
  Returns:
    a :class:`Generation`.
  Raises:
    SampleError: P < 1, N < 1, or P + N > S.
  """
  prompt_BP = np.asarray(prompt_BP, np.int32)  # numpy: a device conversion would compile per shape
  B, P = prompt_BP.shape
  S = positions or P + max_new_tokens
  if P < 1 or max_new_tokens < 1 or P + max_new_tokens > S:
    raise SampleError(
        f"a prompt of {P} tokens and max_new_tokens={max_new_tokens} need P ≥ 1, N ≥ 1 and "
        f"P + N ≤ {S} positions")
  graphdef, state = nnx.split(model)
  key = np.asarray(jax.random.PRNGKey(seed))
  loop = dict(rule=rule, eos_id=eos_id, stop=stop_at_eos)
  prefill_s = 0.0
  if use_cache:
    Q = bucket(P, S)
    prompt_BQ = np.zeros((B, Q), np.int32)
    prompt_BQ[:, :P] = np.asarray(prompt_BP)
    n_prompt = np.int32(P)
    prefill, c1 = _compiled(_prefill, graphdef, state, prompt_BQ, n_prompt, positions=S)
    t0 = time.perf_counter()
    logits_BV, kv = jax.block_until_ready(prefill(state, prompt_BQ, n_prompt))
    prefill_s = time.perf_counter() - t0
    args = (state, logits_BV, kv, key, n_prompt, np.int32(max_new_tokens))
    decode, c2 = _compiled(_decode_cached, graphdef, *args, **loop)
  else:
    c1 = 0.0
    args = (state, prompt_BP, key)
    decode, c2 = _compiled(_decode_uncached, graphdef, *args, max_new=max_new_tokens, **loop)
  t0 = time.perf_counter()
  out_BN = np.asarray(jax.block_until_ready(decode(*args)))[:, :max_new_tokens]
  decode_s = time.perf_counter() - t0
  tokens, stopped = [], []
  for row in out_BN:
    hits = np.flatnonzero(row == eos_id) if stop_at_eos and eos_id >= 0 else []
    n = int(hits[0]) + 1 if len(hits) else len(row)
    tokens.append(row[:n])
    stopped.append(bool(len(hits)))
  return Generation(tokens, stopped, c1 + c2, prefill_s, decode_s, int(c1 > 0) + int(c2 > 0))
