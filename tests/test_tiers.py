"""The quick tier (``make test``, tests/tiers.py) keeps every public collective, adjoint, transport and adapter
function at the rank count it runs at, and the tier rule names only tests that exist."""

from importlib.util import find_spec
from pathlib import Path

import pytest
import tiers
from conftest import TIER_KEY
from mpi4py import MPI

HERE = Path(__file__).resolve().parent

# at every rank count of `make test` (the check is per rank count; it does not communicate)
pytestmark = pytest.mark.mpi


def collected(request):
    """The session's whole collection and its quick tier; skips unless every test file was collected."""
    chosen = request.config.stash[TIER_KEY]
    files = {item.path.name for item in chosen["items"]} | chosen["skipped"]
    missing = sorted(p.name for p in HERE.glob("test_*.py") if p.name not in files)
    if missing:
        pytest.skip(f"needs the whole suite collected (make test); this run left out {', '.join(missing[:5])}")
    return chosen


def test_quick_tier_touches_every_collective_transport_and_adapter(request):
    chosen = collected(request)
    size = MPI.COMM_WORLD.size
    needed = tiers.required()
    # an adapter whose framework is not installed has no test that can run here (its test files skip whole)
    needed["adapter"] = [name for name in needed["adapter"] if find_spec(name.split(".", 1)[0]) is not None]
    have = set().union(*(tiers.touches(item, needed) for item in chosen["quick"] if tiers.runs(item, size)))
    want = {f"{kind}:{name}" for kind, names in needed.items() for name in names}
    assert not want - have, f"at {size} ranks the quick tier runs no test of {sorted(want - have)}"


def test_every_full_only_test_exists(request):
    chosen = collected(request)
    ids = {item.nodeid.split("[", 1)[0] for item in chosen["items"]}
    # a test file that skipped whole here (its framework not installed) has no items to compare
    gone = {n for n in set(tiers.FULL_ONLY) - ids if n.split("::", 1)[0].rsplit("/", 1)[-1] not in chosen["skipped"]}
    assert not gone, f"tests/tiers.py names tests that are gone: {gone}"
    assert any(tiers.full_only(item) for item in chosen["items"] if item.nodeid.startswith("tests/test_readme.py"))


def test_every_parameter_value_runs_in_the_quick_tier(request):
    chosen = collected(request)
    size = MPI.COMM_WORLD.size

    def values(items):
        return {
            (item.nodeid.split("[", 1)[0], name, tiers._key(value))
            for item in items
            if getattr(item, "callspec", None) is not None
            and not tiers.full_only(item)
            and (size == 1 or item.get_closest_marker("mpi"))
            for name, value in item.callspec.params.items()
        }

    lost = values(chosen["items"]) - values(chosen["quick"])
    assert not lost, f"parameter values that no quick test runs: {sorted(lost)[:10]}"
