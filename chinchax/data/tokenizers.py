"""Tokenizers: byte-level (default), an HF ``tokenizers`` tokenizer.json, or a trained byte-level BPE.

Every tokenizer here has ``name`` (used in the store's directory name),
``vocab_size`` (one more than the largest id), ``eos_id`` (appended after each
document), ``dtype`` (the smallest unsigned dtype holding every id: uint16 up
to 65,536 ids, else uint32), ``digest`` (sha256 naming the exact vocabulary and
rules), ``encode_batch`` (list of UTF-8 bytes → list of id arrays) and
``describe`` (what the store manifest records).

``data.tokenizer`` picks one (:func:`make_tokenizer`):

* ``bytes``: each UTF-8 byte is a token (ids 0–255), EOS = 256, vocab 257.
* ``hf``: ``data.tokenizer_path`` names a tokenizer.json of the HF
  ``tokenizers`` library; documents and prompts keep the tokenizer's own
  special tokens — the ones its post-processor adds around a text (a Llama
  template's BOS ``<s>``; :attr:`HFTokenizer.prefix_ids` / ``suffix_ids``),
  so chinchax's ids are ``encode(text, add_special_tokens=True)``'s, as
  ``transformers.AutoTokenizer`` gives them — and each document is followed
  by its EOS token (``data.eos_token``, or the first of
  :data:`EOS_CANDIDATES` it knows) unless the tokenizer's own suffix already
  ends with it.
* ``bpe``: a byte-level BPE (GPT-2 style pre-tokenisation, 256 byte symbols,
  EOS ``<|endoftext|>`` = id 0) of ``data.bpe_vocab_size`` ids, trained with HF
  ``tokenizers`` on the corpus's training documents when its store is built
  and saved beside the store. Until then :func:`make_tokenizer` returns a
  :class:`BPESpec` that knows only the vocab size.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import sys
import time
from typing import Iterable

import numpy as np

from chinchax.data.sources import DataError

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
BPE_EOS = "<|endoftext|>"
SPECIAL_AS_TEXT = b"chinchax: special tokens inside text are encoded as text\n"
# Part of the digest of a tokenizer whose post-processor adds tokens around a text: its stores
# hold them (a store built before they were kept has another digest and is never reused).
KEEPS_ADDED = b"chinchax: the tokens the post-processor adds around a text are kept\n"


# Documents longer than this are encoded in pieces cut at safe boundaries (:func:`split_document`),
# and encode_batch encodes at most about ENCODE_GROUP_BYTES of text per call: the HF tokenizer
# holds 125-145 bytes of RAM per byte of text it encodes at once.
PIECE_BYTES = 1 << 18
ENCODE_GROUP_BYTES = 1 << 20
# A cut right after a newline between two ASCII non-space characters: under GPT-2's byte-level
# pre-tokenisation regex (no lookbehind; the newline is a pre-token of its own both in the whole
# text and at the end of a piece) the pre-tokens, hence the BPE ids, are the same either way.
_SAFE_CUT = re.compile(rb"(?<=[\x21-\x7e])\n(?=[\x21-\x7e])")


def split_document(data: bytes, max_bytes: int = PIECE_BYTES) -> list[bytes]:
  """Cuts ``data`` into pieces of at most ``max_bytes`` where possible, only after a newline
  that sits between two ASCII non-space characters (a piece runs longer when no such newline
  comes in time). Encoding the pieces one by one gives the ids of the whole document for the
  byte tokenizer and for a byte-level BPE with GPT-2 pre-tokenisation and no added prefix space
  (the ``bpe`` tokenizer); see :func:`_splittable`.

  Returns:
    the pieces, whose concatenation is ``data``.
  """
  if len(data) <= max_bytes:
    return [data]
  cuts, best = [0], None
  for m in _SAFE_CUT.finditer(data):
    p = m.end()
    if p - cuts[-1] > max_bytes and best is not None and best > cuts[-1]:
      cuts.append(best)
    best = p
  if len(data) - cuts[-1] > max_bytes and best is not None and best > cuts[-1]:
    cuts.append(best)
  cuts.append(len(data))
  return [data[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


class TokenizerError(DataError):
  """A tokenizer file is missing or unreadable, or lacks what chinchax needs; names it."""


def ids_dtype(vocab_size: int) -> type:
  """uint16 when every id < vocab_size fits (vocab_size ≤ 65,536), else uint32."""
  return np.uint16 if vocab_size <= 1 << 16 else np.uint32


class ByteTokenizer:
  """Each UTF-8 byte is one token (ids 0–255); EOS = 256; vocab_size = 257."""

  name = "bytes"
  kind = "bytes"
  vocab_size = 257
  eos_id = 256
  dtype = np.uint16
  digest = hashlib.sha256(b"chinchax bytes tokenizer: ids 0-255 = bytes, 256 = EOS").hexdigest()

  def encode(self, data: bytes) -> np.ndarray:
    """Bytes → uint16 ids [len(data)]."""
    return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)

  def encode_batch(self, docs: list[bytes]) -> list[np.ndarray]:
    """Documents (bytes) → uint16 id arrays, one per document."""
    return [self.encode(d) for d in docs]

  encode_prompt = encode
  prefix_ids = suffix_ids = ()
  bos_id = None

  def decode(self, ids) -> bytes:
    """ids → bytes; EOS and out-of-range ids are dropped."""
    arr = np.asarray(ids)
    return bytes(arr[(arr >= 0) & (arr < 256)].astype(np.uint8).tolist())

  def describe(self) -> dict:
    return {"name": self.name, "kind": self.kind, "vocab_size": self.vocab_size,
            "eos_id": self.eos_id, "sha256": self.digest}

  def save(self, directory: pathlib.Path) -> str | None:
    """Nothing to save for bytes; returns None."""
    return None


def _hf():
  try:
    import tokenizers
  except ImportError:
    raise TokenizerError("this tokenizer needs the tokenizers package: "
                         "pip install 'chinchax[hf]'") from None
  return tokenizers


def _splittable(tokenizer_json: str) -> bool:
  """Whether a tokenizer.json encodes text cut by :func:`split_document` to the same ids: a BPE
  model behind GPT-2's byte-level pre-tokenisation (regex on, no prefix space), no normalizer,
  and only special added tokens (special tokens inside text are encoded as text here)."""
  try:
    j = json.loads(tokenizer_json)
  except ValueError:
    return False
  pre = j.get("pre_tokenizer") or {}
  return (j.get("normalizer") is None and (j.get("model") or {}).get("type") == "BPE"
          and pre.get("type") == "ByteLevel" and pre.get("add_prefix_space") is False
          and pre.get("use_regex", True) is True
          and all(t.get("special") for t in j.get("added_tokens") or []))


def added_tokens(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(ids before, ids after) a text that ``tokenizer``'s post-processor adds: a Llama template
  (``<s> $A``) gives ((1,), ()); a tokenizer without a post-processor ((), ()). Found by
  encoding a probe text with and without ``add_special_tokens``.

  Raises:
    TokenizerError: the post-processor does more than add tokens around the text.
  """
  probe = "chinchax probe 1"
  bare = tokenizer.encode(probe, add_special_tokens=False).ids
  full = tokenizer.encode(probe, add_special_tokens=True).ids
  n = len(bare)
  for i in range(len(full) - n + 1):
    if full[i:i + n] == bare:
      return tuple(full[:i]), tuple(full[i + n:])
  raise TokenizerError(f"the tokenizer's post-processor changes a text's own ids "
                       f"({bare} → {full}), not only adding tokens around it; chinchax keeps "
                       f"only added tokens")


