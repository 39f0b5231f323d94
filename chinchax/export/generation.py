"""generation_config.json of an export: ``transformers``' ``generate`` decodes as ``chinchax sample``.

**Special ids.** ``bos_token_id`` is the tokenizer's BOS (the token it adds before each text,
else EOS's; :class:`chinchax.export.tokenizer_files.ExportTokenizer`), ``eos_token_id`` and
``pad_token_id`` its EOS.

**A padded vocabulary.** A model may have more rows than its tokenizer has ids (``vocab_size``
set past the tokenizer's, or an imported HF checkpoint whose embedding was padded to a multiple
of 64): ``chinchax sample`` never chooses an id the tokenizer lacks
(:mod:`chinchax.sample.strategies`), and neither must ``generate``. The export keeps every row
(the tensors stay the checkpoint's, bitwise, and the logits' softmax the one the model was
trained with) and lists the ids ≥ the tokenizer's in ``suppress_tokens``, which ``generate``
applies before any other rule (transformers' ``SuppressTokensLogitsProcessor``: their logits
become −inf), greedy or sampling alike. export_info.json records it under ``generate``.
"""

from __future__ import annotations


def generation_config(tok, vocab_size: int) -> tuple[dict, str]:
  """(generation_config.json, a line saying what it does about a padded vocabulary, or "").

  Args:
    tok: the :class:`chinchax.export.tokenizer_files.ExportTokenizer` the export ships.
    vocab_size: the model's rows (V ≥ the tokenizer's vocab_size).
  """
  n_tok = int(tok.tokenizer.vocab_size)
  out = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.eos_id}
  if n_tok >= vocab_size:
    return out, ""
  out["suppress_tokens"] = list(range(n_tok, vocab_size))
  note = (f"the model has {vocab_size} rows and the tokenizer {n_tok} ids: all rows kept, ids "
          f"{n_tok}-{vocab_size - 1} listed in generation_config.json's suppress_tokens, so "
          f"generate never picks them (as chinchax sample)")
  return out, note
