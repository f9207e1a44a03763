"""calib's one error type: like edge's EdgeError (what, expected, found, fix), kept here because calib
imports nothing of edge (edge's precision package turns it into an EdgeError)."""

from __future__ import annotations


class CalibError(Exception):
    """Bad input to a quantization: the message says what, what was expected, what was found and what to do."""

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
