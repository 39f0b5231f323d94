"""chinchax sample: decoding over the KV cache equals recomputing the full forward pass each token,
the sampling rules do what they say, and the command line takes a run and bad input as it should."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from chinchax import cli
from chinchax import config as config_lib
from chinchax.export import writer as export
from chinchax.model import transformer as model_lib
from chinchax.data import tokenizers as tokenizers_lib
from chinchax.sample import generate as generate_lib
from chinchax.sample import run as run_lib
from chinchax.sample import strategies
from chinchax.sample.error import SampleError

GREEDY = strategies.Sampling(temperature=0.0)


def _model(**kw):
  """A random model with large weights (attention far from uniform: a wrong cache would show)."""
  cfg = model_lib.ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                              init_std=0.3, **kw)
  return model_lib.Transformer(cfg, nnx.Rngs(params=0))


def _greedy_by_full_forward(model, prompt_BP, n: int) -> np.ndarray:
  """The reference: model(all tokens so far) recomputed for every new token, argmax of the last.

  One jitted full forward over a fixed (B, P + n) buffer (one compile, not one eager op-by-op
  pass per length): the positions after the last token hold zeros, which the causal attention
  keeps from its logits (a leak from the future would show as a mismatch with the cache).
  """
  graphdef, state = nnx.split(model)
  forward = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
  B, P = np.shape(prompt_BP)
  tokens_BL = np.zeros((B, P + n), np.int32)
  tokens_BL[:, :P] = prompt_BP
  for i in range(n):
    logits_BV = np.asarray(forward(state, jnp.asarray(tokens_BL)))[:, P + i - 1]
    tokens_BL[:, P + i] = logits_BV.argmax(-1)
  return tokens_BL[:, P:]


@pytest.mark.parametrize("kw", [{}, {"scan_layers": True}, {"tie_embeddings": False},
                                {"document_mask": True, "eos_id": 3}],
                         ids=["plain", "scan_layers", "untied", "document_mask"])
def test_greedy_with_the_cache_equals_the_full_forward_each_token(kw):
  model = _model(**kw)
  # Token 3 (the document mask's EOS) inside the prompt: a new document starts after it.
  prompt = np.array([[5, 3, 7, 9, 3, 11], [1, 2, 3, 4, 5, 6]])
  got = generate_lib.generate(model, prompt, max_new_tokens=12, rule=GREEDY, eos_id=3,
                              stop_at_eos=False, positions=24)
  want = _greedy_by_full_forward(model, prompt, 12)
  np.testing.assert_array_equal(np.stack(got.tokens), want)
  if kw.get("document_mask"):  # the mask matters for this prompt: the test can tell
    unmasked = _model()
    assert not np.allclose(np.asarray(unmasked(jnp.asarray(prompt))),
                           np.asarray(model(jnp.asarray(prompt))), atol=1e-3)


def test_many_prompt_lengths_compile_a_few_programs_and_decode_as_the_full_forward():
  """A long-lived process: 30 calls over 15 prompt lengths (1…47 tokens, a 64-position cache)
  compile one prefill per bucket (16, 32, 64) and one decode loop, counted by JAX's own
  compile events; each greedy continuation equals recomputing model(tokens) for every token,
  document mask included (padding is never a document's EOS)."""
  from jax import monitoring

  model = _model(document_mask=True, eos_id=3)
  generate_lib._COMPILED.clear()
  compiles = []
  monitoring.register_event_duration_secs_listener(
      lambda name, _s, **_k: compiles.append(name)
      if name == "/jax/core/compile/backend_compile_duration" else None)
  rng = np.random.default_rng(0)
  lengths = [int(p) for p in np.linspace(1, 47, 15).round()] * 2
  ours, during = 0, []  # our counter; JAX's compile events during each generate call
  for k, P in enumerate(lengths):
    prompt = rng.integers(0, 61, size=(2, P))
    prompt[:, P // 2] = 3  # an EOS inside the prompt: a new document starts after it
    before = len(compiles)
    got = generate_lib.generate(model, prompt, max_new_tokens=6, rule=GREEDY, eos_id=3,
                                stop_at_eos=False, positions=64)
    during.append(len(compiles) - before)
    ours += got.compiled
    if k % 4 == 0:
      np.testing.assert_array_equal(np.stack(got.tokens), _greedy_by_full_forward(model, prompt, 6))
  assert sorted({generate_lib.bucket(P, 64) for P in lengths}) == [16, 32, 64]
  assert ours == 4  # three prefills and one decode loop
  assert sum(during) <= 6, during  # JAX's count: those, and at most a PRNG seed's program
  assert sum(during[len(lengths) // 2:]) == 0, during  # the second pass compiles nothing


def test_without_the_cache_and_stopping_at_eos():
  """The uncached loop draws the same tokens; a sequence stops at its first EOS (kept)."""
  model = _model()
  prompt = np.array([[5, 8, 7, 9]])
  want = _greedy_by_full_forward(model, prompt, 10)[0]
  eos = int(want[4])  # make the 5th greedy token the EOS
  cached = generate_lib.generate(model, prompt, max_new_tokens=10, rule=GREEDY, eos_id=eos)
  uncached = generate_lib.generate(model, prompt, max_new_tokens=10, rule=GREEDY, eos_id=eos,
                                   use_cache=False)
  first = int(np.flatnonzero(want == eos)[0])
  for g in (cached, uncached):
    np.testing.assert_array_equal(g.tokens[0], want[:first + 1])
    assert g.stopped_at_eos == [True]


def test_top_k_1_is_greedy_and_a_seed_repeats():
  model = _model()
  prompt = np.array([[5, 8, 7, 9]] * 3)
  greedy = np.stack(generate_lib.generate(model, prompt, max_new_tokens=16, rule=GREEDY).tokens)
  top1 = generate_lib.generate(model, prompt, max_new_tokens=16, seed=7,
                               rule=strategies.Sampling(temperature=1.5, top_k=1))
  np.testing.assert_array_equal(np.stack(top1.tokens), greedy)
  hot = strategies.Sampling(temperature=2.0, top_p=0.95)
  a, b, c = (np.stack(generate_lib.generate(model, prompt, max_new_tokens=16, rule=hot,
                                            seed=s).tokens) for s in (1, 1, 2))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  assert not np.array_equal(a[0], a[1])  # samples of one batch are drawn apart


def test_filters_keep_what_they_say():
  probs = np.array([[0.5, 0.3, 0.15, 0.05]])
  logits = jnp.asarray(np.log(probs), jnp.float32)
  kept = lambda **kw: np.isfinite(np.asarray(
      strategies.filtered_logits(logits, strategies.Sampling(**kw))))[0].tolist()
  assert kept(top_k=2) == [True, True, False, False]
  assert kept(top_p=0.7) == [True, True, False, False]  # 0.5 + 0.3 reaches 0.7
  assert kept(top_p=0.85) == [True, True, True, False]
  assert kept(top_p=0.1) == [True, False, False, False]  # the most likely always stays
  assert kept(vocab=3) == [True, True, True, False]  # ids the tokenizer lacks
  scaled = strategies.filtered_logits(logits, strategies.Sampling(temperature=0.5))
  np.testing.assert_allclose(np.asarray(scaled), np.log(probs) / 0.5, rtol=1e-6)
  draws = jax.vmap(lambda k: strategies.choose(k, logits, strategies.Sampling(top_p=0.7)))(
      jax.random.split(jax.random.PRNGKey(0), 2000))
  freq = np.bincount(np.asarray(draws).ravel(), minlength=4) / 2000
  assert freq[2:].sum() == 0 and abs(freq[0] - 0.5 / 0.8) < 0.04  # renormalised over the kept


@pytest.fixture(scope="module")
def byte_run(small_corpus, tmp_path_factory):
  """A 4-step byte-level `tiny` run with scan_layers and the document mask (one device)."""
  from chinchax import train as train_lib
  root = tmp_path_factory.mktemp("byte_run")
  c = config_lib.get_variant("tiny")
  c.workdir = str(root / "run")
  c.data.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(root / "stores"),
                val_fraction=0.1)
  c.model.update(scan_layers=True, document_mask=True)
  c.budget.steps = 4
  c.train.update(eval_every=4, log_every=4, checkpoint_every=4)
  c.mesh.num_cpu_devices = 0
  train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  return c


def _run_cli(capsys, *argv):
  rc = cli.main(["sample", *argv])
  out, err = capsys.readouterr()
  return rc, out, err


def test_cli_greedy_text_of_a_byte_run_is_the_full_forward_greedy(byte_run, capsys):
  c = byte_run
  rc, out, err = _run_cli(capsys, c.workdir, "--prompt", "def f(x):", "--max-new-tokens", "12",
                          "--temperature", "0")
  assert rc == 0 and "KV cache" in err and "step 4" in err
  run = export.load_run(c.workdir)
  params, _ = export.load_params(c.workdir)
  model = run_lib.build_model(params, run_lib.model_config(run, eos_id=256))
  assert model.cfg.scan_layers and model.cfg.document_mask
  prompt = np.frombuffer(b"def f(x):", np.uint8).astype(np.int32)[None]
  new = _greedy_by_full_forward(model, prompt, 12)[0]
  new = new[:np.flatnonzero(new == 256)[0]] if (new == 256).any() else new
  text = (b"def f(x):" + bytes(new[new < 256].astype(np.uint8).tolist())).decode("utf-8", "replace")
  assert out == text + "\n"
  rc2, out2, err2 = _run_cli(capsys, c.workdir, "--prompt", "def f(x):", "--max-new-tokens", "12",
                             "--temperature", "0", "--no-cache")
  assert (rc2, out2) == (0, out) and "no cache" in err2


def test_cli_samples_a_bpe_run_from_a_prompt_file(bpe_run, tmp_path, capsys):
  c, _ = bpe_run
  prompt = tmp_path / "prompt.txt"
  prompt.write_text("import os\n")
  argv = (c.workdir, "--prompt-file", str(prompt), "--num-samples", "2", "--seed", "3",
          "--top-p", "0.9", "--top-k", "50", "--max-new-tokens", "8")
  rc, out, _ = _run_cli(capsys, *argv)
  assert rc == 0
  samples = out.rstrip("\n").split("\n" + "-" * 40 + "\n")
  assert len(samples) == 2 and all(s.startswith("import os\n") for s in samples)
  assert _run_cli(capsys, *argv)[1] == out  # the seed repeats


def test_bad_input_is_one_error_line(byte_run, tmp_path, capsys):
  c = byte_run
  cases = [
      ((str(tmp_path),), "not a chinchax run"),
      ((c.workdir, "--prompt", "x" * 30, "--max-new-tokens", "10"), "seq_len 32"),
      ((c.workdir, "--prompt", "x" * 32), "shorten it to at most 31 tokens"),
      ((c.workdir, "--top-p", "0"), "--top-p 0.0 must be in (0, 1]"),
      ((c.workdir, "--top-p", "1.5"), "--top-p 1.5 must be in (0, 1]"),
      ((c.workdir, "--temperature", "-1"), "--temperature -1.0 must be"),
      ((c.workdir, "--top-k", "-2"), "--top-k -2"),
      ((c.workdir, "--max-new-tokens", "0"), "--max-new-tokens 0 must be ≥ 1"),
      ((c.workdir, "--prompt", "a", "--prompt-file", "p.txt"), "not both"),
      ((c.workdir, "--prompt-file", str(tmp_path / "none.txt")), "cannot be read"),
      ((c.workdir, "--step", "999"), "no checkpoint at step 999"),
      ((c.workdir, "--trial", "1"), "not a trials run"),
  ]
  for argv, needle in cases:
    rc, out, err = _run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:"), (argv, err)
    assert needle in lines[0], (argv, lines[0])
    assert out == ""


@pytest.mark.parametrize("prompt,max_new,fix", [
    ("abc", 30, "shorten the prompt to at most 2 tokens or lower --max-new-tokens to at most 29"),
    ("abc", 100, "; lower --max-new-tokens to at most 29"),  # no prompt is short enough
    ("x" * 40, 5, "; shorten the prompt to at most 27 tokens"),  # no --max-new-tokens ≥ 1 fits
    ("x" * 40, 50, "shorten the prompt and lower --max-new-tokens so that their sum is at most 32"),
])
def test_a_request_past_seq_len_names_only_remedies_that_fit(prompt, max_new, fix):
  """Byte tokens, seq_len 32: the line never asks for a prompt of 0 tokens or 0 new tokens."""
  with pytest.raises(SampleError) as e:
    run_lib.prompt_ids(tokenizers_lib.ByteTokenizer(), prompt, 32, max_new)
  msg = str(e.value)
  assert msg.endswith(fix) and "at most 0" not in msg, msg


def test_help_imports_no_jax():
  code = ("import sys, contextlib, io\nfrom chinchax.cli import main\n"
          "with contextlib.redirect_stdout(io.StringIO()) as f: rc = main(['sample', '--help'])\n"
          "print(rc, sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))\n"
          "print('--top-p' in f.getvalue())")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                        timeout=120)
  assert proc.stdout.split("\n")[:2] == ["0 []", "True"], proc.stdout + proc.stderr


def test_a_trials_run_samples_its_best_trial_or_the_one_asked(small_corpus, tmp_path, capsys):
  from chinchax import train as train_lib
  c = config_lib.get_variant("tiny")
  c.workdir = str(tmp_path / "trials")
  c.data.update(source="files", paths=str(small_corpus / "*.txt"),
                store_root=str(tmp_path / "stores"), val_fraction=0.1)
  c.budget.steps = 4
  c.train.update(eval_every=4, log_every=4, checkpoint_every=4, lr_multipliers="0.5,8",
                 trial_batching="loop", progress=False)
  c.mesh.num_cpu_devices = 0
  best = train_lib.train(c, devices=jax.devices()[:1], verbose=False)["best_trial"]
  capsys.readouterr()
  run = export.load_run(c.workdir)
  stacked, _ = export.load_params(c.workdir)
  prompt = np.frombuffer(b"import ", np.uint8).astype(np.int32)[None]
  argv = (c.workdir, "--prompt", "import ", "--max-new-tokens", "6", "--temperature", "0")
  for trial in (None, 1 - best):
    rc, out, err = _run_cli(capsys, *argv, *(() if trial is None else ("--trial", str(trial))))
    k = best if trial is None else trial
    assert rc == 0 and f"trial {k}" in err
    params, _ = export.pick_trial(stacked, run, export.pathlib.Path(c.workdir), k)
    new = _greedy_by_full_forward(run_lib.build_model(params, run_lib.model_config(run, 256)),
                                  prompt, 6)[0]
    new = new[:np.flatnonzero(new == 256)[0]] if (new == 256).any() else new
    assert out == ("import " + bytes(new.astype(np.uint8).tolist()).decode("utf-8", "replace")
                   + "\n")
  rc, _, err = _run_cli(capsys, *argv, "--trial", "2")
  assert rc == 2 and "--trial 2 is out of range" in err
