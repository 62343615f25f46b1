"""The test tiers: which tests ``make test`` runs (quick) and which only the full matrix adds (rest).

``make test`` proves the install: every collective and its adjoint, every transport and every adapter
function, serially and at 2, 3 and 4 ranks, in minutes. ``make test-all`` runs everything. The rule,
applied to the collected items in collection order (:func:`quick_tier`):

1. A test in :data:`FULL_ONLY` is in the full matrix only. These are the tests that prove something other
   than the install (a sub-suite re-run through simulated nodes, a memory bound, a benchmark's command
   line), and each costs tens of seconds to minutes.
2. A test without the ``mpi`` marker (pytest-mpi's: it does not communicate) runs in the quick tier serially
   only: at several ranks each rank would repeat the same work. Other tests without parameters are in it.
3. Of a parametrized test (its items share a node id up to ``[``), an item is in the quick tier when it
   brings a value of one of its parameters (by its repr) that the test's earlier
   quick items did not have, or a public function, transport or adapter function (:func:`touches`) that no
   earlier quick item of the whole suite touched. So every dtype, op, size pattern, layout, transport and
   form that a product names runs once in the quick tier; the full matrix runs every combination. (An
   item counts for the names it touches only at a rank count it runs at: ``mpi(min_size=N)``.)

The rule reads only what collection gives (node ids, parameter values, markers, the tests' source) and the
number of ranks, so it chooses the same items on every rank: a skip that differed between ranks around a collective would hang
the others. ``--tier`` picks what runs: ``quick`` (``make test``), ``rest`` (what quick leaves out) or
``all`` (the default; ``make test-all``). tests/test_tiers.py checks that the quick tier still touches
every public collective, adjoint, transport and adapter function at the rank count it runs at. ``rest`` is
everything else at that rank count, so ``make test`` then ``make test-rest`` run each test once.
"""

from __future__ import annotations

import functools
import inspect
import re

import hpccoll

TIERS = ("quick", "rest", "all")

#: Tests the full matrix runs and ``make test`` does not: node id (without parameters) -> why.
FULL_ONLY = {
    "tests/test_shm.py::test_hierarchical_simulated_nodes": (
        "re-runs four collective test files at 3 and 4 ranks through shm across simulated nodes: the node "
        "logic of multi-node jobs (5-6 minutes of the serial run); one node's shm runs in the quick tier"
    ),
    "tests/test_rooted_shm.py::test_rooted_on_simulated_nodes": (
        "the rooted collectives through shm across simulated nodes (over a minute of the serial run)"
    ),
    "tests/test_resources.py::test_peak_memory_within_bound_at_1_mib": (
        "a memory bound, measured over many rounds (about 45 s of the serial run), not the install"
    ),
    # JAX's transformations composed over the collectives, beyond the grad, vjp, jvp, transpose and vmap that
    # the quick tier runs for every collective: compiling them is a third of the quick tier's time at 2 ranks
    "tests/test_jax_adapter.py::test_jacfwd_and_jacrev_match_serial": "Jacobians in both modes, every collective",
    "tests/test_jax_adapter.py::test_hessian_matches_serial": "a Hessian through an all-gather and an all-reduce",
    "tests/test_jax_adapter.py::test_second_order_and_jvp_of_grad": "second derivatives and the jvp of a grad",
    "tests/test_jax_adapter.py::test_same_gradients_as_autograd_and_torch": "JAX against autograd and torch",
}

#: README commands that measure (``hpccoll bench``, ``hpccoll tune``): they prove the printed command line,
#: which the full matrix runs; the quick tier runs the README's other commands.
FULL_ONLY_COMMANDS = re.compile(r"\bhpccoll (bench|tune)\b")

#: Frameworks whose adapter module lists its public functions in ``__all__``.
ADAPTERS = ("torch", "jax", "autograd", "scipy")


