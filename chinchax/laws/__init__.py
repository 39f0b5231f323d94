"""Scaling laws: what a fitted or published law says, in which units, and for which recipe.

- :mod:`chinchax.laws.parametric`: L(N, D) = E + A/N^alpha + B/D^beta, the power-law allocation
  N_opt ∝ C^a, D_opt ∝ C^b, and the published laws (Chinchilla and its refits);
- :mod:`chinchax.laws.repeat`: data-constrained laws (repeated tokens, Muennighoff et al. 2023);
- :mod:`chinchax.laws.units`: the units a loss is measured in (tokenizer, corpus);
- :mod:`chinchax.laws.recipe`: the recipe a law holds for (shape family, LR rule, schedule, ...);
- :mod:`chinchax.laws.law_file`: a law's JSON read from a local path or gs://.

May import: errors, console, storage (law files on gs://), config, runtime.
"""
