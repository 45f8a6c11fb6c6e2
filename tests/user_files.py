"""Writing a user's source file for a test."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path
