"""scripts/install_is_current.py: when `make install` may skip the (minute-long) editable build."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install_is_current.py"


def _script():
    spec = importlib.util.spec_from_file_location("install_is_current_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Distribution:
    def __init__(self, direct_url: dict | None):
        self.direct_url = direct_url

    def read_text(self, name):
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


def _installed(monkeypatch, script, direct_url):
    monkeypatch.setattr(script.metadata, "distribution", lambda name: _Distribution(direct_url))


def test_not_installed_means_install(monkeypatch, capsys):
    script = _script()

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(script.metadata, "distribution", missing)
    assert script.main([]) == 1
    assert "is not installed" in capsys.readouterr().out


@pytest.mark.parametrize("direct_url, why", [
    (None, "not in editable mode"),
    ({"url": "https://example.org/evidential_ops.tar.gz", "archive_info": {}}, "not in editable mode"),
    ({"url": "file:///somewhere/else", "dir_info": {"editable": True}}, "not from this checkout"),
])
def test_only_an_editable_install_of_this_checkout_counts(direct_url, why, monkeypatch):
    script = _script()
    _installed(monkeypatch, script, direct_url)
    with pytest.raises(script.Stale, match=why):
        script._editable_checkout()


def test_this_checkout_counts(monkeypatch):
    script = _script()
    _installed(monkeypatch, script, {"url": script.ROOT.as_uri(), "dir_info": {"editable": True}})
    assert script._editable_checkout() == script.ROOT


def _fake_checkout(tmp_path) -> Path:
    (tmp_path / "csrc" / "cpu").mkdir(parents=True)
    (tmp_path / "csrc" / "build").mkdir()
    for name in ("setup.py", "pyproject.toml", "csrc/cpu/kernel.cpp", "csrc/kernel.h", "csrc/build/out.o",
                 "csrc/notes.txt"):
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (1_000_000, 1_000_000))
    extension = tmp_path / "_C.so"
    extension.write_text("")
    os.utime(extension, (2_000_000_000, 2_000_000_000))  # newer than the sources and than torch's files
    return extension


def test_an_edited_source_rebuilds_and_other_files_do_not(tmp_path, monkeypatch):
    script = _script()
    monkeypatch.setattr(script, "ROOT", tmp_path)
    extension = _fake_checkout(tmp_path)
    script._newer_input(extension)  # nothing newer: no rebuild
    for ignored in ("csrc/build/out.o", "csrc/notes.txt"):  # build outputs and non-sources
        os.utime(tmp_path / ignored, (3_000_000_000, 3_000_000_000))
    script._newer_input(extension)
    for edited in ("csrc/cpu/kernel.cpp", "csrc/kernel.h", "setup.py"):
        os.utime(tmp_path / edited, (3_000_000_000, 3_000_000_000))
        with pytest.raises(script.Stale, match=Path(edited).name):
            script._newer_input(extension)
        os.utime(tmp_path / edited, (1_000_000, 1_000_000))


def test_requirements_of_the_asked_extras_only(monkeypatch):
    pytest.importorskip("packaging")
    script = _script()
    versions = {"torch": "2.13.0", "numpy": "2.0.0", "pytest": "7.0.0"}
    monkeypatch.setattr(script.metadata, "requires",
                        lambda name: ["torch>=2.4", "numpy", 'pytest>=8; extra == "test"',
                                      'matplotlib>=3.7; extra == "plots"'])

    def version(name):
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(script.metadata, "version", version)
    script._requirements(set())  # the extras' packages are not needed when not asked for
    with pytest.raises(script.Stale, match="pytest 7.0.0 does not satisfy"):
        script._requirements({"test"})
    with pytest.raises(script.Stale, match="matplotlib .* is not installed"):
        script._requirements({"plots"})
    versions["pytest"] = "8.1.0"
    script._requirements({"test"})