def required():
    """What the quick tier must touch at every rank count: ``{kind: names}``.

    The collectives are the public functions with an ``_adjoint`` twin, and those twins; the transports are
    ``hpccoll.TRANSPORTS``; the adapter functions are ``framework.name`` for each name in the adapter
    module's ``__all__`` (its framework need not be installed: the list is read from the module's source).
    """
    pairs = [n for n in hpccoll.__all__ if f"{n}_adjoint" in hpccoll.__all__]
    return {
        "collective": sorted(pairs + [f"{n}_adjoint" for n in pairs]),
        "transport": sorted(hpccoll.TRANSPORTS),
        "adapter": sorted(f"{fw}.{name}" for fw in ADAPTERS for name in adapter_all(fw)),
    }


def adapter_all(framework):
    """``hpccoll.adapters.<framework>.__all__``, read from its source (importing it needs the framework)."""
    import ast
    from pathlib import Path

    import hpccoll.adapters

    path = Path(hpccoll.adapters.__file__).with_name(f"{framework}.py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                return list(ast.literal_eval(node.value))
    raise LookupError(f"{path}: expected an __all__ list")


def _tokens(text):
    """``(words, quoted strings, lower-case letter runs)`` of ``text``: what :func:`touches` matches."""
    return (
        set(re.findall(r"\w+", text)),
        set(re.findall(r"[\"']([a-z_]+)[\"']", text)),
        set(re.findall(r"[a-z]+", text.lower())),
    )


@functools.lru_cache(maxsize=None)
def _source_tokens(function, filename):
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        source = ""
    return _tokens(f"{source}\n{filename}")


def touches(item, needed):
    """The names of ``needed`` (:func:`required`) that ``item`` names in its source, its file name or its
    parameters: a collective as a word, a transport as a quoted string (``transport="shm"``) and an adapter
    function as its name together with its framework's."""
    words, quoted, pieces = _source_tokens(getattr(item, "function", None), item.path.name)
    spec = getattr(item, "callspec", None)
    if spec is not None:
        values = [getattr(v, "__name__", None) for v in spec.params.values()]
        text = "\n".join(
            [n if isinstance(n, str) else repr(v)[:200] for n, v in zip(values, spec.params.values())] + [spec.id]
        )
        more = _tokens(text)
        words, quoted, pieces = words | more[0], quoted | more[1], pieces | more[2]
    found = {f"collective:{n}" for n in needed["collective"] if n in words}
    found |= {f"transport:{n}" for n in needed["transport"] if n in quoted}
    for full in needed["adapter"]:
        fw, name = full.split(".")
        if fw in pieces and name in words:
            found.add(f"adapter:{full}")
    return found


def full_only(item):
    """Why ``item`` is in the full matrix only (rule 1), or None."""
    base = item.nodeid.split("[", 1)[0]
    if base in FULL_ONLY:
        return FULL_ONLY[base]
    spec = getattr(item, "callspec", None)
    command = spec.params.get("command") if spec is not None else None
    if base.startswith("tests/test_readme.py::") and isinstance(command, str) and FULL_ONLY_COMMANDS.search(command):
        return "a README command that measures: the full matrix runs it"
    return None


def runs(item, size):
    """Whether ``item`` runs at ``size`` ranks on a machine without a GPU: not a ``gpu`` or ``large`` test, no
    true ``skipif``, and ``size`` at least its ``mpi`` marker's ``min_size``."""
    if item.get_closest_marker("gpu") or item.get_closest_marker("large"):
        return False
    if any(m.args and m.args[0] is True for m in item.iter_markers("skipif")):
        return False
    return size >= max([m.kwargs.get("min_size", 1) for m in item.iter_markers("mpi")] or [1])


def _key(value):
    """A parameter value as a comparable key: its repr (equal values, equal keys, within one process)."""
    return repr(value)[:500]


def quick_tier(items, size):
    """The items of ``items`` that ``make test`` runs at ``size`` ranks (the module's rule), in their order."""
    needed = required()
    quick, seen_values, seen_names = [], {}, set()
    for item in items:
        if full_only(item) or (size > 1 and item.get_closest_marker("mpi") is None):
            continue
        spec = getattr(item, "callspec", None)
        names = touches(item, needed) if runs(item, size) else set()
        values = seen_values.setdefault(item.nodeid.split("[", 1)[0], set())
        mine = {(name, _key(value)) for name, value in spec.params.items()} if spec is not None else set()
        if spec is None or mine - values or names - seen_names:
            quick.append(item)
            values |= mine
            seen_names |= names
    return quick
