"""Tokens/s of `chinchax sample`'s decoding with and without the KV cache on this machine.

A randomly initialised model of the `small` variant's shape (d_model 256, 6 layers, 4 heads,
d_ff 704, byte vocabulary, float32) continues a prompt of --prompt-tokens tokens by
--new-tokens tokens, greedily, without stopping at EOS. Each path is compiled once, then run
--repeats times; the medians are printed (compile time excluded). Without the cache every new
token recomputes the full forward pass over prompt + new positions.

  python benchmarks/sample_speed.py [--prompt-tokens 32] [--new-tokens 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
from flax import nnx

from chinchax.model import transformer as model_lib
from chinchax.sample import generate as generate_lib
from chinchax.sample import strategies


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--prompt-tokens", type=int, default=32)
  p.add_argument("--new-tokens", type=int, default=200)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--uncached-repeats", type=int, default=3)
  args = p.parse_args()
  cfg = model_lib.ModelConfig(vocab_size=257, d_model=256, n_layers=6, n_heads=4, d_ff=704)
  model = model_lib.Transformer(cfg, nnx.Rngs(params=0))
  prompt = np.random.default_rng(0).integers(0, 256, size=(1, args.prompt_tokens))
  rule = strategies.Sampling(temperature=0.0)
  out, tokens = {}, {}
  for use_cache, repeats in ((True, args.repeats), (False, args.uncached_repeats)):
    runs = [generate_lib.generate(model, prompt, max_new_tokens=args.new_tokens, rule=rule,
                                  stop_at_eos=False, use_cache=use_cache)
            for _ in range(repeats + 1)]
    name = "cache" if use_cache else "no_cache"
    tokens[name] = runs[0].tokens[0]
    rates = [g.tokens_per_s for g in runs[1:]]  # the first also compiled; its run is timed too
    out[name] = {"tokens_per_s_median": statistics.median(rates),
                 "tokens_per_s": [round(r, 1) for r in rates], "compile_s": runs[0].compile_s}
  out["same_tokens"] = bool(np.array_equal(tokens["cache"], tokens["no_cache"]))
  out["speedup"] = out["cache"]["tokens_per_s_median"] / out["no_cache"]["tokens_per_s_median"]
  print(json.dumps(out, indent=2))


if __name__ == "__main__":
  main()
