"""Fixtures for the unit tests that import the user's code from files in tmp_path."""

from __future__ import annotations

import os
import sys

import pytest

from hvdtrain.user_code import USER_FILES_ENV


@pytest.fixture
def isolated_imports(monkeypatch, tmp_path):
    """Undo what resolving a spec does to this process: sys.path entries, the user's modules,
    the registered files. (Only the user's modules: torch's lazily imported ones must stay.)"""
    saved_path = list(sys.path)
    saved_modules = set(sys.modules)
    monkeypatch.delenv(USER_FILES_ENV, raising=False)
    yield
    sys.path[:] = saved_path
    user_folder = os.path.realpath(tmp_path) + os.sep
    for name in set(sys.modules) - saved_modules:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if os.path.realpath(file).startswith(user_folder) or name.startswith("hvdtrain.user_code."):
            del sys.modules[name]


@pytest.fixture
def in_user_folder(monkeypatch, tmp_path):
    """Run in tmp_path, where a test writes the user's files: user specs resolve from the
    current folder."""
    monkeypatch.chdir(tmp_path)
