"""How numbers read in the toolkit's lines: sizes in the unit that shows them, counts with their
noun in the right number."""

from __future__ import annotations

__all__ = ["size_text", "plural"]


def size_text(n: float) -> str:
    """Bytes in the largest binary unit under which they are at least 1 (``1.50 GiB``,
    ``12.3 MiB``, ``640 KiB``, ``12 B``): never ``0.000 GiB`` for a small model."""
    for unit, scale, fmt in (("GiB", 2 ** 30, "{:.2f}"), ("MiB", 2 ** 20, "{:.1f}"),
                             ("KiB", 2 ** 10, "{:.0f}")):
        if abs(n) >= scale:
            return f"{fmt.format(n / scale)} {unit}"
    return f"{n:.0f} B"


def plural(n: float, noun: str, many: str | None = None) -> str:
    """``1 epoch``, ``2 epochs``, ``0.5 epochs`` (``many``: an irregular plural)."""
    count = str(n) if isinstance(n, int) else f"{n:g}"  # (a count of 1234567 is not 1.23457e+06)
    return f"{count} {noun if n == 1 else many or noun + 's'}"
