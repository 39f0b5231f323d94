"""How the next token is chosen from the logits: greedy, temperature, top-k, top-p (nucleus).

Applied in this order, as HF ``generate`` applies its logits warpers: ids the tokenizer does
not have (the model's vocab_size may exceed the tokenizer's) are never chosen; temperature 0
is greedy (argmax, the first of equal maxima); otherwise the logits are divided by the
temperature, all but the ``top_k`` largest are dropped (Fan et al. 2018), then all but the
smallest set of most probable tokens whose probability sums to at least ``top_p`` (Holtzman
et al. 2020, "The Curious Case of Neural Text Degeneration"), and a token is drawn from the
softmax of what is left.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from chinchax.sample.error import SampleError


@dataclasses.dataclass(frozen=True)
class Sampling:
  """The rule for the next token (hashable: a static argument of the jitted decode loop).

  Attributes:
    temperature: ≥ 0; 0 = greedy.
    top_k: keep the k most likely tokens; 0 = all.
    top_p: keep the most likely tokens up to this probability mass, in (0, 1]; 1 = all.
    vocab: ids ≥ vocab are never chosen (the tokenizer's vocab_size; 0 = the model's).
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  vocab: int = 0

  def check(self) -> "Sampling":
    """Returns self.

    Raises:
      SampleError: temperature < 0 (or not finite), top_k < 0, top_p outside (0, 1].
    """
    t, k, p = self.temperature, self.top_k, self.top_p
    if not (t >= 0 and t < float("inf")):
      raise SampleError(f"--temperature {t} must be a finite number ≥ 0 (0 = greedy)")
    if k < 0:
      raise SampleError(f"--top-k {k} must be ≥ 0 (0 = no top-k cut)")
    if not 0 < p <= 1:
      raise SampleError(f"--top-p {p} must be in (0, 1] (1 = no nucleus cut)")
    return self

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def filtered_logits(logits_BV: jax.Array, rule: Sampling) -> jax.Array:
  """float32 [B, V] logits divided by the temperature, with the tokens ``rule`` drops at
  −inf (a non-greedy rule; see the module docstring)."""
  neg_inf = jnp.float32(-jnp.inf)
  logits_BV = logits_BV.astype(jnp.float32)
  V = logits_BV.shape[-1]
  if 0 < rule.vocab < V:
    logits_BV = jnp.where(jnp.arange(V) < rule.vocab, logits_BV, neg_inf)
  logits_BV = logits_BV / jnp.float32(rule.temperature)
  if 0 < rule.top_k < V:
    kth_B1 = jax.lax.top_k(logits_BV, rule.top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV >= kth_B1, logits_BV, neg_inf)
  if rule.top_p < 1:
    sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV  # mass of the more likely tokens
    kept_BV = before_BV < jnp.float32(rule.top_p)  # the most likely token always stays
    threshold_B1 = jnp.min(jnp.where(kept_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    logits_BV = jnp.where(logits_BV >= threshold_B1, logits_BV, neg_inf)
  return logits_BV


def choose(key: jax.Array, logits_BV: jax.Array, rule: Sampling) -> jax.Array:
  """int32 [B] next tokens from float32 logits [B, V] by ``rule`` (``key`` unused when greedy)."""
  if rule.greedy:
    V = logits_BV.shape[-1]
    if 0 < rule.vocab < V:
      logits_BV = jnp.where(jnp.arange(V) < rule.vocab, logits_BV, -jnp.inf)
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  return jax.random.categorical(key, filtered_logits(logits_BV, rule), axis=-1).astype(jnp.int32)
