"""Write the tag table: ``python -m audit_callbacks.names [PATH]`` (stdout without PATH)."""

from __future__ import annotations

import sys
from pathlib import Path

from . import markdown_table


def main(argv: list[str]) -> int:
    text = markdown_table()
    if not argv:
        sys.stdout.write(text)
    else:
        Path(argv[0]).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