class HFTokenizer:
  """An HF ``tokenizers.Tokenizer`` behind the chinchax tokenizer interface.

  ``prefix_ids`` / ``suffix_ids``: the special tokens the tokenizer's post-processor adds
  before / after a text (:func:`added_tokens`); :meth:`encode_batch` adds them to each
  document (the suffix without a trailing EOS: the store appends EOS after every document),
  :meth:`encode_prompt` to a prompt, as ``add_special_tokens=True`` does.

  Args:
    tokenizer: the ``tokenizers.Tokenizer``.
    name: short name for store directories ("hf", "bpe8192").
    kind: "hf" (loaded from a file) or "bpe" (trained here).
    eos_token: the EOS token; "" = the first of :data:`EOS_CANDIDATES` in the vocabulary.
    origin: where it came from (a path), for the manifest.
  Raises:
    TokenizerError: no EOS token can be found.
  """

  def __init__(self, tokenizer, *, name: str = "hf", kind: str = "hf", eos_token: str = "",
               origin: str = ""):
    self._tok = tokenizer
    self.name, self.kind, self.origin = name, kind, origin
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    if not vocab:
      raise TokenizerError(f"tokenizer {origin or name!r} has an empty vocabulary")
    self.vocab_size = max(vocab.values()) + 1
    candidates = (eos_token,) if eos_token else EOS_CANDIDATES
    found = [t for t in candidates if t in vocab]
    if not found:
      raise TokenizerError(
          f"tokenizer {origin or name!r} has no EOS token {eos_token!r}" if eos_token else
          f"tokenizer {origin or name!r} has none of the EOS tokens {list(EOS_CANDIDATES)}; "
          f"set data.eos_token to the token that ends a document")
    self.eos_token = found[0]
    self.eos_id = int(vocab[self.eos_token])
    self.dtype = ids_dtype(self.vocab_size)
    self._json = tokenizer.to_str()
    self.prefix_ids, self.suffix_ids = added_tokens(tokenizer)
    self.bos_id = self.prefix_ids[0] if len(self.prefix_ids) == 1 else None
    self.bos_token = tokenizer.id_to_token(self.bos_id) if self.bos_id is not None else None
    # Text is only ever text: a literal "<|endoftext|>" (or any special token) inside a document is
    # encoded as its characters, never as the special id; EOS is appended by the builder alone.
    # (A runtime setting, not in the JSON: the digest says so, so stores built otherwise are not reused.)
    tokenizer.encode_special_tokens = True
    keeps = KEEPS_ADDED if self.prefix_ids or self.suffix_ids else b""
    self.digest = hashlib.sha256(
        SPECIAL_AS_TEXT + keeps + self._json.encode("utf-8")).hexdigest()
    self.splittable = _splittable(self._json)

  @classmethod
  def from_file(cls, path: str, eos_token: str = "", *, name: str = "hf", kind: str = "hf"):
    """Loads a tokenizer.json.

    Raises:
      TokenizerError: the file is missing, is not a tokenizer.json, or has no EOS token.
    """
    tokenizers = _hf()
    p = pathlib.Path(os.path.expanduser(str(path)))
    if not p.is_file():
      raise TokenizerError(f"tokenizer file {str(path)!r} does not exist (data.tokenizer_path)")
    try:
      tok = tokenizers.Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
      raise TokenizerError(f"tokenizer file {str(path)!r} is not a valid HF tokenizers "
                           f"tokenizer.json: {e}") from None
    return cls(tok, name=name, kind=kind, eos_token=eos_token, origin=str(p))

  def __getstate__(self):
    return {"json": self._json, "name": self.name, "kind": self.kind,
            "eos_token": self.eos_token, "origin": self.origin}

  def __setstate__(self, state):
    tok = _hf().Tokenizer.from_str(state["json"])
    self.__init__(tok, name=state["name"], kind=state["kind"], eos_token=state["eos_token"],
                  origin=state["origin"])

  def encode(self, data: bytes) -> np.ndarray:
    """A document's UTF-8 bytes → ids [n] in ``self.dtype`` (see :meth:`encode_batch`)."""
    return self.encode_batch([data])[0]

  def encode_prompt(self, data: bytes) -> np.ndarray:
    """A prompt's UTF-8 bytes → ids [n]: the tokenizer's own encoding with its added tokens
    (``encode(text, add_special_tokens=True)``, what ``AutoTokenizer`` gives); a literal
    special token inside the text is still text."""
    core = self.encode_batch([data], added=False)[0]
    return np.concatenate([np.asarray(self.prefix_ids, self.dtype), core,
                           np.asarray(self.suffix_ids, self.dtype)])

  @property
  def document_suffix(self) -> tuple[int, ...]:
    """The suffix :meth:`encode_batch` adds: ``suffix_ids`` without a trailing EOS."""
    s = self.suffix_ids
    return s[:-1] if s and s[-1] == self.eos_id else s

  def encode_batch(self, docs: list[bytes], added: bool = True) -> list[np.ndarray]:
    """Documents (valid UTF-8 bytes) → id arrays in ``self.dtype``, one per document, each
    between ``prefix_ids`` and :attr:`document_suffix` (``added``; none when false).

    Encoded about :data:`ENCODE_GROUP_BYTES` of text per tokenizer call; when
    ``splittable`` (:func:`_splittable`), a document above :data:`PIECE_BYTES`
    is encoded in the pieces of :func:`split_document` (the same ids), so RAM
    stays bounded whatever a document's size."""
    pieces, owner = [], []
    for k, d in enumerate(docs):
      parts = split_document(d, PIECE_BYTES) if self.splittable else [d]
      pieces += parts
      owner += [k] * len(parts)
    fast = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
    out = [[] for _ in docs]
    i = 0
    while i < len(pieces):
      j, size = i, 0
      while j < len(pieces) and (j == i or size + len(pieces[j]) <= ENCODE_GROUP_BYTES):
        size += len(pieces[j])
        j += 1
      encodings = fast([p.decode("utf-8") for p in pieces[i:j]], add_special_tokens=False)
      for k, e in zip(owner[i:j], encodings):
        out[k].append(np.asarray(e.ids, dtype=np.int64).astype(self.dtype))
      del encodings
      i = j
    if added and (self.prefix_ids or self.document_suffix):
      pre = np.asarray(self.prefix_ids, self.dtype)
      suf = np.asarray(self.document_suffix, self.dtype)
      out = [[pre, *a, suf] for a in out]
    return [a[0] if len(a) == 1 else np.concatenate(a) if a else np.zeros(0, self.dtype)
            for a in out]

  def decode(self, ids) -> bytes:
    """ids → UTF-8 bytes; special tokens (EOS, and the tokens added around a text) are dropped,
    also where the tokenizer.json holds them in its model's vocabulary rather than as special
    added tokens (an exported one: :mod:`chinchax.export.tokenizer_files`)."""
    drop = {self.eos_id, *self.prefix_ids, *self.suffix_ids}
    ids = [int(i) for i in np.asarray(ids).ravel() if int(i) not in drop]
    return self._tok.decode(ids, skip_special_tokens=True).encode("utf-8")

  def describe(self) -> dict:
    out = {"name": self.name, "kind": self.kind, "vocab_size": self.vocab_size,
           "eos_id": self.eos_id, "eos_token": self.eos_token, "sha256": self.digest,
           "origin": self.origin, "file": "tokenizer.json"}
    if self.prefix_ids or self.suffix_ids:
      out["added_tokens"] = self.added_description()
    return out

  def added_description(self) -> str:
    """What the tokenizer adds around a text, in words ("<s> (id 1) before each text")."""
    name = lambda ids: " ".join(f"{self._tok.id_to_token(i)} (id {i})" for i in ids)  # noqa: E731
    parts = [f"{name(self.prefix_ids)} before"] if self.prefix_ids else []
    parts += [f"{name(self.suffix_ids)} after"] if self.suffix_ids else []
    return " and ".join(parts) + " each text (its post-processor, kept)" if parts else \
        "nothing around a text"

  def to_json(self) -> str:
    """The tokenizer.json text."""
    return self._json

  def save(self, directory: pathlib.Path) -> str:
    """Writes ``directory/tokenizer.json``; returns its file name."""
    (pathlib.Path(directory) / "tokenizer.json").write_text(self._json)
    return "tokenizer.json"


