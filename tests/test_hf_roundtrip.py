"""The HF round trip as a user who moves models both ways runs it: a padded vocabulary that
``generate`` decodes as ``chinchax sample`` does, an HF directory converted bitwise
(``export --from-hf``), and a tokenizer that adds BOS kept as BOS end to end.

The references are the real libraries on local files: ``tokenizers`` always (a Llama-style
tokenizer built here, its ids with ``add_special_tokens=True``), the export's float64 numpy
forward, and transformers' ``AutoTokenizer`` / ``generate`` where transformers and torch are
installed (CI has neither: those checks are skipped there).
"""

import json

import jax
import ml_dtypes
import numpy as np
import pytest

tk = pytest.importorskip("tokenizers")
st = pytest.importorskip("safetensors.numpy")

from test_hf_import import _config, _hand_config, _hand_tensors, _write_hf  # noqa: E402

from chinchax import cli  # noqa: E402
from chinchax import train as train_lib  # noqa: E402
from chinchax.data import tokenizers as tokenizers_lib  # noqa: E402
from chinchax.export import hf_source  # noqa: E402
from chinchax.export import writer as export  # noqa: E402
from chinchax.sample import run as run_lib  # noqa: E402
from chinchax.sample import strategies  # noqa: E402
from chinchax.train import spec as spec_lib  # noqa: E402
from chinchax.train.rundata import prepare_data  # noqa: E402

PROMPTS = ("def main(", "import os\n", "class A:", " x = 1", "# ", "return ")
N_NEW = 10


def _transformers():
  try:
    import torch
    import transformers
  except ImportError:
    return None
  return transformers, torch


def _llama_tokenizer(path):
  """A Llama-style tokenizer.json: <unk> 0, <s> 1, </s> 2, then GPT-2's 256 byte symbols
  (a byte-level BPE without merges), and a TemplateProcessing post-processor that puts <s>
  before every text; tokenizer_config.json names <s> BOS and </s> EOS."""
  from chinchax.export import tokenizer_files
  vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
  vocab.update({s: 3 + b for b, s in tokenizer_files.byte_symbols().items()})
  tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
  tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = tk.decoders.ByteLevel()
  tok.add_special_tokens([tk.AddedToken(t, special=True, normalized=False)
                          for t in ("<unk>", "<s>", "</s>")])
  tok.post_processor = tk.processors.TemplateProcessing(
      single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
  tok.save(str(path / "tokenizer.json"))
  (path / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
       "unk_token": "<unk>"}))
  return path / "tokenizer.json"


def _greedy_numpy(out, prompt_ids, n, suppress=True):
  """Greedy decoding with the export's float64 numpy forward, as generate decodes: the ids of
  generation_config.json's suppress_tokens at -inf (``suppress``), stopping at EOS."""
  config = json.loads((out / "config.json").read_text())
  gen = json.loads((out / "generation_config.json").read_text())
  tensors = st.load_file(str(out / "model.safetensors"))
  ids, new = list(prompt_ids), []
  for _ in range(n):
    logits = export.numpy_forward(tensors, config, np.asarray([ids + new]))[0, -1]
    if suppress:
      logits[gen.get("suppress_tokens", [])] = -np.inf
    new.append(int(np.argmax(logits)))
    if new[-1] == gen["eos_token_id"]:
      break
  return new


def _generate(out, prompt):
  """transformers' greedy generate on the export, with no option but the token count."""
  transformers, torch = _transformers()
  tok = transformers.AutoTokenizer.from_pretrained(str(out))
  model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
  ids = tok(prompt, return_tensors="pt")
  with torch.no_grad():
    gen = model.generate(**ids, do_sample=False, max_new_tokens=N_NEW)
  return gen[0, ids["input_ids"].shape[1]:].tolist()


def _sample(workdir, prompt):
  req = run_lib.Request(prompt=prompt, max_new_tokens=N_NEW, rule=strategies.Sampling(0.0))
  return run_lib.sample(workdir, req)


def _train(c):
  train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  return c.workdir


