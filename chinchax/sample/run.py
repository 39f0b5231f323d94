"""A run's checkpoint and tokenizer, ready to sample from; a prompt's text in, text out.

The run, its checkpoint (latest or ``step``), its trial (a trials run: the best, or ``trial``)
and its tokenizer are found as ``chinchax export`` finds them (:mod:`chinchax.export`,
:mod:`chinchax.export.tokenizer_files`): the tokenizer must be the one the run was trained with
(its sha256). A byte-level run needs no file. Everything the request can get wrong is checked
before the checkpoint is read.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from chinchax.export import writer as export_lib
from chinchax.model import transformer as model_lib
from chinchax.data import tokenizers as tokenizers_lib
from chinchax.export import tokenizer_files
from chinchax.sample import generate as generate_lib
from chinchax.sample import strategies
from chinchax.sample.error import SampleError
from chinchax.storage import paths as paths_lib

DEFAULT_MAX_NEW_TOKENS = 256  # when not given: this many, or what the run's seq_len leaves


@dataclasses.dataclass
class Request:
  """One ``chinchax sample`` request.

  Attributes:
    prompt: the prompt text ("" = start a new document: the prompt is EOS alone).
    max_new_tokens: N new tokens at most; None = min(256, seq_len − prompt tokens).
    rule: how tokens are chosen.
    seed: PRNG seed of the draws.
    num_samples: B continuations of the prompt, drawn together.
    step: checkpoint step (None = latest); trial: of a trials run (None = its best).
    tokenizer_path: the run's tokenizer.json where it cannot be found ("" = find it).
    use_cache: decode over the KV cache (else recompute the full forward pass per token).
  """
  prompt: str = ""
  max_new_tokens: int | None = None
  rule: strategies.Sampling = strategies.Sampling()
  seed: int = 0
  num_samples: int = 1
  step: int | None = None
  trial: int | None = None
  tokenizer_path: str = ""
  use_cache: bool = True


@dataclasses.dataclass
class Result:
  """Texts (prompt + continuation, one per sample) and how they were made."""
  texts: list[str]
  generation: generate_lib.Generation
  prompt_tokens: int
  step: int
  trial: int | None
  added: str = ""  # the tokens the tokenizer adds to the prompt ("<s> (id 1) before"); "" = none


def tokenizer_of(workdir: pathlib.Path, run: dict, tokenizer_path: str = ""):
  """The run's tokenizer (``ByteTokenizer`` or ``HFTokenizer``).

  Raises:
    ExportError, TokenizerError: as :func:`chinchax.export.tokenizer_files.find`.
  """
  if run["config"]["data"]["tokenizer"] == "bytes" and not tokenizer_path:
    return tokenizers_lib.ByteTokenizer()
  return tokenizer_files.find(workdir, run, tokenizer_path).tokenizer


def model_config(run: dict, eos_id: int) -> model_lib.ModelConfig:
  """The float32 model of a run's config.json, with its document mask (``eos_id`` ends a
  document)."""
  document_mask = bool(run["config"]["model"].get("document_mask", False))
  return dataclasses.replace(export_lib.model_config(run), document_mask=document_mask,
                             eos_id=eos_id)


def build_model(params: dict, cfg: model_lib.ModelConfig) -> model_lib.Transformer:
  """The transformer with ``params`` (nested dicts of arrays, chinchax names) on the default
  device."""
  from flax import nnx

  abstract = nnx.eval_shape(lambda: model_lib.Transformer(cfg, nnx.Rngs(params=0)))
  graphdef, state = nnx.split(abstract, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


def prompt_ids(tok, text: str, seq_len: int, max_new_tokens: int | None) -> tuple[np.ndarray, int]:
  """(int32 [P] prompt ids, N new tokens) for ``text``; P + N ≤ seq_len.

  Raises:
    SampleError: the prompt leaves no room (P ≥ seq_len), or P + N > seq_len.
  """
  # The tokenizer's own encoding: with the tokens its post-processor adds (a Llama BOS), as
  # AutoTokenizer gives them; an empty prompt starts a document (its BOS, else EOS).
  ids = np.asarray(tok.encode_prompt(text.encode("utf-8")), np.int32)
  if ids.size == 0:
    ids = np.array([tok.eos_id], np.int32)
  P = int(ids.size)
  if max_new_tokens is None:
    if P >= seq_len:
      raise SampleError(f"the prompt is {P} tokens, not fewer than the run's seq_len {seq_len} "
                        f"(the KV cache holds {seq_len} positions); shorten it to at most "
                        f"{seq_len - 1} tokens")
    return ids, min(DEFAULT_MAX_NEW_TOKENS, seq_len - P)
  if P + max_new_tokens > seq_len:
    # A prompt is at least one token (EOS) and at least one token is new: only the remedies
    # that can succeed are named.
    fixes = []
    if max_new_tokens < seq_len:
      fixes.append(f"shorten the prompt to at most {seq_len - max_new_tokens} tokens")
    if P < seq_len:
      fixes.append(f"lower --max-new-tokens to at most {seq_len - P}")
    if not fixes:
      fixes.append(f"shorten the prompt and lower --max-new-tokens so that their sum is at "
                   f"most {seq_len}")
    raise SampleError(
        f"the prompt is {P} tokens and --max-new-tokens {max_new_tokens}: {P + max_new_tokens} "
        f"positions, more than the run's seq_len {seq_len} (the KV cache holds {seq_len}); "
        + " or ".join(fixes))
  return ids, max_new_tokens


def check(req: Request) -> None:
  """Refuses a request that cannot be met, before any file is read.

  Raises:
    SampleError: bad sampling rule (:meth:`Sampling.check`), max_new_tokens < 1,
      num_samples < 1, a negative seed.
  """
  req.rule.check()
  if req.max_new_tokens is not None and req.max_new_tokens < 1:
    raise SampleError(f"--max-new-tokens {req.max_new_tokens} must be ≥ 1")
  if req.num_samples < 1:
    raise SampleError(f"--num-samples {req.num_samples} must be ≥ 1")
  if not 0 <= req.seed < 2 ** 32:
    raise SampleError(f"--seed {req.seed} must be in [0, 2^32)")


def sample(workdir, req: Request) -> Result:
  """Continues ``req.prompt`` with a run's checkpoint.

  Args:
    workdir: the run directory.
    req: the request.
  Returns:
    a :class:`Result`; each text is the prompt followed by its continuation, EOS dropped.
  Raises:
    SampleError: see :func:`check` and :func:`prompt_ids`; a tokenizer with more ids than the
      model's vocab_size.
    ExportError: not a run, no checkpoint (at ``step``), a bad ``trial``, the run's tokenizer
      found nowhere or ``tokenizer_path`` not the run's.
    TokenizerError: ``tokenizer_path`` is missing or not a tokenizer.json.
    PathError: a gs:// run whose storage does not answer, or fails while it is read.
  """
  check(req)
  workdir = paths_lib.resolved(workdir)  # local, or gs://bucket/...
  paths_lib.check_reachable(workdir, "run directory")
  with paths_lib.storage_failures(f"reading the run {workdir}", workdir):
    run = export_lib.load_run(workdir)
    tok = tokenizer_of(workdir, run, req.tokenizer_path)
    cfg = model_config(run, tok.eos_id)
    if tok.vocab_size > cfg.vocab_size:
      raise SampleError(f"the tokenizer has {tok.vocab_size} ids but the run's model has "
                        f"vocab_size={cfg.vocab_size}; it is not the run's tokenizer")
    seq_len = int(run["config"]["train"]["seq_len"])
    ids, n_new = prompt_ids(tok, req.prompt, seq_len, req.max_new_tokens)
    params, step = export_lib.load_params(workdir, req.step)
    params, trial = export_lib.pick_trial(params, run, workdir, req.trial)
  model = build_model(params, cfg)
  rule = dataclasses.replace(req.rule, vocab=tok.vocab_size)
  prompt_BP = np.broadcast_to(ids, (req.num_samples, ids.size))
  gen = generate_lib.generate(model, prompt_BP, max_new_tokens=n_new, rule=rule, seed=req.seed,
                              eos_id=tok.eos_id, use_cache=req.use_cache, positions=seq_len)
  texts = [tok.decode(np.concatenate([ids, new])).decode("utf-8", errors="replace")
           for new in gen.tokens]
  pre, suf = getattr(tok, "prefix_ids", ()), getattr(tok, "suffix_ids", ())
  added = tok.added_description().split(" each text")[0] if pre or suf else ""
  return Result(texts, gen, int(ids.size), step, trial, added)
