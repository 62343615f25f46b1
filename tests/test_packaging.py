"""What the distributions carry: the license, one version, metadata, and an sdist whose tests run.

The file checks run at any rank count (they read files only, identically on every rank). The checks of
the built distributions run in the serial suite: they use the sdist and wheel in ``HPCCOLL_DIST_DIR``
when it is set (``make dist`` builds them into ``dist/`` and runs this file with
``HPCCOLL_DIST_DIR=dist``), else build both here, from a copy of the checkout, with ``python -m build``
(the ``dist`` extra; an isolated build, so pip must reach an index with setuptools; about 7 s), else skip,
saying so.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from importlib.util import find_spec
from pathlib import Path

import pytest
from launch import child_env
from mpi4py import MPI

ROOT = Path(__file__).resolve().parent.parent

serial = pytest.mark.skipif(
    MPI.COMM_WORLD.size > 1, reason="builds or unpacks the distributions in one place; runs in the serial suite"
)

#: Directories the sdist carries whole, so that `make test` (and lint, docs, the examples) run from it.
GRAFTED = ("tests", "examples", "benchmarks", "jobs", "docs", "hpccoll")
#: Files the sdist must carry at its top level.
TOP = (
    "LICENSE",
    "README.md",
    "CHANGELOG.md",
    "CONTRIBUTING.md",
    "CITATION.cff",
    "Makefile",
    "pyproject.toml",
    "setup.cfg",
    "MANIFEST.in",
)
#: What `make test` needs beyond the test files themselves.
NEEDED_BY_TESTS = (
    "tests/conftest.py",
    "tests/tiers.py",
    "tests/launch.py",
    "tests/standin_cupy.py",
    "tests/standin_nccl.py",
)
#: What a build from a copy of the checkout leaves behind (and version control, and the venvs).
BUILD_OUTPUTS = (
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    "_build",
)
#: Never in a distribution.
JUNK = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.hypothesis|_build|\.venv[^/]*)(/|$)|\.py[cod]$")


def setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")
    return cfg


def package_version() -> str:
    """``__version__`` as written in hpccoll/__init__.py (the one place it is written)."""
    tree = ast.parse((ROOT / "hpccoll" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("hpccoll/__init__.py: expected a line `__version__ = '...'`; found none")


def source_files(top: str) -> set:
    """Every file under ``top`` in the source tree (relative paths), caches and build outputs left out."""
    out = set()
    for path in (ROOT / top).rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_file() and not JUNK.search(rel):
            out.add(rel)
    return out


# ----------------------------------------------------------------------------- files in the tree


def test_license_file_is_declared():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License"), text[:60]
    assert "Copyright (c) 2026, the hpccoll developers" in text
    meta = setup_cfg()["metadata"]
    assert meta.get("license_files", "").split() == ["LICENSE"], meta.get("license_files")
    assert meta.get("license_expression") == "BSD-3-Clause", meta.get("license_expression")


def test_version_single_sourced():
    import hpccoll

    version = package_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]|rc)?\d*", version), version
    assert setup_cfg()["metadata"]["version"] == "attr: hpccoll.__version__"
    if Path(hpccoll.__file__).resolve().parent == ROOT / "hpccoll":  # the package this checkout holds
        assert hpccoll.__version__ == version


def test_citation_cff():
    """CITATION.cff is CFF 1.2.0 with its required keys, and its version is the package's."""
    text = (ROOT / "CITATION.cff").read_text()
    top = dict(re.findall(r"^([a-z][a-z-]*):[ \t]*(.*)$", text, re.M))
    for key in ("cff-version", "message", "title", "authors", "version", "license"):
        assert key in top, f"CITATION.cff: expected a top-level {key!r}; got keys {sorted(top)}"
    assert top["cff-version"].strip("\"'") == "1.2.0"
    assert top["version"].strip("\"'") == package_version(), "CITATION.cff's version differs from __version__"
    assert top["license"].strip("\"'") == "BSD-3-Clause"
    assert re.search(r"^authors:\n  - name: .+$", text, re.M), "CITATION.cff: expected an authors list"


