"""How a number is written in a report table (report.md and the terminal's): one rule for every
table."""

from __future__ import annotations


def fmt(value, spec: str = ".3g") -> str:
    """A number as `spec`; None as '-'; anything else (report.json's "nan", "inf", "-inf") as it
    is."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)
