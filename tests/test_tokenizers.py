"""Tokenizers: trained byte-level BPE, tokenizer.json from disk, vocab size, bad tokenizer input."""

import json
import math
import pathlib

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")

from chinchax import checkpoint as checkpoint_lib  # noqa: E402
from chinchax import cli  # noqa: E402
from chinchax import config as config_lib  # noqa: E402
from chinchax import train as train_lib  # noqa: E402
from chinchax.data import builder, sources, store, tokenizers  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3,
         "Pack my box with five dozen liquor jugs! Ünïcödé — ok 🙂",
         "def f(x):\n    return x ** 2\n"] * 40


def _cfg(**data):
  c = config_lib.get_variant("tiny")
  c.data.update(**data)
  return c


def test_bpe_is_byte_level_deterministic_and_of_the_asked_size(tmp_path):
  a = tokenizers.train_bpe(iter(TEXTS), 300)
  b = tokenizers.train_bpe(iter(TEXTS), 300)
  assert a.digest == b.digest and a.vocab_size == 300 and a.eos_id == 0
  for text in TEXTS[:3] + ["never seen: ζ∂ƒ 漢字 \x00\t\r\n"]:
    ids = a.encode(text.encode())
    assert ids.dtype == np.uint16 and ids.max() < 300
    assert a.decode(ids) == text.encode()  # byte-level: any text round-trips
  a.save(tmp_path)
  c = tokenizers.HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
  assert c.digest == a.digest and c.eos_id == 0


def test_trained_bpe_is_saved_beside_the_store_and_reused(small_corpus, tmp_path):
  src = sources.FileSource(str(small_corpus / "*.txt"))
  d = builder.build(src, tokenizers.BPESpec(320), str(tmp_path), 0.1)
  m = json.loads((d / "manifest.json").read_text())
  assert m["tokenizer"]["kind"] == "bpe" and m["tokenizer"]["vocab_size"] == 320
  saved = list((tmp_path / "tokenizers").glob("bpe320-*.json"))
  assert len(saved) == 1 and (d / "tokenizer.json").read_text() == saved[0].read_text()
  assert m["tokenizer"]["sha256"] == tokenizers.load_saved(d, m["tokenizer"]).digest
  # Fewer bytes per token than the byte tokenizer, same validation documents and bytes.
  db = builder.build(src, tokenizers.ByteTokenizer(), str(tmp_path), 0.1)
  mb = json.loads((db / "manifest.json").read_text())
  assert m["splits"]["val"]["bytes"] == mb["splits"]["val"]["bytes"]
  assert m["splits"]["val"]["documents"] == mb["splits"]["val"]["documents"]
  assert m["splits"]["train"]["tokens"] < 0.7 * mb["splits"]["train"]["tokens"]
  t0 = saved[0].stat().st_mtime_ns
  builder.build(src, tokenizers.BPESpec(320), str(tmp_path), 0.1)
  assert saved[0].stat().st_mtime_ns == t0


def test_vocab_size_follows_the_tokenizer(tmp_path):
  tok = tokenizers.train_bpe(iter(TEXTS), 300)
  tok.save(tmp_path)
  path = str(tmp_path / "tokenizer.json")
  assert train_lib.resolve(_cfg(tokenizer="hf", tokenizer_path=path), 8, "cpu").model.vocab_size == 300
  assert train_lib.resolve(_cfg(tokenizer="hf", tokenizer_path=path), 8, "gpu").model.vocab_size == 384
  assert train_lib.resolve(_cfg(tokenizer="bpe", bpe_vocab_size=1000), 8, "cpu").model.vocab_size == 1000
  assert train_lib.resolve(_cfg(), 8, "cpu").model.vocab_size == 257
  c = _cfg(tokenizer="hf", tokenizer_path=path)
  c.model.vocab_size = 200
  with pytest.raises(config_lib.ConfigError, match="model.vocab_size=200 is smaller"):
    train_lib.resolve(c, 8, "cpu")


