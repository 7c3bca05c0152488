"""User code by name: import strings, --import modules and dlmrl.plugins entry points, with errors naming the
module and the attribute."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from dlmrl import plugins
from dlmrl.plugins import PluginError, import_modules, import_object, load_plugins


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A folder on sys.path for modules written by a test; the modules are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", set())
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("plug_"):
            del sys.modules[name]


def test_import_object_finds_nested_attributes(user_dir):
    (user_dir / "plug_a.py").write_text("class Box:\n    def run(self):\n        return 1\n")
    assert import_object("plug_a:Box.run").__name__ == "run"
    with pytest.raises(PluginError, match=r"'plug_a:Box' has no attribute 'walk'"):
        import_object("plug_a:Box.walk")
    with pytest.raises(PluginError, match="is not an import string; write module:attribute"):
        import_object("plug_a:")


def test_a_module_that_fails_while_importing_is_named_with_its_error(user_dir):
    (user_dir / "plug_broken.py").write_text("raise RuntimeError('half-written plugin')\n")
    with pytest.raises(PluginError, match=r"--import plug_broken: importing module 'plug_broken' raised RuntimeError: "
                                          r"half-written plugin"):
        import_modules(["plug_broken"])


def test_entry_points_are_loaded_once_and_functions_called(user_dir, monkeypatch):
    (user_dir / "plug_ep.py").write_text("CALLS = []\ndef register():\n    CALLS.append(1)\n")
    eps = [importlib.metadata.EntryPoint("mine", "plug_ep:register", plugins.ENTRY_POINT_GROUP)]
    asked = []

    def entry_points(group=None):
        asked.append(group)
        return eps

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert load_plugins() == ["mine"] and load_plugins() == []
    assert asked == ["dlmrl.plugins", "dlmrl.plugins"] and sys.modules["plug_ep"].CALLS == [1]


def test_a_broken_entry_point_names_itself(user_dir, monkeypatch):
    eps = [importlib.metadata.EntryPoint("gone", "plug_missing", plugins.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: eps)
    with pytest.raises(PluginError, match=r"entry point 'gone' \(group dlmrl.plugins\) 'plug_missing': cannot "
                                          r"import module 'plug_missing'.*; fix or uninstall that package"):
        load_plugins()
