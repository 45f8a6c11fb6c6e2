#!/usr/bin/env python
"""Print the pytest node ids of the tests that run only where CUDA is: those a
``skipif(not torch.cuda.is_available(), ...)`` guards, on the function, its class, its
parameters or the module (``pytestmark``). scripts/gpu/check.sh runs exactly these, so a new
CUDA-gated test joins the device check without an edit there.

    python scripts/gpu/cuda_tests.py [TESTS_DIR]      (default: tests/ beside this script)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GATE = "not torch.cuda.is_available()"


def gated(source: str, node: ast.AST) -> bool:
    """Whether the node's decorators (or, for an assignment, its value) hold the CUDA gate."""
    parts = getattr(node, "decorator_list", None)
    if parts is None:
        parts = [node.value] if isinstance(node, ast.Assign) else []
    return any(GATE in (ast.get_source_segment(source, p) or "") for p in parts)


def node_ids(path: Path, root: Path) -> list[str]:
    source = path.read_text()
    tree = ast.parse(source)
    rel = path.relative_to(root).as_posix()
    module_gated = any(isinstance(n, ast.Assign) and gated(source, n)
                       and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                       for n in tree.body)
    ids = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            whole = module_gated or gated(source, node)
            ids += [f"{rel}::{node.name}::{f.name}" for f in node.body
                    if isinstance(f, ast.FunctionDef) and f.name.startswith("test")
                    and (whole or gated(source, f))]
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            if module_gated or gated(source, node) or GATE in ast.get_source_segment(source, node):
                ids.append(f"{rel}::{node.name}")
    return ids


def cuda_test_ids(tests: Path) -> list[str]:
    return [i for path in sorted(tests.rglob("test_*.py")) for i in node_ids(path, tests.parent)]


if __name__ == "__main__":
    tests_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests"
    print("\n".join(cuda_test_ids(tests_dir)))
