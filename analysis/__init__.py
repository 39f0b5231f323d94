"""chinchax analysis: fit Chinchilla's Approaches 1–3 to a results table, with bootstrap
intervals, figures and a report.

Modules: :mod:`chinchax.laws` (laws and published numbers), :mod:`analysis.io`
(loading results tables), :mod:`analysis.fit` (the three approaches and the
bootstrap), :mod:`analysis.plots`, :mod:`analysis.report`, :mod:`analysis.cli`.
"""

from chinchax.laws import (PUBLISHED_LAWS, ParametricLaw, PowerLawAllocation,
                           get_law)

__all__ = ["PUBLISHED_LAWS", "ParametricLaw", "PowerLawAllocation", "get_law"]
