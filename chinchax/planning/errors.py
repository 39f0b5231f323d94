"""The planner's user-input error (a ``chinchax.errors.UserError``)."""

from __future__ import annotations

from chinchax import errors


class PlanError(errors.UserError):
  """A budget, law, hardware or option the planner cannot use; the message says why."""
