"""The ``chinchax`` command's first import: its signal handling, before JAX is imported.

``chinchax.cli`` imports this module before anything else, so a Ctrl-C or SIGTERM from the
first moments of a ``chinchax`` command (its console script, or ``python -m chinchax.cli``)
on ends it in one line with exit status 130 or 75 (:mod:`chinchax.runtime.watchdog`); a
process that imports chinchax.cli as a library is left as it is.
"""

from chinchax.runtime import watchdog

if watchdog.is_command():
  watchdog.install()
