"""Data-constrained fits: repetition laws fitted on a ladder with a unique-token axis.

- :mod:`analysis.repeat.fit`: R_D*, R_N* (and the alternative form) fitted on a base law;
- :mod:`analysis.repeat.report`: their report section and figure.

May import: analysis.isoflop and below.
"""
