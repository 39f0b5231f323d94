"""What a law's loss is measured in: nats per token of one tokenizer on one corpus.

A loss in nats/token compares only between runs that cut the same text into
the same tokens: Chinchilla's 1.69 nats/token irreducible loss is per
SentencePiece token of MassiveText, and a byte-level model's loss on the
standard library is per byte. Every law (``chinchax.laws.parametric``) carries a
:class:`LossUnits`; ``chinchax plan`` prints a predicted loss only where the
plan trains the law's tokenizer (:meth:`LossUnits.same_tokenizer`), and never
a loss above ln(vocab_size) (:meth:`LossUnits.ceiling`): a uniform guess over
V tokens costs ln V nats/token, so no trained model does worse.
Bits per byte (loss / ln 2 / bytes per token) are given where bytes per token
are known.
"""

from __future__ import annotations

import dataclasses
import math

# chinchax's byte tokenizer: 256 byte values + EOS (chinchax.data.tokenizers.ByteTokenizer).
BYTES_VOCAB_SIZE = 257


@dataclasses.dataclass(frozen=True)
class LossUnits:
  """The tokens a loss is counted in.

  Attributes:
    tokenizer: its kind, e.g. ``"bytes"``, ``"bpe"``, ``"hf"``, ``"SentencePiece"``.
    vocab_size: tokens in its vocabulary (None when unknown).
    corpus: the text the loss was measured on, e.g. ``"MassiveText"``.
    label: how a reader knows these tokens, e.g. ``"Chinchilla's MassiveText tokens"``.
    sha256: the tokenizer's digest (``chinchax.data.tokenizers``), None when unknown.
    bytes_per_token: UTF-8 bytes per token on the corpus, None when unknown.
    known: False for a law whose tokenizer nobody recorded (an old fit.json).
  """

  tokenizer: str
  vocab_size: int | None
  corpus: str
  label: str = ""
  sha256: str | None = None
  bytes_per_token: float | None = None
  known: bool = True

  def describe(self) -> str:
    """'nats/token of <label>' with the tokenizer and vocabulary, e.g. for ``plan``."""
    if not self.known:
      return "nats/token of an unrecorded tokenizer and corpus (no recipe in the law file)"
    vocab = f", {self.vocab_size:,}-token vocabulary" if self.vocab_size else ""
    name = self.label or f"{self.tokenizer} tokens of {self.corpus}"
    return f"nats/token of {name} ({self.tokenizer}{vocab})"

  @property
  def ceiling(self) -> float | None:
    """ln(vocab_size), nats/token: a uniform guess's loss, above which no loss is possible."""
    return math.log(self.vocab_size) if self.vocab_size and self.vocab_size > 1 else None

  def possible(self, loss: float | None) -> bool:
    """Whether ``loss`` (nats/token) is at or below :attr:`ceiling` (True when unknown)."""
    return loss is None or self.ceiling is None or loss <= self.ceiling

  def same_tokenizer(self, other: "LossUnits") -> bool:
    """Whether a loss in these units is a loss in ``other``'s: both known, the same kind and
    vocabulary, and the same digest where both record one."""
    if not (self.known and other.known) or self.tokenizer != other.tokenizer:
      return False
    if self.vocab_size != other.vocab_size:
      return False
    if self.sha256 and other.sha256 and self.sha256 != other.sha256:
      return False
    return True

  def bits_per_byte(self, loss: float | None) -> float | None:
    """``loss`` (nats/token) as bits per byte, when bytes per token are known."""
    if loss is None or not self.bytes_per_token:
      return None
    return loss / math.log(2.0) / self.bytes_per_token

  def to_dict(self) -> dict:
    """JSON-ready dict (``from_dict`` reads it back)."""
    return {"loss": "nats/token", **dataclasses.asdict(self), "description": self.describe()}

  @classmethod
  def from_dict(cls, d: dict) -> "LossUnits":
    """The units of a ``to_dict`` dict (unknown keys ignored)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})

  @classmethod
  def from_recipe(cls, recipe: dict | None, bytes_per_token: float | None = None) -> "LossUnits":
    """The units of a law fitted on runs of ``recipe`` (``chinchax.laws.recipe``): its tokenizer
    and corpus; ``unknown()`` when the recipe has no single tokenizer."""
    tok = recipe.get("tokenizer") if isinstance(recipe, dict) else None
    if not isinstance(tok, dict) or "disagree" in tok or not tok.get("kind"):
      return cls.unknown()
    data = recipe.get("data") if isinstance(recipe.get("data"), dict) else {}
    if "disagree" in data:
      corpus = "several corpora (the runs disagree)"
    else:
      where = data.get("paths") or data.get("hf_name") or ""
      fp = (data.get("fingerprint") or "")[:12]
      corpus = (f"{data.get('source', '?')}{' ' + where if where else ''}"
                f"{' (fingerprint ' + fp + ')' if fp else ''}")
    return cls(tokenizer=str(tok["kind"]), vocab_size=tok.get("vocab_size"), corpus=corpus,
               label=f"{tok['kind']} tokens of {corpus}", sha256=tok.get("sha256"),
               bytes_per_token=bytes_per_token)

  @classmethod
  def unknown(cls) -> "LossUnits":
    """Units nobody recorded (a fit file without a recipe)."""
    return cls(tokenizer="unknown", vocab_size=None, corpus="unknown", known=False)


# Chinchilla and its refits count loss per token of Gopher's SentencePiece tokenizer
# (32,000 tokens; Rae et al. 2021, Sec. 3; Chinchilla, Hoffmann et al. 2022, Sec. 4.1, drops
# its NFKC normalisation, sharing 94.15% of the tokens) on MassiveText.
MASSIVETEXT = LossUnits(tokenizer="SentencePiece", vocab_size=32_000, corpus="MassiveText",
                        label="Chinchilla's MassiveText tokens")


def plan_units(recipe_units: LossUnits | None, vocab_size: int) -> LossUnits:
  """The tokens a planned run trains on: the law recipe's when the plan follows it, else
  chinchax's byte tokenizer for a 257-token vocabulary, else an unnamed tokenizer."""
  if recipe_units is not None and recipe_units.known and recipe_units.vocab_size == vocab_size:
    return recipe_units
  if vocab_size == BYTES_VOCAB_SIZE:
    return LossUnits(tokenizer="bytes", vocab_size=BYTES_VOCAB_SIZE, corpus="the plan's corpus",
                     label="bytes (chinchax's byte tokenizer)", bytes_per_token=1.0)
  return LossUnits(tokenizer="unnamed", vocab_size=vocab_size, corpus="the plan's corpus",
                   label=f"an unnamed {vocab_size:,}-token tokenizer", known=False)
