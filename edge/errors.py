"""Two error types: EdgeError for bad input (what, expected, found, fix; exit 2) and InternalError
for a bug in edge itself (exit 3, with a request to report it)."""

from __future__ import annotations


class EdgeError(Exception):
    """A user-facing error: the CLI prints it without a traceback and exits non-zero.

    The message names the input, what was expected, what was found and what to do.
    """

    exit_code = 2

    def __init__(self, what: str, *, expected: str | None = None, found: str | None = None,
                 fix: str | None = None) -> None:
        self.what = what
        self.expected = expected
        self.found = found
        self.fix = fix
        parts = [what]
        if expected:
            parts.append(f"expected: {expected}")
        if found:
            parts.append(f"found: {found}")
        if fix:
            parts.append(f"fix: {fix}")
        super().__init__("\n  ".join(parts))

    def at(self, where: str, *, default_fix: str | None = None) -> EdgeError:
        """This error located: ``"{where}: {what}"`` with the same expected, found and fix.

        ``where`` names the place the bad value came from (``recipe r.yaml, key model``, a file);
        ``default_fix`` is used only when this error has no fix of its own. The new error's
        ``__cause__`` is this one; raise it ``from`` this one as well, inside the ``except``.
        """
        located = EdgeError(f"{where}: {self.what}", expected=self.expected, found=self.found,
                            fix=self.fix or default_fix)
        located.__cause__ = self
        return located


class InternalError(Exception):
    """A bug in edge, not in its input: an invariant of edge's own code does not hold.

    The CLI prints ``edge COMMAND: internal error: MESSAGE`` and :data:`PLEASE_REPORT`, and exits
    3. Bad input is an :class:`EdgeError` (exit 2), never an InternalError.
    """

    exit_code = 3


PLEASE_REPORT = ("this is a bug in edge, not in your input: "
                 "please report it with the command you ran and this message")


def article(word: str) -> str:
    """``a`` or ``an`` before ``word`` (by its first letter: "an integer", "a number", "an int")."""
    return "an" if word[:1].lower() in "aeio" else "a"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` and the noun in the right number: ``1 variant``, ``2 variants``, ``1 step``."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"
