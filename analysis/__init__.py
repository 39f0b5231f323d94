"""chinchax analysis: fit Chinchilla's Approaches 1–3 to a results table, with bootstrap
intervals, figures and a report.

Modules, from the bottom up: :mod:`analysis.errors`; :mod:`analysis.runs` (runs
as arrays, C = 6ND) and :mod:`analysis.io` (loading and writing results
tables); :mod:`analysis.powerlaw`, :mod:`analysis.blas`; the approaches
:mod:`analysis.approach1` (envelope), :mod:`analysis.approach2` (IsoFLOP
parabolas), :mod:`analysis.approach3` (parametric law) and
:mod:`analysis.approaches` (by key, with :class:`~analysis.approaches.FitOptions`);
:mod:`analysis.bootstrap`; :mod:`analysis.diagnostics` (warnings on a fit);
:mod:`analysis.fit` (all approaches with intervals); :mod:`analysis.report`,
:mod:`analysis.plots`; :mod:`analysis.pipeline` (a results file to a report
folder: ``chinchax fit``, whose front end is ``chinchax.cli.fit``). :mod:`analysis.synthetic`
generates runs from a known law. Laws and published numbers live in
:mod:`chinchax.laws`.
"""

from chinchax.laws import (PUBLISHED_LAWS, ParametricLaw, PowerLawAllocation,
                           get_law)

__all__ = ["PUBLISHED_LAWS", "ParametricLaw", "PowerLawAllocation", "get_law"]
