"""The planner's user-input errors (both are ``chinchax.errors.UserError``)."""

from __future__ import annotations

from chinchax import errors


class PlanError(errors.UserError):
  """A budget, law, hardware or option the planner cannot use; the message says why."""


class StepTimeError(errors.UserError):
  """A step-time model file that cannot be read or fitted."""
