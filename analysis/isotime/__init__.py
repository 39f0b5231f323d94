"""Time budgets ("Time Matters", Inbar & Sernau 2024): the IsoTime fit and step-time models.

- :mod:`analysis.isotime.fit`: the IsoTime ladder's fit; :mod:`analysis.isotime.report`;
- :mod:`analysis.isotime.steptime_cv`: step time from FLOPs vs bytes, cross-validated;
- :mod:`analysis.isotime.aspect_law`: the loss penalty of a shape's aspect ratio.

May import: analysis.pipeline and below.
"""
