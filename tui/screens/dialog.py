"""What the modal screens share: the dialog frame's style and how a size is written."""

from __future__ import annotations

__all__ = ["DIALOG_CSS", "size_text"]

DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 90%; max-width: 110; height: auto; max-height: 90%;
    border: round $primary; background: $surface; padding: 0 1; }}
{name} .title {{ text-style: bold; }}
{name} .hint {{ color: $text-muted; }}
{name} DataTable {{ height: auto; max-height: 16; }}
"""


def size_text(n: int | None) -> str:
    if n is None:
        return ""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"
