"""The process: JAX platforms and flags, multi-host start-up, signals.

- :mod:`chinchax.runtime.platforms`: which JAX backends a process starts (no libtpu without TPUs);
- :mod:`chinchax.runtime.jax_settings`: settings made before JAX's backend starts;
- :mod:`chinchax.runtime.distributed`: ``jax.distributed`` start-up and process agreement;
- :mod:`chinchax.runtime.interrupts`: SIGINT/SIGTERM → stop at a step boundary, exit 130/75;
- :mod:`chinchax.runtime.watchdog`: a command's signals and stalls end it in one line, whatever
  its main thread is doing.

This package's ``__init__`` imports nothing: ``import chinchax`` loads
:mod:`chinchax.runtime.platforms` before JAX. May import: errors, console, storage, config.
"""
