"""The command line: ``chinchax <verb> ...`` (entry point :func:`main`).

- :mod:`chinchax.cli.dispatch`: the dispatcher (verb → front end; a UserError → one ``error:``
  line, exit 2; signals → exit 130 / 75);
- :mod:`chinchax.cli.flags` (``--config FILE:VARIANT`` and dotted overrides),
  :mod:`chinchax.cli.helptext` (plain ``--help``, one-line usage errors);
- :mod:`chinchax.cli.start` (imported first: a command's SIGINT/SIGTERM handling before JAX);
- one front end per verb: train, ladder, plan, fit, prepare, export, sample, bench, compile.

The top layer: it may import every package of chinchax and analysis.
"""

from chinchax.cli import start  # first: a command's signals end it in one line from here on
from chinchax.cli.dispatch import CONFIG_VERBS, VERBS, main, version

__all__ = ["CONFIG_VERBS", "VERBS", "main", "start", "version"]
