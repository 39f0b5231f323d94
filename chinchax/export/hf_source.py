"""An HF Llama checkpoint as the start of a run: ``train.init_from=hf:DIR``, checked.

``DIR`` holds ``config.json`` of a ``LlamaForCausalLM`` and its tensors, in
``model.safetensors`` or sharded as ``model-0000k-of-0000n.safetensors`` listed by
``model.safetensors.index.json`` (what ``chinchax export`` and HF's ``save_pretrained``
write). :func:`open_source` reads only config.json, the tokenizer and each shard's header:
every refusal is one line, before any tensor is read.

**The model shape comes from config.json** (:data:`SHAPE_KEYS`): hidden_size → model.d_model,
num_hidden_layers → n_layers, num_attention_heads → n_heads, num_key_value_heads →
n_kv_heads (0 when it equals n_heads), intermediate_size → d_ff, vocab_size,
tie_word_embeddings → tie_embeddings, rope_theta, rms_norm_eps → norm_eps. A model knob
left at its default (``chinchax.config.base_config``) takes the checkpoint's value;
one that equals it is fine; any other value is refused naming both.

**What chinchax's model cannot express is refused**, naming the key: another architecture,
attention or MLP biases, rope_scaling (or rope_parameters of a type other than "default"),
sliding-window attention, a head_dim other than hidden_size / num_attention_heads (or odd),
hidden_act other than silu, attention dropout, heads that do not divide.

**The tokenizer**: with ``DIR/tokenizer.json`` the run uses it (``data.tokenizer=hf``,
``data.tokenizer_path=DIR/tokenizer.json``, EOS from ``tokenizer_config.json``'s eos_token
unless ``data.eos_token`` is set); ``data.tokenizer`` must then be left at its default or
name that file. Without one the run keeps its own tokenizer. Either way a tokenizer with
more ids than the checkpoint's vocab_size is refused.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from chinchax import config as config_lib
from chinchax.storage import paths as paths_lib
from chinchax.data import tokenizers as tokenizers_lib
from chinchax.export import llama_table
from chinchax.export.error import HFCheckpointError

PREFIX = "hf:"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# chinchax model knob ← HF config.json key.
SHAPE_KEYS = {"d_model": "hidden_size", "n_layers": "num_hidden_layers",
              "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
              "d_ff": "intermediate_size", "vocab_size": "vocab_size",
              "tie_embeddings": "tie_word_embeddings", "rope_theta": "rope_theta",
              "norm_eps": "rms_norm_eps"}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size")
# HF tensors with no parameter behind them (old checkpoints saved RoPE's inverse frequencies).
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


@dataclasses.dataclass(frozen=True)
class HFSource:
  """A checked HF Llama directory.

  Attributes:
    directory: the directory (resolved).
    model: chinchax model knob → value, from config.json (:data:`SHAPE_KEYS`).
    files: HF tensor name → the safetensors file holding it.
    shapes: HF tensor name → its shape (from the file headers).
    tokenizer_path: ``DIR/tokenizer.json``, or None when the directory has none.
  """

  directory: pathlib.Path
  model: dict
  files: dict
  shapes: dict
  tokenizer_path: pathlib.Path | None


def hf_dir(init_from: str) -> pathlib.Path | None:
  """The directory of ``train.init_from="hf:DIR"`` (``~`` expanded, resolved); None for a
  chinchax run's workdir (no ``hf:`` prefix).

  Raises:
    HFCheckpointError: ``hf:`` with no directory after it (it would name the current one).
  """
  text = str(init_from).strip()
  if not text.startswith(PREFIX):
    return None
  if not text[len(PREFIX):].strip():
    raise HFCheckpointError(f"train.init_from={text!r} names no directory; give "
                            f"hf:DIR, DIR holding config.json and model.safetensors of a "
                            f"LlamaForCausalLM (e.g. an export: hf:runs/NAME/export)")
  return paths_lib.resolved(text[len(PREFIX):].strip())


def read_config(directory: pathlib.Path) -> dict:
  """The chinchax model knobs of ``directory/config.json`` (see the module docstring).

  Returns:
    {"d_model", "n_layers", "n_heads", "n_kv_heads" (0 = n_heads), "d_ff", "vocab_size",
    "tie_embeddings", "rope_theta", "norm_eps"}.
  Raises:
    HFCheckpointError: no such directory or config.json, another architecture, a key whose
      value chinchax's model cannot express, or a required key missing.
  """
  where = f"train.init_from={PREFIX}{directory}"
  if not directory.is_dir():
    raise HFCheckpointError(f"{where} is not a directory; give an HF Llama checkpoint "
                            f"directory (config.json and model.safetensors)")
  path = directory / "config.json"
  try:
    hf = json.loads(path.read_text())
  except FileNotFoundError:
    raise HFCheckpointError(f"{where} is not an HF checkpoint: it has no config.json (it needs "
                            f"config.json and model.safetensors of a LlamaForCausalLM)") from None
  except (OSError, ValueError) as e:
    raise HFCheckpointError(f"{where}: {path} cannot be read as JSON ({e})") from None
  if not isinstance(hf, dict) or "model_signature" in hf:
    raise HFCheckpointError(f"{where}: {path} is a chinchax run's config, not an HF one; give "
                            f"the run's workdir without the {PREFIX} prefix")
  archs, kind = hf.get("architectures") or [], hf.get("model_type")
  if kind != "llama" or any(a != "LlamaForCausalLM" for a in archs):
    raise HFCheckpointError(f"{where}: config.json describes model_type={kind!r} "
                            f"architectures={archs!r}; only LlamaForCausalLM (model_type "
                            f"'llama') maps onto chinchax's model")
  bad = _unsupported(hf)
  if bad:
    raise HFCheckpointError(f"{where}: config.json has {bad}")
  missing = [k for k in REQUIRED if not isinstance(hf.get(k), int) or hf[k] <= 0]
  if missing:
    raise HFCheckpointError(f"{where}: config.json lacks a positive integer {missing[0]}")
  D, H = hf["hidden_size"], hf["num_attention_heads"]
  G = hf.get("num_key_value_heads") or H
  theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10_000.0))
  return {"d_model": D, "n_layers": hf["num_hidden_layers"], "n_heads": H,
          "n_kv_heads": 0 if G == H else G, "d_ff": hf["intermediate_size"],
          "vocab_size": hf["vocab_size"], "tie_embeddings": bool(hf.get("tie_word_embeddings")),
          "rope_theta": float(theta), "norm_eps": float(hf.get("rms_norm_eps", 1e-6))}


def _unsupported(hf: dict) -> str:
  """'key=value, which ...' for the first config.json setting chinchax cannot express; ''."""
  D, H = hf.get("hidden_size"), hf.get("num_attention_heads")
  G = hf.get("num_key_value_heads") or H
  rope_params = hf.get("rope_parameters") or {}
  checks = [
      ("attention_bias", bool(hf.get("attention_bias")), "attention biases (chinchax's q/k/v/o "
       "have none)"),
      ("mlp_bias", bool(hf.get("mlp_bias")), "MLP biases (chinchax's SwiGLU has none)"),
      ("rope_scaling", hf.get("rope_scaling") not in (None, {}), "a RoPE scaling (chinchax "
       "uses plain RoPE: rope_scaling null)"),
      ("rope_parameters", rope_params.get("rope_type", "default") != "default",
       "a RoPE type other than 'default' (chinchax uses plain RoPE)"),
      ("sliding_window", hf.get("sliding_window") is not None or bool(hf.get(
          "use_sliding_window")), "sliding-window attention (chinchax attends to the whole "
       "causal window: sliding_window null)"),
      ("hidden_act", hf.get("hidden_act", "silu") != "silu", "an MLP activation other than "
       "silu (chinchax's MLP is SwiGLU)"),
      ("attention_dropout", bool(hf.get("attention_dropout")), "attention dropout (chinchax "
       "trains without dropout: 0.0)"),
  ]
  if isinstance(D, int) and isinstance(H, int) and H > 0:
    K = hf.get("head_dim") or (D // H)
    checks += [
        ("hidden_size", D % H != 0, f"no whole head_dim: hidden_size is not a multiple of "
         f"num_attention_heads={H}"),
        ("head_dim", K * H != D, f"head_dim other than hidden_size / num_attention_heads = "
         f"{D // H} (chinchax's heads split d_model)"),
        ("head_dim", K % 2 == 1, "an odd head_dim (RoPE rotates pairs)"),
        ("num_key_value_heads", not isinstance(G, int) or G <= 0 or H % G != 0,
         f"key/value heads that do not divide num_attention_heads={H}"),
    ]
  for key, bad, what in checks:
    if bad:
      value = hf.get(key, rope_params if key == "rope_parameters" else None)
      return f"{key}={json.dumps(value)}: {what}"
  return ""


def configure(config, directory: pathlib.Path, model: dict) -> pathlib.Path | None:
  """Sets ``config.model`` and ``config.data``'s tokenizer from the checkpoint (in place).

  Args:
    config: the run's (locked) ConfigDict.
    directory: the HF directory.
    model: :func:`read_config`'s knobs.
  Returns:
    ``DIR/tokenizer.json``, or None when the directory has none.
  Raises:
    HFCheckpointError: a model knob set to another value than the checkpoint's (and not
      left at its default), a data.tokenizer other than the directory's tokenizer.json,
      or a tokenizer with more ids than the checkpoint's vocab_size.
  """
  where = f"train.init_from={PREFIX}{directory}"
  defaults = config_lib.base_config().model
  conflicts = []  # every knob that differs, so one line says all of them
  for knob in model:
    if config.model[knob] != defaults[knob]:
      try:
        _check_same(where, knob, config.model[knob], model)
      except HFCheckpointError as e:
        conflicts.append((knob, e))
  if len(conflicts) == 1:
    raise conflicts[0][1]
  if conflicts:
    raise HFCheckpointError(
        f"{where}: the config's model knobs differ from its config.json: " + ", ".join(
            f"model.{k}={config.model[k]!r} (checkpoint {model[k]!r})" for k, _ in conflicts)
        + "; leave them at their defaults (a --config variant that does not set them, such as "
        "the default one) or set them to the checkpoint's values")
  for knob, value in model.items():
    config.model[knob] = type(defaults[knob])(value)
  tok_path = directory / "tokenizer.json"
  if not tok_path.is_file():
    tok_path = None
  else:
    d, data_defaults = config.data, config_lib.base_config().data
    theirs = d.tokenizer_path and paths_lib.resolved(d.tokenizer_path) == tok_path
    if not (d.tokenizer == data_defaults.tokenizer or (d.tokenizer == "hf" and (
        theirs or not d.tokenizer_path))):
      raise HFCheckpointError(
          f"{where} holds its own tokenizer.json, which the run must use, but the config has "
          f"data.tokenizer={d.tokenizer!r} data.tokenizer_path={d.tokenizer_path!r}; leave "
          f"data.tokenizer at its default or set data.tokenizer_path={tok_path}")
    d.tokenizer, d.tokenizer_path = "hf", str(tok_path)
    if not d.eos_token:
      d.eos_token = _eos_token(directory)
  tok = tokenizers_lib.make_tokenizer(config.data)
  if tok.vocab_size > model["vocab_size"]:
    what = f"its tokenizer {tok_path}" if tok_path else f"the run's tokenizer ({tok.name})"
    raise HFCheckpointError(
        f"{where}: {what} has {tok.vocab_size} ids but the checkpoint's vocab_size is "
        f"{model['vocab_size']} (config.json); its embedding has no row for ids ≥ "
        f"{model['vocab_size']}: use the checkpoint's own tokenizer")
  return tok_path


def _check_same(where: str, knob: str, ours, model: dict, typed: bool = False) -> None:
  """Raises HFCheckpointError when the config's ``model.<knob>`` = ``ours`` is not the
  checkpoint's value (n_kv_heads 0 = n_heads); ``typed``: the command line set it."""
  value = model[knob]
  same = (ours or model["n_heads"]) == (value or model["n_heads"]) if knob == "n_kv_heads" \
      else ours == value
  if not same:
    default = config_lib.base_config().model[knob]
    fix = (f"drop --config.model.{knob} (the checkpoint sets it)" if typed else
           f"leave model.{knob} at its default ({default!r}: a --config variant that does not "
           f"set it, such as the default one)")
    raise HFCheckpointError(
        f"{where} sets model.{knob}={value!r} ({SHAPE_KEYS[knob]} in its config.json), but "
        f"the config has model.{knob}={ours!r}; {fix} or set it to {value!r}")