def test_missing_corrupt_or_eos_less_tokenizer_files(tmp_path, capsys):
  with pytest.raises(tokenizers.TokenizerError, match="nope.json' does not exist"):
    tokenizers.make_tokenizer(_cfg(tokenizer="hf", tokenizer_path=str(tmp_path / "nope.json")).data)
  (tmp_path / "garbage.json").write_text("{not json")
  with pytest.raises(tokenizers.TokenizerError, match="garbage.json' is not a valid HF tokenizers"):
    tokenizers.HFTokenizer.from_file(str(tmp_path / "garbage.json"))
  (tmp_path / "other.json").write_text(json.dumps({"model": {"type": "nothing"}}))
  with pytest.raises(tokenizers.TokenizerError, match="is not a valid HF tokenizers"):
    tokenizers.HFTokenizer.from_file(str(tmp_path / "other.json"))
  tk = pytest.importorskip("tokenizers")
  t = tk.Tokenizer(tk.models.WordLevel({"a": 0, "b": 1, "[UNK]": 2, "[END]": 3}, unk_token="[UNK]"))
  t.save(str(tmp_path / "wl.json"))
  with pytest.raises(tokenizers.TokenizerError, match="none of the EOS tokens.*data.eos_token"):
    tokenizers.HFTokenizer.from_file(str(tmp_path / "wl.json"))
  assert tokenizers.HFTokenizer.from_file(str(tmp_path / "wl.json"), "[END]").eos_id == 3
  # The commands stop with one error line before reading data or building anything.
  for verb in ("train", "prepare"):
    rc = cli.main([verb, f"--config={REPO}/configs/train.py:tiny", "--config.mesh.num_cpu_devices=0",
                   f"--config.workdir={tmp_path}/run", f"--config.data.store_root={tmp_path}/s",
                   "--config.data.tokenizer=hf", f"--config.data.tokenizer_path={tmp_path}/garbage.json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: tokenizer file") and "garbage.json" in err[-1]
    assert not (tmp_path / "s").exists() and not (tmp_path / "run").exists()
  rc = cli.main(["train", "--config.data.tokenizer=hf", "--config.mesh.num_cpu_devices=0"])
  assert rc == 2 and "needs data.tokenizer_path" in capsys.readouterr().err


def test_training_on_bpe_reports_bits_per_byte(bpe_run):
  """Acceptance 4: a BPE run logs bits/byte next to loss, from the split's tokens and bytes."""
  c, summary = bpe_run
  assert summary["tokenizer"] == "bpe512" and summary["steps"] == 10
  d = pathlib.Path(summary["store"])
  m = json.loads((d / "manifest.json").read_text())
  val, train = m["splits"]["val"], m["splits"]["train"]
  bpb = summary["final_eval_loss"] * val["tokens"] / (val["bytes"] * math.log(2))
  assert summary["final_eval_bits_per_byte"] == pytest.approx(bpb)
  assert 0.5 < summary["final_eval_bits_per_byte"] < 8.0  # better than uniform random bytes
  rows = [json.loads(l) for l in (pathlib.Path(c.workdir) / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [5, 10]
  for r in rows:
    assert r["bits_per_byte"] == pytest.approx(r["loss"] * train["tokens"] / (train["bytes"] * math.log(2)))
    assert r["eval_bits_per_byte"] == pytest.approx(store.bits_per_byte(r["eval_loss"], val["tokens"], val["bytes"]))
  # The byte store of the same corpus holds out exactly the same text: bits/byte compare directly.
  src = sources.make_source(c.data)
  db = builder.build(src, tokenizers.ByteTokenizer(), c.data.store_root, c.data.val_fraction)
  assert json.loads((db / "manifest.json").read_text())["splits"]["val"]["bytes"] == val["bytes"]


def test_resume_with_another_tokenizer_is_refused(bpe_run, capsys):
  """Acceptance 7: a restored checkpoint's vocab size must match the tokenizer's."""
  c, _ = bpe_run
  other = c.copy_and_resolve_references()
  other.data.tokenizer = "bytes"
  stores_before = sorted(pathlib.Path(c.data.store_root).iterdir())
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"vocab_size=512 \(tokenizer 'bpe'\).*'bytes'.*vocab_size=257"):
    train_lib.train(other, devices=jax.devices()[:1], verbose=False)
  assert sorted(pathlib.Path(c.data.store_root).iterdir()) == stores_before  # refused before data
  other.data.tokenizer = "bpe"
  other.data.bpe_vocab_size = 1024
  with pytest.raises(checkpoint_lib.CheckpointError, match="vocab_size=1024"):
    train_lib.train(other, devices=jax.devices()[:1], verbose=False)


def test_special_tokens_inside_text_stay_text(tmp_path):
  """A literal <|endoftext|> in a document is its characters, not EOS (BPE and tokenizer.json)."""
  a = tokenizers.train_bpe(iter(TEXTS), 300)
  a.save(tmp_path)
  for tok in (a, tokenizers.HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))):
    text = "before <|endoftext|> after".encode()
    ids = tok.encode(text)
    assert tok.eos_id not in ids.tolist() and len(ids) > 3
    assert tok.decode(ids) == text
    assert tok.encode_batch([text])[0].tolist() == ids.tolist()


def test_bpe_training_off_a_terminal_prints_lines_not_a_blank_bar(tmp_path):
  """Written to a log (stderr not a terminal), BPE training reports in lines: what it read,
  and the vocabulary it ended with; the trainer's bar (blank lines off a terminal) is off."""
  import subprocess
  import sys
  (tmp_path / "texts.json").write_text(json.dumps(TEXTS))
  code = ("import json, sys; from chinchax.data import tokenizers as t; "
          "t.train_bpe(iter(json.load(open(sys.argv[1]))), 300, progress=True)")
  log = tmp_path / "log"
  with open(log, "w") as f:
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "texts.json")], stderr=f,
                   check=True, cwd=REPO)
  lines = log.read_text().splitlines()
  assert lines and all(line.strip() for line in lines), lines
  assert lines[-2].startswith(f"bpe: read all {len(TEXTS)} documents") and \
      lines[-2].endswith("counting merges"), lines
  assert lines[-1].startswith("bpe: 300 tokens in"), lines
