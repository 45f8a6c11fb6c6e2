"""The size limits the core keeps as it grows (issue 25): a newcomer reads a function whole, and
the classes every rule and component would otherwise accrete into stay small.

Measured statically with ast, so a limit names the function or class that broke it."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hvdtrain"
MAX_FUNCTION_LINES = 50
# The classes that rules and components used to grow into: their limit, in lines.
CLASS_LIMITS = {("loop/trainer.py", "Trainer"): 150,
                ("ps/server.py", "ParameterServer"): 250}


def _definitions(kind, root: Path = PACKAGE):
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, kind):
                yield path.relative_to(root).as_posix(), node, \
                    node.end_lineno - node.lineno + 1


def long_functions(root: Path = PACKAGE) -> list[str]:
    return [f"{path}:{node.lineno} {node.name} ({lines} lines)"
            for path, node, lines in _definitions((ast.FunctionDef, ast.AsyncFunctionDef), root)
            if lines > MAX_FUNCTION_LINES]


def test_no_function_is_over_50_lines():
    long = long_functions()
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines; split them into named "
                      "steps:\n  " + "\n  ".join(long))


def test_the_core_classes_stay_small():
    sizes = {(path, node.name): lines for path, node, lines in _definitions(ast.ClassDef)}
    for key, limit in CLASS_LIMITS.items():
        assert key in sizes, f"{key[1]} is no longer in hvdtrain/{key[0]}: update CLASS_LIMITS"
        assert sizes[key] < limit, (f"{key[1]} in hvdtrain/{key[0]} is {sizes[key]} lines; "
                                    f"keep it under {limit} by moving a concern into its own "
                                    "component")


def test_the_checker_finds_a_long_method(tmp_path):
    """The limit can fail: a 51-line method is named, a 50-line one is not."""
    body = "        x = 1\n"
    (tmp_path / "m.py").write_text("class C:\n    def long(self):\n" + body * 50 +
                                   "    def short(self):\n" + body * 49)
    assert long_functions(tmp_path) == ["m.py:2 long (51 lines)"]