@pytest.fixture(scope="module")
def padded_runs(small_corpus, tmp_path_factory):
  """Two runs whose model has 320 rows over the 257-id byte tokenizer: one started from an HF
  Llama (random, padded to 320 rows), one trained with model.vocab_size=320; 2 steps each."""
  root = tmp_path_factory.mktemp("padded")
  hf = _write_hf(root / "hf", _hand_tensors(V=320), _hand_config(V=320))
  imported = _config(small_corpus, root / "stores", root / "imported", init_from=f"hf:{hf}")
  trained = _config(small_corpus, root / "stores", root / "trained")
  trained.model.update(d_model=32, n_layers=2, n_heads=4, d_ff=64, vocab_size=320)
  return {"import": _train(imported), "trained": _train(trained)}


@pytest.mark.parametrize("which", ["import", "trained"])
def test_a_padded_vocabulary_is_suppressed_so_generate_decodes_as_sample(which, padded_runs,
                                                                         tmp_path, capsys):
  workdir = padded_runs[which]
  out = tmp_path / "hf"
  assert cli.main(["export", workdir, "--out", str(out)]) == 0
  said = capsys.readouterr().out
  assert "320 rows and the tokenizer 257 ids" in said and "suppress_tokens" in said
  gen = json.loads((out / "generation_config.json").read_text())
  assert gen["suppress_tokens"] == list(range(257, 320))
  assert "ids 257-319 listed in generation_config.json's suppress_tokens" in json.loads(
      (out / "export_info.json").read_text())["generate"]
  # The tensors keep every row (the model's own softmax; a conversion stays bitwise).
  assert st.load_file(str(out / "model.safetensors"))["model.embed_tokens.weight"].shape[0] == 320
  leaked = 0
  for prompt in PROMPTS[:3]:
    ours = _sample(workdir, prompt).generation.tokens[0].tolist()
    ids = list(prompt.encode())
    assert _greedy_numpy(out, ids, N_NEW) == ours, prompt
    leaked += _greedy_numpy(out, ids, N_NEW, suppress=False) != ours
    if _transformers():
      assert _generate(out, prompt) == ours, prompt
  if which == "import":  # random padded rows: without suppress_tokens the decodings differ
    assert leaked > 0


