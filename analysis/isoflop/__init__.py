"""Chinchilla's three approaches on an IsoFLOP ladder, with their intervals and diagnostics.

- :mod:`analysis.isoflop.approach1` (the loss-vs-FLOPs envelope), :mod:`~analysis.isoflop.approach2`
  (IsoFLOP parabolas) with :mod:`~analysis.isoflop.approach2_design` (fit windows),
  :mod:`~analysis.isoflop.approach3` (the parametric law), :mod:`~analysis.isoflop.approaches`
  (by key); :mod:`~analysis.isoflop.powerlaw` (the log-log fits they share);
- :mod:`analysis.isoflop.bootstrap`, :mod:`analysis.isoflop.diagnostics`, :mod:`analysis.isoflop.fit`
  (all approaches with intervals); :mod:`analysis.isoflop.synthetic` (runs drawn from a known law).

May import: analysis.errors, runs, io, blas, recipe, validation, and the chinchax core.
"""
