"""prepare says when a split of the store it built is empty (train would refuse the store)."""

from chinchax import cli


def test_a_one_document_corpus_is_warned_about(tmp_path, capsys):
  (tmp_path / "a.txt").write_text("hello world " * 500)
  assert cli.main(["prepare", "--config.data.source=files", f"--config.data.paths={tmp_path}/*.txt",
                   f"--config.data.store_root={tmp_path / 'stores'}"]) == 0
  err = capsys.readouterr().err
  assert "warning: the validation split is empty (1 train, 0 val documents)" in err, err


def test_a_corpus_with_both_splits_is_not(tmp_path, capsys):
  for i in range(60):
    (tmp_path / f"{i}.txt").write_text(f"document {i} " * 50)
  assert cli.main(["prepare", "--config.data.source=files", f"--config.data.paths={tmp_path}/*.txt",
                   f"--config.data.store_root={tmp_path / 'stores'}"]) == 0
  assert "split is empty" not in capsys.readouterr().err