class BPESpec:
  """A byte-level BPE still to be trained: knows its name and vocab size only."""

  kind = "bpe"
  eos_id = 0  # BPE_EOS is the trained vocabulary's first token (train_bpe)

  def __init__(self, vocab_size: int):
    self.vocab_size = int(vocab_size)
    self.name = f"bpe{self.vocab_size}"
    self.dtype = ids_dtype(self.vocab_size)


PROGRESS_EVERY_S = 10.0  # seconds between BPE progress lines off a terminal


def _reported(texts: Iterable[str], say, every_s: float = PROGRESS_EVERY_S):
  """``texts``, saying every ``every_s`` seconds how many documents and MB were read, and once
  all are read that the merges are being counted."""
  start = last = time.monotonic()
  docs = size = 0
  for text in texts:
    yield text
    docs, size = docs + 1, size + len(text)
    now = time.monotonic()
    if now - last >= every_s:
      say(f"bpe: read {docs:,} documents ({size / 1e6:.1f} MB of text) in {now - start:.0f} s")
      last = now
  say(f"bpe: read all {docs:,} documents ({size / 1e6:.1f} MB of text) in "
      f"{time.monotonic() - start:.0f} s; counting merges")


def train_bpe(texts: Iterable[str], vocab_size: int, *, progress: bool = False,
              length: int | None = None, say=None) -> HFTokenizer:
  """Trains a byte-level BPE with HF ``tokenizers`` (deterministic for a given text order).

  Pre-tokenisation is GPT-2's byte-level regex split without an added prefix
  space; the 256 byte symbols are always in the vocabulary, ``<|endoftext|>``
  is id 0. A corpus with too few distinct pairs ends below ``vocab_size``.

  Args:
    texts: the training documents.
    vocab_size: target number of ids (≥ 258).
    progress: report progress: the trainer's progress bar on a terminal (stderr); elsewhere
      (a log file, a pipe), where that bar writes only blank lines, one line every
      :data:`PROGRESS_EVERY_S` seconds of reading and one when training ends, through ``say``.
    length: number of texts, for the progress bar.
    say: prints one progress line (default: to stderr).
  """
  tokenizers = _hf()
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  bar = progress and sys.stderr.isatty()
  say = say or (lambda line: print(line, file=sys.stderr, flush=True))
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[BPE_EOS], show_progress=bar,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  start = time.monotonic()
  tok.train_from_iterator(_reported(texts, say) if progress and not bar else texts, trainer,
                          length=length)
  if progress and not bar:
    say(f"bpe: {tok.get_vocab_size():,} tokens in {time.monotonic() - start:.0f} s")
  return HFTokenizer(tok, name=f"bpe{vocab_size}", kind="bpe", eos_token=BPE_EOS)


