"""The one base class of errors in the user's input.

Every error that a user can fix by changing a flag, a config value, a file or
a directory derives from :class:`UserError`. The command line
(``chinchax.cli``) catches it in one place, prints one line ``error: ...`` and
exits with :data:`USER_ERROR_EXIT_CODE`. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

USER_ERROR_EXIT_CODE = 2


class UserError(ValueError):
  """Bad input: a config value, flag, file, directory or checkpoint the user can fix.

  The message is the whole report: it names the bad value and what would be
  valid, in one line.
  """


class InterruptedWith(KeyboardInterrupt):
  """A Ctrl-C whose stage says what it kept (e.g. the token store's finished shards): the
  command line prints its message, which starts with ``interrupted``, as the one line in
  place of the general one (:func:`chinchax.runtime.interrupts.message`)."""
