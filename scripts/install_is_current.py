"""Whether `make install` can skip `pip install -e` for this interpreter (exit 0) or must run it (exit 1).

`pip install --no-build-isolation -e .` recompiles the whole C++ extension every time (the
editable build uses a fresh temporary build directory), about a minute on 2 cores, although
Python edits need no reinstall at all: the editable install imports them from the checkout. So
`make demo` / `make test` skip it when all of these hold, and re-run it otherwise:

- evidential_ops is installed in editable mode from *this* checkout (pip's direct_url.json);
- evidential_ops._C imports, from this checkout;
- no build input (setup.py, pyproject.toml, a C++/CUDA source or header under csrc/) and no
  torch file is newer than that built extension: a C++ edit, a `git checkout` or a new torch
  rebuilds;
- every requirement of the package and of the extras given (--extras test,plots) is installed
  at a version it accepts (needs `packaging`; without it the check says so and fails, so pip runs).

Not compared: the build settings read from the environment (EO_DEBUG, FORCE_CUDA,
SKIP_CUDA_BUILD, TORCH_CUDA_ARCH_LIST, MAX_JOBS) and the compilers found: after changing them,
`make clean` forces the rebuild. Otherwise any doubt answers "run pip": the check can cost a
rebuild, never a stale extension against its sources. The reason
is printed on one line either way, so `make` says why it builds or why it does not.
Usage: python scripts/install_is_current.py [--extras test,plots,triton]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import json
import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "evidential_ops"
BUILD_INPUTS = ("setup.py", "pyproject.toml")
SOURCE_SUFFIXES = {".cpp", ".cc", ".c", ".h", ".hpp", ".cu", ".cuh", ".inc"}
SKIPPED_DIRS = {"build", "__pycache__"}  # csrc/build/ holds CMake outputs, not sources


class Stale(Exception):
    """Why pip must run (the message is printed)."""


def _editable_checkout() -> Path:
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise Stale(f"{PACKAGE} is not installed for {sys.executable}") from None
    direct_url = dist.read_text("direct_url.json")
    info = json.loads(direct_url) if direct_url else {}
    url = urlparse(info.get("url", ""))
    if url.scheme != "file" or not info.get("dir_info", {}).get("editable"):
        raise Stale(f"{PACKAGE} is installed, but not in editable mode from a local checkout")
    where = Path(unquote(url.path)).resolve()
    if where != ROOT:
        raise Stale(f"{PACKAGE} is installed from {where}, not from this checkout {ROOT}")
    return where


def _extension() -> Path:
    try:
        module = importlib.import_module(f"{PACKAGE}._C")
    except Exception as error:  # ImportError, or an OSError of a library the extension links
        raise Stale(f"{PACKAGE}._C does not import ({type(error).__name__}: {error})") from None
    path = Path(module.__file__).resolve()
    if ROOT not in path.parents:
        raise Stale(f"{PACKAGE}._C is imported from {path}, outside this checkout")
    return path


def _build_inputs() -> list[Path]:
    import torch  # imported by _extension() already: its files are build inputs too

    files = [ROOT / name for name in BUILD_INPUTS]
    for directory, subdirs, names in os.walk(ROOT / "csrc"):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS]
        files += [Path(directory) / n for n in names if Path(n).suffix in SOURCE_SUFFIXES]
    torch_dir = Path(torch.__file__).resolve().parent
    files += [torch_dir / "__init__.py", torch_dir / "version.py"]
    return [f for f in files if f.exists()]


def _newer_input(extension: Path) -> None:
    built = extension.stat().st_mtime
    newer = [f for f in _build_inputs() if f.stat().st_mtime > built]
    if newer:
        shown = ", ".join(str(f.relative_to(ROOT) if ROOT in f.parents else f) for f in newer[:3])
        more = f" and {len(newer) - 3} more" if len(newer) > 3 else ""
        raise Stale(f"{shown}{more} changed since the extension was built")


def _requirements(extras: set[str]) -> None:
    try:
        from packaging.requirements import Requirement
    except ImportError:
        raise Stale("cannot check the requirements without the 'packaging' module") from None
    for text in metadata.requires(PACKAGE) or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is not None and not any(marker.evaluate({"extra": e}) for e in extras | {""}):
            continue  # an extra not asked for, or a platform this is not
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            raise Stale(f"{requirement.name} (required: {text}) is not installed") from None
        if not requirement.specifier.contains(version, prereleases=True):
            raise Stale(f"{requirement.name} {version} does not satisfy {text}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default="", help="comma-separated extras that must be installed")
    args = parser.parse_args(argv)
    extras = {e.strip() for e in args.extras.split(",") if e.strip()}
    try:
        _editable_checkout()
        extension = _extension()
        _newer_input(extension)
        _requirements(extras)
    except Stale as reason:
        print(reason, flush=True)  # the Makefile then says what it runs
        return 1
    print(f"{PACKAGE} is installed from this checkout and its C++ extension is newer than every build input: "
          "skipping pip install (`make clean` forces a rebuild, e.g. after changing EO_DEBUG or CUDA settings)",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
