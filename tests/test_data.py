"""Token store and grain pipeline: content, splits, purity in (seed, step), refusals."""

import json

import numpy as np
import pytest

from chinchax.data import builder, pipeline, sources, store, tokenizers


def _store(corpus, root, val_fraction=0.1):
  src = sources.FileSource(str(corpus / "*.txt"))
  return src, builder.build(src, tokenizers.ByteTokenizer(), str(root), val_fraction)


def test_store_round_trips_documents(small_corpus, tmp_path):
  src, d = _store(small_corpus, tmp_path)
  manifest = json.loads((d / "manifest.json").read_text())
  docs = dict(src)
  assert manifest["fingerprint"] == sources.fingerprint(src)
  assert manifest["tokenizer"]["vocab_size"] == 257
  total_docs = manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"]
  assert total_docs == len(docs)
  assert manifest["splits"]["val"]["documents"] >= 1
  # Every document decodes back byte-exactly from its start offset, followed by EOS.
  tok = tokenizers.ByteTokenizer()
  seen = 0
  for split in ("train", "val"):
    ts_split = store.TokenSplit(d, split)
    starts = np.load(d / f"{split}_docs.npy")
    ends = list(starts[1:]) + [ts_split.n_tokens]
    texts = set()
    for s, e in zip(starts, ends):
      ids = ts_split.read(int(s), int(e - s))
      assert ids[-1] == tok.eos_id
      texts.add(tok.decode(ids[:-1]))
    assert texts <= set(docs.values())
    seen += len(texts)
    assert ts_split.n_bytes == sum(len(docs[k]) for k in docs if docs[k] in texts)
  assert seen == len(set(docs.values()))


def test_store_is_reused_and_no_partial_dir_left(small_corpus, tmp_path):
  _, d1 = _store(small_corpus, tmp_path)
  mtime = (d1 / "manifest.json").stat().st_mtime_ns
  _, d2 = _store(small_corpus, tmp_path)
  assert d1 == d2 and (d2 / "manifest.json").stat().st_mtime_ns == mtime
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_batches_are_a_pure_function_of_seed_and_step(small_corpus, tmp_path):
  _, d = _store(small_corpus, tmp_path)
  split = store.TokenSplit(d, "train")
  a = pipeline.TrainBatches(split, 32, 8, steps=50, seed=3)
  b = pipeline.TrainBatches(split, 32, 8, steps=50, seed=3)
  c = pipeline.TrainBatches(split, 32, 8, steps=50, seed=4)
  np.testing.assert_array_equal(a.batch(17), b.batch(17))  # fresh instance, no history
  assert not np.array_equal(a.batch(17), c.batch(17))
  assert a.batch(17).shape == (8, 33) and a.batch(17).dtype == np.int32
  # Window i holds tokens [i*seq_len, i*seq_len + seq_len + 1).
  w = a.window_ids(5)
  np.testing.assert_array_equal(a.batch(5)[2], split.read(w[2] * 32, 33))
  # Iterator from a later step gives the same batches as random access.
  it = a.iterator(start_step=40)
  for _ in range(3):
    step, batch = next(it)
    np.testing.assert_array_equal(batch, a.batch(step))
  # A process reading rows [4, 8) sees exactly those rows of the global batch.
  half = pipeline.TrainBatches(split, 32, 8, steps=50, seed=3, rows=(4, 8))
  np.testing.assert_array_equal(half.batch(9), a.batch(9)[4:8])


def test_one_epoch_has_no_repeats(small_corpus, tmp_path):
  _, d = _store(small_corpus, tmp_path)
  split = store.TokenSplit(d, "train")
  n_windows = (split.n_tokens - 1) // 64
  steps = n_windows // 16
  tb = pipeline.TrainBatches(split, 64, 16, steps=steps, seed=0)
  ids = [i for s in range(steps) for i in tb.window_ids(s)]
  assert len(ids) == len(set(ids)) == steps * 16


