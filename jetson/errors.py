"""The device side's one error type: like edge's EdgeError (what, expected, found, fix), kept here
because device code may not import edge."""

from __future__ import annotations


class JetsonError(Exception):
    """Bad input or a device tool that failed: the message says what, what was expected, what was
    found and what to do. A runner prints it without a traceback."""

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
