"""Errors of the analysis package; each is a :class:`chinchax.errors.UserError`.

The message is the whole report: it names the bad value, file or approach and
why it cannot be used.
"""

from __future__ import annotations

from chinchax import errors


class ResultsError(errors.UserError):
  """A results table cannot be used; the message names the file and the problem."""


class FitError(errors.UserError):
  """A fit could not be made; the message says why."""


class ApproachUnsupported(FitError):
  """The table cannot support this approach (e.g. Approach 1 without eval curves)."""


class FitOptionError(errors.UserError):
  """A fit option is invalid (a negative count, an unknown law to compare with)."""
