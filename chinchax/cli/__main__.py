"""``python -m chinchax.cli <verb> ...``: the same as the ``chinchax`` command."""

import sys

from chinchax.cli.dispatch import main

sys.exit(main())
