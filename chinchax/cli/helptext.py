"""Help and usage errors of every verb, as plain text for a terminal.

* :func:`plain` — reST markup out of a docstring (roles, literals, ``::``), so a
  module docstring reads as text in ``--help``.
* :func:`example` — the ``Example:`` block of a docstring (its indented lines).
* :func:`parser` — an argparse parser for a verb: its description is the verb
  module's docstring as plain text (laid out as written), every flag that has a
  default shows it, and a usage error is one :class:`UsageError` line ending in
  ``see chinchax VERB --help`` instead of argparse's usage block and exit.

``chinchax.cli.main`` passes every verb's ``--help`` output through
:func:`plain` and adds the verb module's ``Example:`` block when the verb's own
help has none, so a new verb module gets the same treatment.
"""

from __future__ import annotations


import argparse
import textwrap
import re

from chinchax import errors


HELP_FLAGS = ("-h", "--help", "-help", "--helpfull")


class UsageError(errors.UserError):
  """A command line that cannot be parsed: unknown flag, bad value, missing argument."""


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]*)``")
_TICKED = re.compile(r"`([^`]+)`")


def plain(text: str) -> str:
  """``text`` without reST markup: ``:func:`x``` and ``~`` targets → x, double and single
  backquotes dropped, a paragraph's trailing ``::`` → ``:``, a line of ``::`` alone dropped,
  ``**strong**`` → strong."""
  text = _ROLE.sub(r"\1", text)
  text = _LITERAL.sub(r"\1", text)
  text = _TICKED.sub(r"\1", text)
  text = text.replace("**", "")
  lines = []
  for line in text.splitlines():
    if line.strip() == "::":
      continue
    lines.append(line[:-1] if line.rstrip().endswith("::") and not line.rstrip().endswith(":::")
                 else line)
  return "\n".join(lines)


def example(doc: str | None) -> str:
  """The ``Example:`` / ``Examples:`` block of ``doc`` (the heading and its indented lines),
  as plain text; "" when there is none."""
  lines = (doc or "").splitlines()
  for i, line in enumerate(lines):
    if re.fullmatch(r"\s*Examples?:\s*", line):
      block = [line.strip()]
      for rest in lines[i + 1:]:
        if rest.strip() and not rest.startswith((" ", "\t")):
          break
        block.append(rest)
      return plain("\n".join(block).rstrip())
  return ""


class _Formatter(argparse.RawDescriptionHelpFormatter):
  """The description as written; ``(default: X)`` after every flag's help that has a default
  and does not already name one."""

  def _get_help_string(self, action):
    text = action.help or ""
    if ("default" in text or action.default is None or action.default is False
        or action.default == argparse.SUPPRESS or action.required or not action.option_strings):
      return text
    return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
  def __init__(self, *a, verb: str, **kw):
    super().__init__(*a, **kw)
    self.verb = verb

  def error(self, message):
    raise UsageError(f"{message}; see chinchax {self.verb} --help")


def parser(verb: str, doc: str | None, **kw) -> argparse.ArgumentParser:
  """The argparse parser of ``chinchax VERB``.

  Args:
    verb: the verb's name (``prog`` is ``chinchax VERB``).
    doc: the verb module's docstring: the help's description, as plain text,
      with its ``Example:`` block.
    **kw: more ``argparse.ArgumentParser`` arguments.
  Returns:
    a parser whose ``parse_args`` raises :class:`UsageError` (one line) on
    bad input and exits 0 after printing ``--help``.
  """
  return _Parser(prog=f"chinchax {verb}", description=plain((doc or "").strip()),
                 formatter_class=_Formatter, verb=verb, **kw)


HELP_WIDTH = 100  # columns of a verb's help


def fit_width(text: str) -> str:
  """``text`` with each line over :data:`HELP_WIDTH` columns wrapped below itself, indented as
  it was plus two (a command line in an example is left whole: it must stay copyable)."""
  out = []
  for line in text.splitlines():
    stripped = line.lstrip()
    if len(line) <= HELP_WIDTH or stripped.startswith(("chinchax ", "$ ", "python ")):
      out.append(line)
      continue
    indent = " " * (len(line) - len(stripped))
    out += textwrap.wrap(stripped, HELP_WIDTH, initial_indent=indent,
                         subsequent_indent=indent + "  ", break_on_hyphens=False)
  return "\n".join(out)