def test_repetition_is_refused_with_epoch_count(small_corpus, tmp_path):
  _, d = _store(small_corpus, tmp_path)
  split = store.TokenSplit(d, "train")
  n_windows = (split.n_tokens - 1) // 32
  steps = int(2.5 * n_windows / 8)
  with pytest.raises(sources.DataError, match=r"2\.\d\d epochs.*allow_repeat"):
    pipeline.TrainBatches(split, 32, 8, steps=steps, seed=0)
  tb = pipeline.TrainBatches(split, 32, 8, steps=steps, seed=0, allow_repeat=True)
  assert tb.plan.epochs > 2
  # Epochs use different permutations.
  per_epoch = n_windows // 8
  assert tb.window_ids(0) != tb.window_ids(per_epoch) or n_windows % 8


def test_corpus_smaller_than_one_batch(tmp_path):
  (tmp_path / "a.txt").write_text("tiny corpus " * 20)
  (tmp_path / "b.txt").write_text("another one " * 20)
  src = sources.FileSource(str(tmp_path / "*.txt"))
  d = builder.build(src, tokenizers.ByteTokenizer(), str(tmp_path / "s"), 0.5)
  with pytest.raises(sources.DataError, match="fewer than one batch of global_batch_size=64"):
    pipeline.TrainBatches(store.TokenSplit(d, "train"), 32, 64, steps=1, seed=0)


def test_missing_glob_and_empty_corpus(tmp_path):
  with pytest.raises(sources.DataError, match="matches no file"):
    sources.FileSource(str(tmp_path / "nothing" / "*.txt"))
  (tmp_path / "empty.txt").write_bytes(b"")
  src = sources.FileSource(str(tmp_path / "*.txt"))
  with pytest.raises(sources.DataError, match="no non-empty document"):
    builder.build(src, tokenizers.ByteTokenizer(), str(tmp_path / "s"), 0.1)
  assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())


def test_jsonl_text_field(tmp_path):
  rows = [{"body": f"document number {i} " * 10, "id": i} for i in range(30)]
  (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  src = sources.FileSource(str(tmp_path / "c.jsonl"), text_field="body")
  docs = [t for _, t in src]
  assert docs == [r["body"].encode() for r in rows]
  with pytest.raises(sources.DataError, match="has no field 'text'"):
    list(sources.FileSource(str(tmp_path / "c.jsonl"), text_field="text"))


def test_unigram_entropy_and_bits_per_byte():
  tokens = np.array([0, 1, 0, 1], dtype=np.uint16)
  assert store.unigram_entropy_nats(tokens, 257) == pytest.approx(np.log(2))
  assert store.bits_per_byte(np.log(2), 4, 4) == pytest.approx(1.0)


def test_stdlib_source_is_sorted_real_python():
  src = sources.StdlibSource()
  names = [f.relative_to(src.root).as_posix() for f in src.files]
  assert names == sorted(names) or [str(f) for f in src.files] == sorted(str(f) for f in src.files)
  assert any(n.endswith("os.py") for n in names)
  assert not any("site-packages" in n for n in names)


def test_stdlib_source_lists_every_stdlib_file_once():
  # The corpus (so every store's fingerprint) is defined as every *.py under the stdlib root
  # outside third-party trees; the source walks it without entering those trees.
  src = sources.StdlibSource()
  expected = sorted(f for f in src.root.rglob("*.py") if f.is_file()
                    and not {"site-packages", "dist-packages"} & set(f.relative_to(src.root).parts))
  assert src.files == expected


def test_txt_documents_paragraph_and_line(tmp_path):
  (tmp_path / "one.txt").write_bytes(b"First para\nstill first.\n\n\nSecond para.\r\n  \r\nThird.\n")
  by_file = [d for _, d in sources.FileSource(str(tmp_path / "one.txt"))]
  by_para = [d for _, d in sources.FileSource(str(tmp_path / "one.txt"), txt_documents="paragraph")]
  by_line = [d for _, d in sources.FileSource(str(tmp_path / "one.txt"), txt_documents="line")]
  assert len(by_file) == 1
  assert by_para == [b"First para\nstill first.", b"Second para.", b"Third.\n"]
  assert [l.strip() for l in by_line] == [b"First para", b"still first.", b"Second para.", b"Third."]
  with pytest.raises(sources.DataError, match="data.txt_documents='words'"):
    sources.FileSource(str(tmp_path / "one.txt"), txt_documents="words")
