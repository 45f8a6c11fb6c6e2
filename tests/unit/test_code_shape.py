"""The size limits the core keeps as it grows (issues 25 and 42): a newcomer reads a function
whole, a class and a module in one sitting, and the classes every rule and component would
otherwise accrete into stay small; what a scheme must offer the loop stays a handful of members.

Measured statically with ast, so a limit names the function, class or module that broke it."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hvdtrain"
MAX_FUNCTION_LINES = 50
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 500
# What the loop asks of a scheme (attach, step, state...): methods, properties and class
# attributes defined in UpdateScheme's body.
SCHEME = ("scheme.py", "UpdateScheme")
MAX_SCHEME_MEMBERS = 15
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


def long_classes(root: Path = PACKAGE) -> list[str]:
    return [f"{path}:{node.lineno} {node.name} ({lines} lines)"
            for path, node, lines in _definitions(ast.ClassDef, root) if lines > MAX_CLASS_LINES]


def long_modules(root: Path = PACKAGE) -> list[str]:
    sizes = ((path.relative_to(root).as_posix(), len(path.read_text().splitlines()))
             for path in sorted(root.rglob("*.py")))
    return [f"{name} ({lines} lines)" for name, lines in sizes if lines > MAX_MODULE_LINES]


def class_members(module: str, name: str, root: Path = PACKAGE) -> list[str]:
    """The members defined in class ``name``'s own body: methods (properties among them) and
    class attributes, by name, each once."""
    classes = [node for path, node, _ in _definitions(ast.ClassDef, root)
               if path == module and node.name == name]
    assert classes, f"{name} is no longer in hvdtrain/{module}: update the limit's name"
    members: list[str] = []
    for node in classes[0].body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found = [node.name]
        elif isinstance(node, ast.Assign):
            found = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found = [node.target.id]
        else:
            continue
        members += [m for m in found if m not in members]  # a property's setter: one member
    return members


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


def test_no_class_is_over_300_lines():
    long = long_classes()
    assert not long, (f"classes over {MAX_CLASS_LINES} lines; move a concern into a component "
                      "of its own:\n  " + "\n  ".join(long))


def test_no_module_is_over_500_lines():
    long = long_modules()
    assert not long, (f"modules over {MAX_MODULE_LINES} lines; split them by concern:\n  "
                      + "\n  ".join(long))


def test_the_update_scheme_has_at_most_15_members():
    members = class_members(*SCHEME)
    assert len(members) <= MAX_SCHEME_MEMBERS, (
        f"UpdateScheme has {len(members)} members, more than {MAX_SCHEME_MEMBERS}: "
        f"{', '.join(members)}; move a group of them (the collectives) to an object of its own")


def test_the_checker_finds_a_long_class_and_module(tmp_path):
    """The limits can fail: a 301-line class and a 501-line module are named, a 300-line class
    and a 500-line module are not."""
    line = "    x = 1\n"
    (tmp_path / "long.py").write_text("class Long:\n" + line * 300 + line * 200)
    (tmp_path / "short.py").write_text("class Short:\n" + line * 299 + "\n" * 200)
    assert long_classes(tmp_path) == ["long.py:1 Long (501 lines)"]
    assert long_modules(tmp_path) == ["long.py (501 lines)"]
    (tmp_path / "long.py").write_text("class Long:\n" + line * 300)
    assert long_classes(tmp_path) == ["long.py:1 Long (301 lines)"] and not long_modules(tmp_path)


def test_the_member_count_sees_methods_properties_and_class_attributes(tmp_path):
    """What counts as a member: a method, a property (its setter too, once), a class attribute
    with or without a value; not what a method's body assigns, nor a nested function."""
    (tmp_path / "scheme.py").write_text(
        "class UpdateScheme:\n"
        "    lr_scale = 1.0\n"
        "    num_parts: int\n"
        "    def step(self):\n"
        "        self.inner = 1\n"
        "        def helper():\n"
        "            pass\n"
        "    @property\n"
        "    def steps_agree(self):\n"
        "        return True\n"
        "    @steps_agree.setter\n"
        "    def steps_agree(self, value):\n"
        "        pass\n")
    members = class_members(*SCHEME, root=tmp_path)
    assert members == ["lr_scale", "num_parts", "step", "steps_agree"]


def same_named_modules(root: Path = PACKAGE) -> list[str]:
    """Module names (package __init__ aside) that two files under ``root`` share: a reader who
    meets ``collective.py`` in a traceback or a docstring must know which one it is."""
    seen: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(path.relative_to(root).as_posix())
    return [" and ".join(paths) for paths in seen.values() if len(paths) > 1]


def test_no_two_modules_share_a_name():
    shared = same_named_modules()
    assert not shared, ("modules with the same name; rename one so that the name says which:\n  "
                        + "\n  ".join(shared))


def test_the_checker_finds_two_modules_of_one_name(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
        (tmp_path / folder / "server.py").write_text("")
    (tmp_path / "a" / "client.py").write_text("")
    assert same_named_modules(tmp_path) == ["a/server.py and b/server.py"]