@pytest.mark.parametrize("dtype,shards", [("float32", 2), ("bfloat16", 1)])
def test_from_hf_converts_a_directory_bitwise(dtype, shards, tmp_path, capsys):
  """export --from-hf: every tensor written is the source's, bitwise and in its dtype; a BOS
  tokenizer and a padded vocabulary come through as an export writes them."""
  tensors = _hand_tensors(V=320, tied=dtype == "bfloat16")
  if dtype == "bfloat16":
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
  hf = _write_hf(tmp_path / "hf", tensors,
                 _hand_config(V=320, tied=dtype == "bfloat16", max_position_embeddings=128),
                 shards=shards)
  _llama_tokenizer(hf)
  out = tmp_path / "out"
  assert cli.main(["export", "--from-hf", str(hf), "--out", str(out)]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].endswith(f"{len(tensors)} tensors, each bitwise the source's"), lines
  back = st.load_file(str(out / "model.safetensors"))
  assert back.keys() == tensors.keys()
  for name, t in tensors.items():
    assert back[name].dtype == t.dtype and back[name].tobytes() == t.tobytes(), name
  info = json.loads((out / "export_info.json").read_text())
  assert info["bitwise_equal_to_source"] == len(tensors) and info["converted_from"] == str(hf)
  config = json.loads((out / "config.json").read_text())
  assert (config["vocab_size"], config["max_position_embeddings"], config["bos_token_id"],
          config["eos_token_id"]) == (320, 128, 1, 2)
  assert json.loads((out / "generation_config.json").read_text())["suppress_tokens"] == list(
      range(259, 320))
  # Converting the conversion gives the same tensors again; refusals are one line.
  assert cli.main(["export", "--from-hf", str(out), "--out", str(tmp_path / "again")]) == 0
  assert (tmp_path / "again" / "model.safetensors").read_bytes() == (
      out / "model.safetensors").read_bytes()
  capsys.readouterr()
  for argv, needle in [(["--from-hf", str(hf), "--out", str(hf)], "is the HF directory"),
                       (["--from-hf", str(hf)], "needs a local --out"),
                       (["--from-hf", str(hf), "--out", str(out)], "pass --overwrite"),
                       (["--from-hf", str(tmp_path), "--out", str(tmp_path / "x")],
                        "no config.json")]:
    assert cli.main(["export", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], (argv, err)


TEXTS = ("def f(x):\n\treturn x  # café", "日本語 🦙", "", " <s> literal </s>", "a")


def test_a_bos_tokenizer_keeps_its_bos_through_train_sample_and_export(small_corpus, tmp_path,
                                                                       capsys):
  short = tmp_path / "short"  # short documents: a batch holds many document boundaries
  short.mkdir()
  text = (small_corpus / sorted(p.name for p in small_corpus.iterdir())[0]).read_text()
  for i in range(200):
    (short / f"{i:03d}.txt").write_text(text[i * 40:i * 40 + 20 + i % 30])
  hf = _write_hf(tmp_path / "hf", _hand_tensors(V=320), _hand_config(V=320))
  path = _llama_tokenizer(hf)
  original = tk.Tokenizer.from_file(str(path))
  original.encode_special_tokens = True  # special tokens inside text are text (split_special_tokens)
  ours = tokenizers_lib.HFTokenizer.from_file(str(path), "</s>")
  assert (ours.prefix_ids, ours.suffix_ids, ours.bos_id, ours.bos_token) == ((1,), (), 1, "<s>")
  for text in TEXTS:
    want = original.encode(text, add_special_tokens=True).ids
    assert want[0] == 1
    assert ours.encode_prompt(text.encode()).tolist() == want, text
    # A document: the tokenizer's own ids, then the EOS the store appends.
    assert ours.encode(text.encode()).tolist() == want, text
  # Train from the directory: every document in the store starts with <s>.
  c = _config(short, tmp_path / "stores", tmp_path / "run", init_from=f"hf:{hf}")
  hf_source.open_source(c)  # as train does: the run takes the directory's tokenizer
  spec = spec_lib.resolve(c, 1)
  data = prepare_data(c, spec)
  _, batch = next(iter(data.batches.iterator(0, num_threads=1)))
  tokens = np.asarray(batch).ravel()
  after_eos = tokens[1:][tokens[:-1] == 2]
  assert after_eos.size > 0 and (after_eos == 1).all()
  _train(_config(short, tmp_path / "stores", tmp_path / "run", init_from=f"hf:{hf}"))
  out = tmp_path / "export"
  assert cli.main(["export", str(tmp_path / "run"), "--out", str(out)]) == 0
  files = {f: json.loads((out / f).read_text()) for f in
           ("config.json", "generation_config.json", "tokenizer_config.json", "export_info.json")}
  assert files["config.json"]["bos_token_id"] == files["generation_config.json"][
      "bos_token_id"] == 1
  assert files["config.json"]["eos_token_id"] == files["generation_config.json"][
      "eos_token_id"] == 2
  assert (files["tokenizer_config.json"]["bos_token"],
          files["tokenizer_config.json"]["eos_token"]) == ("<s>", "</s>")
  assert "<s> (id 1) before each text" in files["export_info.json"]["tokenizer"]["added_tokens"]
  exported = tk.Tokenizer.from_file(str(out / "tokenizer.json"))
  exported.encode_special_tokens = True
  hf_lib = _transformers()
  for text in TEXTS:
    assert exported.encode(text, add_special_tokens=True).ids == ours.encode_prompt(
        text.encode()).tolist()
    if hf_lib:  # (the original's tokenizer_config reads a literal <s> as BOS; the export's not)
      for d in (hf, out) if "<s>" not in text else (out,):
        auto = hf_lib[0].AutoTokenizer.from_pretrained(str(d))
        assert auto(text)["input_ids"] == ours.encode_prompt(text.encode()).tolist(), (d, text)
  for prompt in PROMPTS[:3]:
    res = _sample(str(tmp_path / "run"), prompt)
    ids = ours.encode_prompt(prompt.encode()).tolist()
    assert res.prompt_tokens == len(ids) and ids[0] == 1
    new = res.generation.tokens[0].tolist()
    assert _greedy_numpy(out, ids, N_NEW) == new, prompt
    if hf_lib:
      assert _generate(out, prompt) == new, prompt
