"""``python -m chinchax.bench --child IN.json OUT.json``: one job of ``bench.isolate`` (the verb is
``chinchax bench``)."""

from __future__ import annotations

import sys

from chinchax import console
from chinchax.bench.isolate import child_main

USAGE = "usage: python -m chinchax.bench --child IN.json OUT.json (the bench itself: chinchax bench)"


def main(argv: list[str]) -> int:
  """Runs the child job named by ``argv`` (``--child IN OUT``); exit status 2 on other arguments."""
  if len(argv) != 3 or argv[0] != "--child":
    console.say(USAGE, stream=sys.stderr)
    return 2
  return child_main(argv[1], argv[2])


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
