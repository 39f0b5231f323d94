"""Text from a trained run (``chinchax sample``): greedy, temperature, top-k and top-p sampling
over a key/value cache.

  chinchax sample WORKDIR [--prompt TEXT | --prompt-file FILE] [--max-new-tokens N]
                  [--temperature T] [--top-k K] [--top-p P] [--seed S] [--num-samples B]
                  [--step N] [--trial K] [--tokenizer tokenizer.json] [--no-cache]

Parts: :mod:`~chinchax.sample.run` (the run's checkpoint, trial and tokenizer, as
``chinchax export`` finds them; the request's checks), :mod:`~chinchax.sample.generate`
(jitted prefill and a ``lax.while_loop`` of decode steps; the uncached reference),
:mod:`~chinchax.sample.cache` (the model's forward pass over a fixed cache of seq_len
positions), :mod:`~chinchax.sample.strategies` (how a token is chosen).
"""
