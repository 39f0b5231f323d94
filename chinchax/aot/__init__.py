"""Ahead-of-time compilation: a run's program compiled for a TPU slice or GPU host from any host.

``chinchax compile`` (``chinchax.cli.compile``) is the front end:

* :mod:`chinchax.aot.topology` — target names → compile-only devices (libtpu, CUDA plugin);
* :mod:`chinchax.aot.program` — the train and eval steps of ``chinchax train`` compiled there;
* :mod:`chinchax.aot.hlo` — collectives of the optimized HLO, per step;
* :mod:`chinchax.aot.report` — memory against HBM, FLOPs and bytes against the analytic
  counts, a roofline step time, the knobs that would make a program fit;
* :mod:`chinchax.aot.search` — variants of a config (remat, mesh split, scan) that fit,
  ranked by roofline step time, cached by program fingerprint.
"""