def make_tokenizer(spec):
  """The tokenizer named by ``config.data`` (or by a bare name, "bytes").

  Cheap: loads a tokenizer.json but trains nothing (``bpe`` gives a :class:`BPESpec`).

  Args:
    spec: ``config.data`` (uses ``tokenizer``, ``tokenizer_path``,
      ``eos_token``, ``bpe_vocab_size``) or the string "bytes".
  Raises:
    TokenizerError: unknown name, or an unusable tokenizer file.
  """
  name = spec if isinstance(spec, str) else spec.tokenizer
  if name == "bytes":
    return ByteTokenizer()
  if isinstance(spec, str):
    raise TokenizerError(f"tokenizer {name!r} needs its config (data.tokenizer_path / "
                         f"data.bpe_vocab_size); known by name alone: 'bytes'")
  if name == "hf":
    return HFTokenizer.from_file(spec.tokenizer_path, spec.eos_token)
  if name == "bpe":
    return BPESpec(spec.bpe_vocab_size)
  raise TokenizerError(f"unknown tokenizer {name!r}; known: 'bytes', 'bpe', 'hf'")


def load_saved(directory: pathlib.Path, described: dict):
  """Rebuilds the tokenizer a store manifest describes (``manifest["tokenizer"]``)."""
  if described["kind"] == "bytes":
    return ByteTokenizer()
  return HFTokenizer.from_file(str(pathlib.Path(directory) / described["file"]),
                               described.get("eos_token", ""), name=described["name"],
                               kind=described["kind"])
