"""Input sizes as users give them: ``224`` (square) or ``HxW`` (``224x320``: 224 rows, 320 columns).

One parser for the CLI's ``--img-size``, the ``img_size=`` model option and the size a compressed
artifact records (a JSON list). A size is one form afterwards: an ``int`` when square, else
``(rows, columns)``, which is what timm's ``img_size`` takes. Importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge.errors import EdgeError

ImgSize = int | tuple[int, int]
METAVAR = "SIZE"
HELP = "input size of the architecture: N for N x N pixels or HxW, e.g. 224 (DINOv2) or 224x320"
MAX_SIDE = 8192  # pixels; beyond it a ViT's position embedding alone outgrows a Jetson's memory
EXPECTED = f"N (N x N pixels) or HxW (H rows, W columns) with integers from 1 to {MAX_SIDE}"
FIX = "pass e.g. 224 for 224 x 224 pixels or 224x320 for 224 rows by 320 columns"


def _bad(value, found: str) -> EdgeError:
    return EdgeError(f"input size {value!r}", expected=EXPECTED, found=found, fix=FIX)


def _side(value, part) -> int:
    if isinstance(part, str):
        try:
            part = int(part.strip())
        except ValueError as e:
            raise _bad(value, f"{part.strip()!r} is not an integer") from e
    if isinstance(part, bool) or not isinstance(part, int):
        raise _bad(value, f"{part!r} is not an integer")
    if part < 1:
        raise _bad(value, f"{part} is not positive")
    if part > MAX_SIDE:
        raise _bad(value, f"{part} is above {MAX_SIDE}")
    return part


def parse_img_size(value: str | int | Sequence[int]) -> ImgSize:
    """``"224"`` or ``224`` -> 224; ``"224x320"``, ``(224, 320)`` or ``[224, 320]`` -> (224, 320); ``"28x28"`` -> 28."""
    parts = value.strip().lower().split("x") if isinstance(value, str) else value
    if not isinstance(parts, Sequence):
        parts = [parts]
    if len(parts) not in (1, 2):
        raise _bad(value, f"{len(parts)} numbers")
    rows, columns = (_side(value, parts[0]), _side(value, parts[-1]))
    return rows if rows == columns else (rows, columns)
