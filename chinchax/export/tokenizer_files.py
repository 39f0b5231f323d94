"""The tokenizer an export ships: the run's own, found by its sha256, written as HF files.

**Which tokenizer.** A run records the sha256 of its tokenizer
(``data_signature.tokenizer_sha256`` in its config.json, the digest of
:mod:`chinchax.data.tokenizers`). The export looks, in order, in the store named
in the run's summary.json, the store its config and corpus fingerprint
(``data_signature.store_fingerprint``) name, the BPE saved for that corpus under
``<store_root>/tokenizers/`` (a run interrupted before its summary has only these)
and ``data.tokenizer_path``; it takes the first file whose sha256 is the run's, and
refuses with one line when none is. ``--tokenizer PATH`` must have the run's sha256 too.
A run whose config.json predates ``data_signature`` gets the first file found.

**Byte-level runs** get a tokenizer.json built with the ``tokenizers`` library: a BPE
without merges over GPT-2's 256 byte symbols after a byte-level pre-tokenizer, so id b
is byte b (0–255), and ``<|endoftext|>`` = 256 is EOS — chinchax's own ids.

**Special tokens inside text are text**, in chinchax and in the export alike: a literal
``<|endoftext|>`` in a document or prompt is encoded as its characters, with transformers and
with the ``tokenizers`` library alone. chinchax sets ``encode_special_tokens``, a runtime setting
that tokenizer.json cannot hold; so the exported tokenizer.json lists no special token among its
``added_tokens`` (the part of the file matched in text before the model runs): each keeps its id
in the model's vocabulary (:func:`special_tokens_as_text`), where the model never assembles it
from characters, and decodes to its text. tokenizer_config.json names EOS (and BOS), which
transformers adds back as special tokens of the same ids, with ``split_special_tokens: true``,
so its ``skip_special_tokens`` drops them; the ``tokenizers`` library alone keeps EOS's text in
a decode. EOS is only ever the id the trainer appends after each document.

**BOS.** A tokenizer whose post-processor adds one token before each text (a Llama template,
``<s> $A``) has that token as its BOS, and chinchax keeps it in training and sampling
(:mod:`chinchax.data.tokenizers`); the export names it BOS in tokenizer_config.json,
config.json and generation_config.json. A tokenizer that adds nothing (byte-level, chinchax's
BPE, GPT-2's) has no BOS of its own: BOS is named as EOS there, GPT-2's convention, and
nothing is added to a text. export_info.json says which (``tokenizer.added_tokens``).

**tokenizer_config.json** names ``PreTrainedTokenizerFast`` with EOS, BOS and
``model_input_names = [input_ids, attention_mask]`` (a Llama takes no
``token_type_ids``). ``model_max_length`` is transformers' "no limit" value:
RoPE has no learned positions, so longer texts run (quality beyond the trained
``seq_len``, recorded in export_info.json, is not measured); decoding keeps spaces
as they are (``clean_up_tokenization_spaces: false``), as chinchax decodes.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import types

from chinchax.data import store as store_lib
from chinchax.data import tokenizers as tokenizers_lib
from chinchax.storage import paths as paths_lib
from chinchax.export.error import ExportError

# transformers' VERY_LARGE_INTEGER (int(1e30)): its own value for "no maximum length".
NO_MAX_LENGTH = int(1e30)
BYTES_EOS = "<|endoftext|>"


@dataclasses.dataclass
class ExportTokenizer:
  """The tokenizer an export writes.

  Attributes:
    tokenizer: chinchax's tokenizer (``ByteTokenizer`` or ``HFTokenizer``), for encoding checks.
    json_text: the tokenizer.json to write.
    eos_token: the EOS token's text; ``eos_id`` its id.
    info: what export_info.json records (kind, sha256, ids, where it was found).
  """
  tokenizer: object
  json_text: str
  eos_token: str
  eos_id: int
  info: dict

  @property
  def bos_id(self) -> int:
    """The BOS id: the token the tokenizer adds before each text, else EOS's."""
    bos = getattr(self.tokenizer, "bos_id", None)
    return self.eos_id if bos is None else int(bos)

  @property
  def bos_token(self) -> str:
    """The BOS token's text (see :attr:`bos_id`)."""
    return getattr(self.tokenizer, "bos_token", None) or self.eos_token


