"""``chinchax plan``: entry point kept at its old import path; the planner is ``chinchax.planning``.

``python -m chinchax.plan ARGS`` and ``chinchax.plan.main(argv)`` run
:func:`chinchax.planning.cli.main`.
"""

from __future__ import annotations

import sys

from chinchax.planning.cli import main

__all__ = ["main"]

if __name__ == "__main__":
  sys.exit(main())