def check_set_knobs(config, knobs) -> None:
  """Refuses a model knob given on the command line (``--config.model.KNOB=V``) that is not
  the checkpoint's value, even when V is the knob's default (which :func:`configure` takes
  for "left at its default"). Reads only ``config.json``; nothing for another init_from.

  Args:
    config: the run's ConfigDict, as parsed.
    knobs: names of the ``model`` knobs the command line set (e.g. {"d_model"}).
  Raises:
    HFCheckpointError: such a knob differs from the checkpoint; see :func:`read_config`.
  """
  directory = hf_dir(config.train.init_from)
  named = [k for k in SHAPE_KEYS if k in set(knobs)]
  if directory is None or not named:
    return
  model = read_config(directory)
  for knob in named:
    _check_same(f"train.init_from={PREFIX}{directory}", knob, config.model[knob], model,
                typed=True)


def _eos_token(directory: pathlib.Path) -> str:
  """tokenizer_config.json's eos_token (a string or {"content": ...}); '' when absent."""
  try:
    eos = json.loads((directory / "tokenizer_config.json").read_text()).get("eos_token")
  except (OSError, ValueError, AttributeError):
    return ""
  if isinstance(eos, dict):
    eos = eos.get("content")
  return eos if isinstance(eos, str) else ""


def expected_shapes(model: dict) -> dict[str, tuple[int, ...]]:
  """HF tensor name → the shape chinchax's model needs, for :func:`read_config`'s knobs."""
  D, H, F, V = model["d_model"], model["n_heads"], model["d_ff"], model["vocab_size"]
  G, K = model["n_kv_heads"] or H, D // H
  ours = {"embed_VD": (V, D), "attn_norm.scale": (D,), "attn.wq_DHK": (D, H, K),
          "attn.wk_DHK": (D, G, K), "attn.wv_DHK": (D, G, K), "attn.wo_HKD": (H, K, D),
          "mlp_norm.scale": (D,), "mlp.w_gate_DF": (D, F), "mlp.w_up_DF": (D, F),
          "mlp.w_down_FD": (F, D), "final_norm.scale": (D,), "head_DV": (D, V)}
  out = {}
  for name, hf, e in llama_table.pairs(model["n_layers"], model["tie_embeddings"]):
    key = e.chinchax.removeprefix("blocks.i.")
    out[hf] = llama_table.hf_shape(ours[key], e.transform)
  return out