def _tokenizers():
  try:
    import tokenizers
  except ImportError:
    raise ExportError("export needs the tokenizers package for tokenizer.json: "
                      "pip install 'chinchax[hf]'") from None
  return tokenizers


def byte_symbols() -> dict[int, str]:
  """byte → its one-character symbol in GPT-2's byte-level alphabet (what HF's ``ByteLevel``
  pre-tokenizer maps bytes to): printable Latin-1 bytes stand for themselves, the other 68
  become U+0100, U+0101, … in byte order."""
  printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
  out, shifted = {}, 0
  for b in range(256):
    if b in printable:
      out[b] = chr(b)
    else:
      out[b] = chr(0x100 + shifted)
      shifted += 1
  return out


def byte_level_json() -> str:
  """tokenizer.json (HF ``tokenizers``) of chinchax's byte tokenizer: ids 0–255 = UTF-8 bytes,
  256 = ``<|endoftext|>`` (EOS); no normalizer, no added BOS/EOS."""
  tk = _tokenizers()
  vocab = {symbol: b for b, symbol in byte_symbols().items()}
  tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = tk.decoders.ByteLevel()
  tok.add_special_tokens([tk.AddedToken(BYTES_EOS, special=True, normalized=False)])
  if tok.token_to_id(BYTES_EOS) != tokenizers_lib.ByteTokenizer.eos_id:
    raise AssertionError(f"byte-level EOS got id {tok.token_to_id(BYTES_EOS)}, not 256")
  return special_tokens_as_text(tok.to_str())


def special_tokens_as_text(tokenizer_json: str) -> str:
  """tokenizer.json with its special added tokens moved into the model's vocabulary, so that
  ``tokenizers.Tokenizer.from_file`` reads their literal text inside a text as text (see the
  module docstring); ids, encodings of text, decodes and the post-processor are unchanged.

  A special token the model's vocabulary (a ``{token: id}`` map: BPE, WordPiece, WordLevel)
  already holds at the same id is only dropped from ``added_tokens``; one it lacks is added at
  its id. Non-special added tokens stay (they are words of the vocabulary, matched in text by
  every library), and so does every added token of a model whose vocabulary is a list
  (Unigram: its ids are positions). Applying it twice gives the same text.
  """
  j = json.loads(tokenizer_json)
  vocab = (j.get("model") or {}).get("vocab")
  if not isinstance(vocab, dict):
    return tokenizer_json
  kept, moved = [], False
  for t in j.get("added_tokens") or []:
    have = vocab.get(t["content"])
    if not t.get("special") or (have is not None and have != t["id"]):
      kept.append(t)
      continue
    vocab[t["content"]] = t["id"]
    moved = True
  if not moved:
    return tokenizer_json
  j["added_tokens"] = kept
  return json.dumps(j, ensure_ascii=False)


def tokenizer_config(eos_token: str, bos_token: str | None = None) -> dict:
  """tokenizer_config.json for ``transformers.AutoTokenizer`` (see the module docstring);
  ``bos_token`` None = EOS's."""
  return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos_token,
          "bos_token": bos_token or eos_token,
          "model_input_names": ["input_ids", "attention_mask"],
          "model_max_length": NO_MAX_LENGTH, "split_special_tokens": True,
          "clean_up_tokenization_spaces": False}


def _candidates(workdir: pathlib.Path, run: dict) -> list[pathlib.Path]:
  """Where the run's tokenizer.json may be, in the order they are tried."""
  data, sig = run["config"]["data"], run.get("data_signature") or {}
  out = []
  summary = workdir / "summary.json"
  try:
    store = json.loads(summary.read_text()).get("store") if summary.is_file() else None
  except (OSError, ValueError):
    store = None
  if store:
    out.append(paths_lib.as_path(store) / "tokenizer.json")
  fp, sha = sig.get("store_fingerprint"), sig.get("tokenizer_sha256")
  root = paths_lib.as_path(data.get("store_root", ""))
  vf, policy = float(data.get("val_fraction", 0.0)), data.get("decode_errors", "replace")
  name = (f"bpe{data.get('bpe_vocab_size')}" if data["tokenizer"] == "bpe" else data["tokenizer"])
  if fp and sha and data.get("store_root"):
    named = types.SimpleNamespace(digest=sha, name=name)  # what store_dir reads of a tokenizer
    out.append(store_lib.store_dir(str(root), fp, named, vf, policy) / "tokenizer.json")
  if fp and data["tokenizer"] == "bpe" and data.get("store_root"):
    out.append(root / "tokenizers" / f"{name}-{fp[:16]}-val{vf:g}-{policy}.json")
  if data["tokenizer"] == "hf" and data.get("tokenizer_path"):
    out.append(paths_lib.as_path(data["tokenizer_path"]))
  return out


