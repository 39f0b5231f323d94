"""chinchax analysis: fit Chinchilla's Approaches 1–3 to a results table, with bootstrap
intervals, figures and a report.

Modules, from the bottom up: :mod:`analysis.errors`; :mod:`analysis.runs` (runs
as arrays, C = 6ND) and :mod:`analysis.io` (loading and writing results
tables); :mod:`analysis.isoflop.powerlaw`, :mod:`analysis.blas`; the approaches
:mod:`analysis.isoflop.approach1` (envelope), :mod:`analysis.isoflop.approach2` (IsoFLOP
parabolas), :mod:`analysis.isoflop.approach3` (parametric law) and
:mod:`analysis.isoflop.approaches` (by key, with :class:`~analysis.isoflop.approaches.FitOptions`);
:mod:`analysis.isoflop.bootstrap`; :mod:`analysis.isoflop.diagnostics` (warnings on a fit);
:mod:`analysis.isoflop.fit` (all approaches with intervals); :mod:`analysis.report`,
:mod:`analysis.plots`; :mod:`analysis.pipeline` (a results file to a report
folder: ``chinchax fit``, whose front end is ``chinchax.cli.fit``). :mod:`analysis.isoflop.synthetic`
generates runs from a known law. Laws and published numbers live in
:mod:`chinchax.laws.parametric`.
"""

from chinchax.laws.parametric import (PUBLISHED_LAWS, ParametricLaw, PowerLawAllocation,
                           get_law)

__all__ = ["PUBLISHED_LAWS", "ParametricLaw", "PowerLawAllocation", "get_law"]