def tensor_files(directory: pathlib.Path) -> dict[str, pathlib.Path]:
  """HF tensor name → its safetensors file: ``model.safetensors.index.json``'s weight_map,
  else every tensor of ``model.safetensors``.

  Raises:
    HFCheckpointError: neither file, an unreadable index, or a shard it names is missing.
  """
  from safetensors import safe_open  # noqa: PLC0415 — the optional 'export' extra

  where = f"train.init_from={PREFIX}{directory}"
  index = directory / INDEX
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
      files = {name: directory / str(f) for name, f in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise HFCheckpointError(f"{where}: {index} is not a safetensors index "
                              f"({type(e).__name__}: {e}); it needs a weight_map") from None
    for f in sorted(set(files.values())):
      if not f.is_file():
        n = sum(v == f for v in files.values())
        raise HFCheckpointError(f"{where}: shard {f.name} is missing ({INDEX} lists {n} "
                                f"tensors in it); copy the whole checkpoint directory")
    return files
  single = directory / SINGLE
  if not single.is_file():
    raise HFCheckpointError(f"{where} has neither {SINGLE} nor {INDEX}; give an HF checkpoint "
                            f"directory with its safetensors weights")
  try:
    with safe_open(str(single), framework="numpy") as f:
      return {name: single for name in f.keys()}
  except Exception as e:  # noqa: BLE001 — safetensors raises its own error types
    raise HFCheckpointError(f"{where}: {single.name} is not a safetensors file ({e})") from None


def read_shapes(directory: pathlib.Path, files: dict, model: dict) -> dict:
  """Checks every tensor's presence, shape and dtype against :func:`expected_shapes` from the
  file headers alone; returns HF tensor name → shape.

  Raises:
    HFCheckpointError: a file that is not safetensors, a tensor missing, of another shape
      or dtype, or one chinchax's model has no place for (a bias, say).
  """
  from safetensors import safe_open  # noqa: PLC0415 — the optional 'export' extra

  where = f"train.init_from={PREFIX}{directory}"
  want = expected_shapes(model)
  for name in files:
    if name not in want and not name.endswith(IGNORED_SUFFIXES) and not (
        name == "lm_head.weight" and model["tie_embeddings"]):
      raise HFCheckpointError(f"{where}: tensor {name} has no place in chinchax's model "
                              f"(LlamaForCausalLM without biases); it holds "
                              f"{', '.join(sorted(want)[:2])}, …")
  for name in want:
    if name not in files:
      raise HFCheckpointError(f"{where}: tensor {name} is missing from the checkpoint "
                              f"(config.json's shape needs it)")
  shapes = {}
  for path in sorted(set(files[n] for n in want)):
    try:
      with safe_open(str(path), framework="numpy") as f:
        for name in [n for n in want if files[n] == path]:
          if name not in f.keys():
            raise HFCheckpointError(f"{where}: tensor {name} is not in {path.name}, "
                                    f"where {INDEX} says it is")
          sl = f.get_slice(name)
          shapes[name], dtype = tuple(sl.get_shape()), sl.get_dtype()
          if shapes[name] != want[name]:
            raise HFCheckpointError(
                f"{where}: tensor {name} in {path.name} has shape {list(shapes[name])}, but "
                f"config.json's model needs {list(want[name])}")
          if dtype not in DTYPES:
            raise HFCheckpointError(f"{where}: tensor {name} in {path.name} is {dtype}; "
                                    f"readable dtypes: {', '.join(DTYPES)}")
    except HFCheckpointError:
      raise
    except Exception as e:  # noqa: BLE001 — safetensors raises its own error types
      raise HFCheckpointError(f"{where}: {path.name} is not a safetensors file ({e})") from None
  return shapes


def open_source(config) -> HFSource | None:
  """For ``train.init_from=hf:DIR``: checks DIR (config.json, tensor headers, tokenizer) and
  sets the run's model shape and tokenizer from it (:func:`configure`); None for any other
  init_from. Reads no tensor data.

  Raises:
    HFCheckpointError: see :func:`read_config`, :func:`configure`, :func:`tensor_files`,
      :func:`read_shapes`; and ``train.init_step`` given (an HF checkpoint has no steps).
  """
  directory = hf_dir(config.train.init_from)
  if directory is None:
    return None
  if config.train.init_step:
    raise HFCheckpointError(f"train.init_step={config.train.init_step} needs a chinchax run; "
                            f"train.init_from={PREFIX}{directory} is one checkpoint: use 0")
  model = read_config(directory)
  files = tensor_files(directory)
  shapes = read_shapes(directory, files, model)
  tok_path = configure(config, directory, model)
  return HFSource(directory, model, files, shapes, tok_path)