def _eos_token(data: dict) -> str:
  return tokenizers_lib.BPE_EOS if data["tokenizer"] == "bpe" else data.get("eos_token", "") or ""


def find(workdir: pathlib.Path, run: dict, tokenizer_path: str = "") -> ExportTokenizer:
  """The run's tokenizer (see the module docstring), or ``tokenizer_path`` checked against it.

  Args:
    workdir: the run directory (resolved).
    run: its config.json.
    tokenizer_path: ``--tokenizer``; "" = find the run's own.
  Raises:
    ExportError: ``tokenizer_path`` is not the tokenizer the run was trained with (its
      sha256 differs), or the run's tokenizer file is found nowhere.
    TokenizerError: ``tokenizer_path`` is missing or not a tokenizer.json.
  """
  data = run["config"]["data"]
  want = (run.get("data_signature") or {}).get("tokenizer_sha256")
  if tokenizer_path:
    tok = tokenizers_lib.HFTokenizer.from_file(tokenizer_path, _eos_token(data))
    if want is not None and tok.digest != want:
      raise ExportError(
          f"--tokenizer {tokenizer_path} is not the tokenizer this run was trained with: its "
          f"sha256 is {tok.digest[:16]}…, the run's (config.json tokenizer_sha256) is "
          f"{want[:16]}…; give the run's tokenizer.json, or leave --tokenizer out")
    return for_tokenizer(tok, tokenizer_path)
  if data["tokenizer"] == "bytes":
    return byte_tokenizer()
  tried = _candidates(workdir, run)
  for path in tried:
    if path.is_file():
      try:
        tok = tokenizers_lib.HFTokenizer.from_file(paths_lib.local_copy(path), _eos_token(data))
      except tokenizers_lib.TokenizerError:  # damaged, or no EOS: not the run's; try the next
        continue
      if want is None or tok.digest == want:
        return for_tokenizer(tok, str(path))
  where = ", ".join(str(p) for p in tried) or "no store recorded in its config.json"
  raise ExportError(
      f"the run's {data['tokenizer']} tokenizer (sha256 {(want or '?')[:16]}…) is not found "
      f"(looked in {where}); pass it with --tokenizer PATH")


def byte_tokenizer() -> ExportTokenizer:
  """chinchax's byte tokenizer as an export ships it (:func:`byte_level_json`)."""
  tok = tokenizers_lib.ByteTokenizer()
  return ExportTokenizer(tok, byte_level_json(), BYTES_EOS, tok.eos_id, {
        **tok.describe(), "eos_token": BYTES_EOS, "file": "tokenizer.json",
        "ids": "0-255 = UTF-8 bytes, 256 = <|endoftext|> (EOS)",
        "added_tokens": "nothing around a text",
        "bos": f"none of its own: BOS is named as EOS {BYTES_EOS} (id 256), and nothing is "
               f"added before a text"})


def for_tokenizer(tok, origin: str) -> ExportTokenizer:
  """An ``HFTokenizer`` (loaded from ``origin``) as an export ships it."""
  info = {k: v for k, v in tok.describe().items() if k != "origin"}
  info["added_tokens"] = tok.added_description()
  info["bos"] = (f"{tok.bos_token} (id {tok.bos_id}), added before each text"
                 if tok.bos_id is not None else
                 f"none of its own: BOS is named as EOS {tok.eos_token} (id {tok.eos_id}), "
                 f"and nothing is added before a text")
  return ExportTokenizer(tok, special_tokens_as_text(tok.to_json()), tok.eos_token, tok.eos_id,
                         {**info, "found_at": origin})
