"""hvdtrain.user_code: finding the user's MODULE:CALLABLE, calling it, and the messages when either
fails. Every test writes its modules into its own tmp_path."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from user_files import write

import hvdtrain
from hvdtrain.config import ConfigError
from hvdtrain.user_code import (UserCodeError, call_user, call_with_known_kwargs,
                                expect_type, file_module_name, parse_json_args, resolve_callable)

REPO = Path(hvdtrain.__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("isolated_imports")  # see conftest.py

# -- finding the callable ------------------------------------------------------------------------

def test_dotted_module_in_the_current_folder(tmp_path, monkeypatch):
    write(tmp_path / "uc_pkg_a" / "__init__.py", "")
    write(tmp_path / "uc_pkg_a" / "models.py", "def build():\n    return 'built from dotted'\n")
    monkeypatch.chdir(tmp_path)
    while str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))
    while "" in sys.path:
        sys.path.remove("")

    build = resolve_callable("uc_pkg_a.models:build", "--model")

    assert build() == "built from dotted"
    assert str(tmp_path) in sys.path  # as `python -m` would have it


def test_dotted_module_on_pythonpath(tmp_path, monkeypatch):
    write(tmp_path / "lib" / "uc_mod_b.py", "def make():\n    return 42\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    assert resolve_callable("uc_mod_b:make", "--dataset")() == 42


def test_py_file_relative_and_absolute(tmp_path, monkeypatch):
    path = write(tmp_path / "models" / "net.py", "def build():\n    return 'net'\n")
    monkeypatch.chdir(tmp_path)
    relative = resolve_callable("models/net.py:build", "--model")
    absolute = resolve_callable(f"{path}:build", "--model")
    assert relative() == "net"
    assert absolute is relative  # one module per file, imported once
    assert sys.modules[file_module_name(path)].build is relative


def test_two_files_with_the_same_name_do_not_clash(tmp_path, monkeypatch):
    write(tmp_path / "a" / "model.py", "def build():\n    return 'a'\n")
    write(tmp_path / "b" / "model.py", "def build():\n    return 'b'\n")
    monkeypatch.chdir(tmp_path)
    build_a = resolve_callable("a/model.py:build", "--model")
    build_b = resolve_callable("b/model.py:build", "--model")
    assert (build_a(), build_b()) == ("a", "b")
    assert build_a.__module__ != build_b.__module__


def test_py_file_imports_its_sibling(tmp_path, monkeypatch):
    write(tmp_path / "proj" / "uc_sibling_helpers.py", "WIDTH = 17\n")
    write(tmp_path / "proj" / "net.py", """
        from uc_sibling_helpers import WIDTH

        def build():
            return WIDTH
    """)
    monkeypatch.chdir(tmp_path)
    assert resolve_callable("proj/net.py:build", "--model")() == 17


def test_dotted_attribute_inside_the_module(tmp_path, monkeypatch):
    write(tmp_path / "zoo.py", """
        class Zoo:
            class Inner:
                @staticmethod
                def build():
                    return 'inner'
    """)
    monkeypatch.chdir(tmp_path)
    assert resolve_callable("zoo.py:Zoo.Inner.build", "--model")() == "inner"


def test_class_from_a_py_file_pickles_in_this_process_and_in_a_fresh_one(tmp_path, monkeypatch):
    """A spawned or forkserver child (a DataLoader worker) unpickles by module name: the name must
    be importable there too, without resolving the spec again."""
    write(tmp_path / "data.py", """
        class Samples:
            def __init__(self, n):
                self.n = n
    """)
    monkeypatch.chdir(tmp_path)
    samples = resolve_callable("data.py:Samples", "--dataset")(5)
    blob = pickle.dumps(samples)
    assert pickle.loads(blob).n == 5

    child = subprocess.run(
        [sys.executable, "-c",
         "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).n)"],
        input=blob, capture_output=True, timeout=60, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})  # os.environ carries the registered file
    assert child.returncode == 0, child.stderr.decode()
    assert child.stdout.decode().strip() == "5"


# -- the spec points nowhere: ConfigError with the fix -------------------------------------------

def test_name_without_colon_lists_the_builtins_and_the_form():
    with pytest.raises(ConfigError) as e:
        resolve_callable("resnet", "--model", builtins=["mlp", "cnn"])
    message = str(e.value)
    assert not isinstance(e.value, UserCodeError)
    assert message.startswith("--model: 'resnet' is not a built-in model name nor MODULE:CALLABLE")
    assert "cnn, mlp" in message
    assert "path/to/my_model.py:build" in message


def test_py_file_without_colon_asks_for_the_callable():
    with pytest.raises(ConfigError, match=r"--model: 'net.py' names a file .* net.py:build"):
        resolve_callable("net.py", "--model", builtins=["mlp"])


@pytest.mark.parametrize("spec", ["mod:", ":build"])
def test_empty_module_or_callable(spec):
    with pytest.raises(ConfigError, match="MODULE:CALLABLE"):
        resolve_callable(spec, "--model")


def test_missing_py_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        resolve_callable("models/missing.py:build", "--model")
    message = str(e.value)
    assert message.startswith("--model models/missing.py:build: no such file")
    assert str(tmp_path / "models" / "missing.py") in message
    assert "relative to the current folder" in message


def test_missing_dotted_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        resolve_callable("uc_nowhere.models:build", "--model")
    message = str(e.value)
    assert not isinstance(e.value, UserCodeError)
    assert "--model uc_nowhere.models:build: no module named 'uc_nowhere'" in message
    assert "PYTHONPATH" in message and "path/to/uc_nowhere/models.py:build" in message


def test_import_error_inside_the_users_module_is_their_bug(tmp_path, monkeypatch):
    write(tmp_path / "uc_needs_dep.py", "import uc_package_never_installed\n\ndef build(): pass\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserCodeError) as e:
        resolve_callable("uc_needs_dep:build", "--model")
    assert "ModuleNotFoundError" in str(e.value)
    assert "import uc_package_never_installed" in e.value.user_traceback


def test_missing_attribute_lists_what_the_module_has(tmp_path, monkeypatch):
    write(tmp_path / "nets.py", """
        import os
        from pathlib import Path

        def build_small(): pass
        def build_large(): pass
        class Net: pass
        def _private(): pass
        WIDTH = 3
    """)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        resolve_callable("nets.py:build_smal", "--model")
    message = str(e.value)
    assert message.startswith("--model nets.py:build_smal: nets.py")
    assert "has no attribute 'build_smal'" in message
    assert "did you mean 'build_small'?" in message
    listed = message.split("it has ")[1]
    # its own functions and classes first, then imported ones; no privates, constants or modules
    assert listed == "Net, build_large, build_small, Path; fix the name after the ':'"


def test_missing_attribute_list_is_capped(tmp_path, monkeypatch):
    write(tmp_path / "many.py", "".join(f"def f{i:02d}(): pass\n" for i in range(25)))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"f09 \(and 15 more\)"):
        resolve_callable("many.py:nothing_like_it", "--model")


def test_missing_nested_attribute(tmp_path, monkeypatch):
    write(tmp_path / "zoo2.py", "class Zoo:\n    def build(self): pass\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"zoo2.py.Zoo has no attribute 'biuld'.*'build'"):
        resolve_callable("zoo2.py:Zoo.biuld", "--model")


def test_attribute_that_is_not_callable(tmp_path, monkeypatch):
    write(tmp_path / "consts.py", "WIDTH = 64\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        resolve_callable("consts.py:WIDTH", "--model")
    assert str(e.value) == ("--model consts.py:WIDTH: 'WIDTH' is an int, not a function or "
                            "class; name a function or class after the ':'")


# -- the user's code raises: UserCodeError with their traceback ----------------------------------

def test_module_raising_on_import(tmp_path, monkeypatch):
    path = write(tmp_path / "broken.py", """
        def build():
            pass

        raise RuntimeError("config table is empty")
    """)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserCodeError) as e:
        resolve_callable("broken.py:build", "--model")
    error = e.value
    assert isinstance(error, ConfigError)  # the CLI's `except ConfigError` exits 2
    assert str(error) == (f"--model broken.py:build: importing broken.py raised RuntimeError: "
                          f"config table is empty (at {os.path.realpath(path)}:5, traceback above)")
    assert 'raise RuntimeError("config table is empty")' in error.user_traceback
    assert str(path) in error.user_traceback
    assert "user_code.py" not in error.user_traceback  # only the user's frames
    assert "importlib" not in error.user_traceback
    assert file_module_name(path) not in sys.modules  # a later attempt imports it afresh


def test_call_user_turns_an_exception_into_a_user_code_error(tmp_path, monkeypatch):
    path = write(tmp_path / "factory.py", """
        def build(width):
            if width < 1:
                raise ValueError(f"width must be positive, got {width}")
    """)
    monkeypatch.chdir(tmp_path)
    build = resolve_callable("factory.py:build", "--model")
    with pytest.raises(UserCodeError) as e:
        call_user(build, "--model", "factory.py:build", 0)
    assert str(e.value) == ("--model factory.py:build raised ValueError: width must be positive, "
                            f"got 0 (at {os.path.realpath(path)}:4, traceback above)")
    lines = e.value.user_traceback.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert str(path) in lines[1]  # the first frame is the user's, not call_user's
    assert lines[-1] == "ValueError: width must be positive, got 0"
    assert e.value.flag == "--model" and e.value.spec == "factory.py:build"


def test_call_user_points_at_the_users_line_when_torch_raises():
    import torch

    def build():
        return torch.zeros(2) @ torch.zeros(3)  # the line to point at

    with pytest.raises(UserCodeError) as e:
        call_user(build, "--model", "m:build")
    assert f"{__file__}:" in str(e.value)
    assert "the line to point at" in e.value.user_traceback


def test_call_user_catches_sys_exit():
    with pytest.raises(UserCodeError, match="raised SystemExit: 3"):
        call_user(sys.exit, "--dataset", "d:make", 3)


def test_call_user_returns_the_result():
    assert call_user(lambda a, b=0: a + b, "--model", "m:f", 1, b=2) == 3


# -- keyword arguments -----------------------------------------------------------------------------

OFFERED = {"input_shape": (1, 28, 28), "num_classes": 10}


def test_offered_kwargs_only_to_factories_that_name_them():
    def names_both(input_shape, num_classes):
        return input_shape, num_classes

    def names_classes(num_classes, width=8):
        return num_classes, width

    def names_neither(width=8):
        return width

    def takes_anything(**kwargs):
        return kwargs

    def keyword_only(*, input_shape):
        return input_shape

    call = lambda fn, explicit=None: call_with_known_kwargs(  # noqa: E731
        fn, "--model", "m:f", explicit or {}, OFFERED)
    assert call(names_both) == ((1, 28, 28), 10)
    assert call(names_classes) == (10, 8)
    assert call(names_neither, {"width": 4}) == 4
    assert call(takes_anything) == OFFERED
    assert call(keyword_only) == (1, 28, 28)


def test_explicit_kwargs_win_over_offered_ones():
    def build(num_classes, width):
        return num_classes, width

    assert call_with_known_kwargs(build, "--model", "m:build", {"num_classes": 3, "width": 5},
                                  OFFERED) == (3, 5)


def test_classes_are_called_with_their_init_signature():
    class Net:
        def __init__(self, num_classes, depth=2):
            self.num_classes, self.depth = num_classes, depth

    net = call_with_known_kwargs(Net, "--model", "m:Net", {"depth": 4}, OFFERED)
    assert (net.num_classes, net.depth) == (10, 4)


def test_unknown_keyword_in_model_args_names_the_flag_and_signature():
    def build(num_classes, width=64):
        raise AssertionError("must not be called")

    with pytest.raises(ConfigError) as e:
        call_with_known_kwargs(build, "--model", "m:build", {"widht": 32}, OFFERED)
    message = str(e.value)
    assert not isinstance(e.value, UserCodeError)
    assert message.startswith("--model-args: m:build is ")
    assert "build(num_classes, width=64)" in message
    assert "widht" in message
    assert "give only parameters it names" in message


def test_model_args_example_uses_the_callables_own_parameters():
    def build(num_classes, vocab=32, d=32, layers=2, block=16):
        raise AssertionError("must not be called")

    with pytest.raises(ConfigError) as e:
        call_with_known_kwargs(build, "--model", "gpt.py:build", {"width": 16}, OFFERED)
    message = str(e.value)
    assert "got an unexpected keyword argument 'width'" in message
    # the example was '{"width": 64}', the very key refused; num_classes is hvdtrain's to give
    assert message.endswith("""e.g. --model-args '{"vocab": 32, "d": 32}'""")
    assert "width: did you mean" not in message  # nothing near it


def test_model_args_near_a_parameter_name_suggests_it():
    def build(layers=2, block=16):
        raise AssertionError("must not be called")

    with pytest.raises(ConfigError, match=r"\(got an unexpected keyword argument 'layer'\); "
                                          r"layer: did you mean layers\?; in --model-args"):
        call_with_known_kwargs(build, "--model", "m:build", {"layer": 1}, OFFERED)


def test_model_args_example_is_left_out_without_defaults_to_show():
    def build(num_classes, depth, norm=None):
        raise AssertionError("must not be called")

    with pytest.raises(ConfigError) as e:
        call_with_known_kwargs(build, "--model", "m:build", {"width": 16}, OFFERED)
    message = str(e.value)
    assert "e.g." not in message and "width\": 64" not in message
    assert message.endswith("and every one without a default")


def test_missing_required_keyword():
    def build(depth):
        pass

    with pytest.raises(ConfigError, match=r"--dataset: .*missing a required argument: "
                                          r"'depth'"):
        call_with_known_kwargs(build, "--dataset", "d:build", {}, OFFERED)


def test_custom_args_flag():
    def build():
        pass

    with pytest.raises(ConfigError, match=r"^--model-kwargs: "):
        call_with_known_kwargs(build, "--model", "m:build", {"x": 1}, {},
                               args_flag="--model-kwargs")


def test_type_error_inside_the_factory_is_the_users_bug():
    def build(num_classes):
        return len(num_classes)  # TypeError: int has no len()

    with pytest.raises(UserCodeError, match=r"--model m:build raised TypeError"):
        call_with_known_kwargs(build, "--model", "m:build", {}, OFFERED)


# -- --model-args JSON ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    (None, {}), ("", {}), ("  ", {}),
    ('{"width": 64, "act": "relu"}', {"width": 64, "act": "relu"}),
    ({"width": 8}, {"width": 8}),
])
def test_parse_json_args(text, expected):
    assert parse_json_args(text, "--model-args") == expected


def test_parse_json_args_copies_a_dict():
    given = {"width": 8}
    parsed = parse_json_args(given, "--model-args")
    parsed["width"] = 9
    assert given == {"width": 8}


@pytest.mark.parametrize("text, says", [
    ("{width: 64}", "is not valid JSON"),
    ("[1, 2]", "is a JSON list, not an object"),
    ("64", "is a JSON int, not an object"),
    (["width"], "expected a JSON object"),
])
def test_parse_json_args_rejects(text, says):
    with pytest.raises(ConfigError) as e:
        parse_json_args(text, "--model-args")
    message = str(e.value)
    assert message.startswith("--model-args: ")
    assert says in message
    assert """'{"width": 64}'""" in message
    with pytest.raises(ConfigError, match=r"""e\.g\. --dataset-args '\{"path": "data\.npz"\}'"""):
        parse_json_args(text, "--dataset-args")  # a dataset's example, not a model's width


# -- what the factory returned ---------------------------------------------------------------------

def test_expect_type_accepts_the_right_type():
    expect_type([1], (list, tuple), "--dataset", "d:make", "the samples")


def test_expect_type_names_the_flag_the_types_and_the_fix():
    import torch.nn as nn

    with pytest.raises(ConfigError) as e:
        expect_type([nn.Linear(2, 2)], nn.Module, "--model", "mymod:build", "the model instance")
    assert str(e.value) == ("--model mymod:build returned a list, expected a torch.nn.Module; "
                            "return the model instance")


def test_expect_type_none_hints_at_a_missing_return():
    with pytest.raises(ConfigError) as e:
        expect_type(None, (int, str), "--model", "m:f", "a number")
    assert str(e.value) == ("--model m:f returned None, expected an int or str; return a number "
                            "(is a return statement missing?)")
    with pytest.raises(ConfigError, match="return statement missing"):
        expect_type(None, int, "--model", "m:f", "a number")