def test_extras_resolve_on_every_declared_python():
    """python_requires is honest: on every Python it admits, each extra's requirements apply or are skipped by a
    marker; torch and jax (no release for 3.9 at their bounds) carry one, nothing else needs one."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    cfg = setup_cfg()
    assert SpecifierSet(cfg["options"]["python_requires"]).contains("3.9")
    extras = {
        name: [Requirement(line) for line in value.strip().splitlines() if line.strip()]
        for name, value in cfg["options.extras_require"].items()
    }
    needs_310 = {"torch", "jax"}
    for name, reqs in extras.items():
        for req in reqs:
            on39 = req.marker is None or req.marker.evaluate({"python_version": "3.9", "extra": name})
            on310 = req.marker is None or req.marker.evaluate({"python_version": "3.10", "extra": name})
            assert on310, f"extra {name}: {req} is skipped on 3.10"
            assert on39 == (req.name not in needs_310), f"extra {name}: {req} on Python 3.9"
            assert not str(req.specifier).startswith("=="), f"extra {name}: {req} is an exact pin"
    for name in ("lint", "docs", "dist"):
        assert name in extras, f"setup.cfg: expected an extra {name!r}"
    assert {r.name for r in extras["lint"]} >= {"ruff", "mypy", "import-linter"}
    assert {r.name for r in extras["docs"]} >= {"sphinx", "numpydoc", "myst-parser", "matplotlib"}
    assert {r.name for r in extras["dist"]} >= {"build", "twine"}


# ----------------------------------------------------------------------------- the built distributions


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """``(sdist, wheel)``: from ``HPCCOLL_DIST_DIR`` when set, else built here."""
    version = package_version()
    where = os.environ.get("HPCCOLL_DIST_DIR", "").strip()
    if where:
        folder = Path(where)
    else:
        if find_spec("build") is None:
            pytest.skip("needs `build` (the dist extra: make dist, or pip install build) or HPCCOLL_DIST_DIR")
        folder = tmp_path_factory.mktemp("dist")
        # from a copy without build outputs: setuptools adds the files an old hpccoll.egg-info/SOURCES.txt
        # lists to the sdist, which would hide a file MANIFEST.in no longer takes
        tree = tmp_path_factory.mktemp("tree") / "hpccoll"
        shutil.copytree(ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(*BUILD_OUTPUTS))
        proc = subprocess.run(
            [sys.executable, "-m", "build", "--outdir", str(folder), str(tree)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"python -m build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    sdists = sorted(folder.glob(f"hpccoll-{version}.tar.gz"))
    wheels = sorted(folder.glob(f"hpccoll-{version}-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, (
        f"{folder}: expected one sdist and one wheel of hpccoll {version}; got {sorted(p.name for p in folder.iterdir())}"
    )
    return sdists[0], wheels[0]


def sdist_names(sdist: Path) -> set:
    prefix = sdist.name[: -len(".tar.gz")] + "/"
    with tarfile.open(sdist) as tar:
        return {m.name[len(prefix) :] for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix)}


@serial
def test_sdist_carries_what_make_test_needs(dists):
    names = sdist_names(dists[0])
    missing = [f for f in (*TOP, *NEEDED_BY_TESTS, "hpccoll/py.typed", "docs/conf.py") if f not in names]
    for top in GRAFTED:
        missing += sorted(source_files(top) - names)
    assert not missing, f"the sdist lacks {sorted(set(missing))}"
    junk = sorted(n for n in names if JUNK.search(n))
    assert not junk, f"the sdist carries build outputs or caches: {junk}"


@serial
def test_wheel_carries_the_package_license_and_marker(dists):
    with zipfile.ZipFile(dists[1]) as whl:
        names = set(whl.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(whl.read(f"{info}/METADATA").decode())
    assert "hpccoll/py.typed" in names
    assert f"{info}/licenses/LICENSE" in names or f"{info}/LICENSE" in names, sorted(n for n in names if info in n)
    package = {f for f in source_files("hpccoll") if f.endswith((".py", ".pyi", "py.typed"))}
    assert not package - names, f"the wheel lacks {sorted(package - names)}"
    outside = sorted(n for n in names if not n.startswith(("hpccoll/", f"{info}/")))
    assert not outside, f"the wheel carries files outside the package: {outside}"
    assert meta["Version"] == package_version()
    assert meta["License-Expression"] == "BSD-3-Clause", meta["License-Expression"]
    assert "LICENSE" in meta.get_all("License-File", [])
    assert meta["Requires-Python"] == ">=3.9"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL", []))
    assert {"Source", "Issues", "Documentation"} <= set(urls), urls
    assert not [c for c in meta.get_all("Classifier", []) if c.startswith("License ::")], "License classifiers"


@serial
def test_tests_run_from_the_unpacked_sdist(dists, tmp_path):
    """The sdist's own test files, conftest and package: a serial run of one test file from the unpacked sdist."""
    with tarfile.open(dists[0]) as tar:
        tar.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    unpacked = tmp_path / dists[0].name[: -len(".tar.gz")]
    env = child_env(drop=("HPCCOLL_DIST_DIR",))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--with-mpi", "-p", "no:cacheprovider", "-q", "tests/test_errors.py"],
        cwd=unpacked,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"\d+ passed", proc.stdout), proc.stdout[-1000:]
    # the run used the sdist's package (python -m puts the working directory first on sys.path)
    where = subprocess.run(
        [sys.executable, "-c", "import hpccoll; print(hpccoll.__file__)"],
        cwd=unpacked,
        env=env,
        capture_output=True,
        text=True,
    )
    assert Path(where.stdout.strip()).resolve().parent == (unpacked / "hpccoll").resolve(), where.stdout + where.stderr
