"""The docs' claims about the code, checked against the code, so that neither drifts from the other.

- docs/diagnostics.md's table "What ``Plan.methods`` says": each row's plan is made here, at the suite's rank
  count, and its ``p.methods`` compared with the row's; every row has a case here and every case a row. No
  other page (README.md, docs/*.md) states a ``Plan.methods`` value: such a claim lives in the table.
- docs/autodiff.md's table of adapter functions: each row is its module's ``__all__`` (read from the source,
  so that no framework needs to be installed).
- docs/gpu.md's opening names the collectives that take CuPy arrays: the pairs of ``hpccoll._api.PAIRS``, each
  forward and adjoint run here on the CuPy stand-in (tests/standin_cupy.py) and compared with NumPy's result.

Every verdict is collective (:func:`conftest.agree`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
import standin_cupy as cp
from conftest import agree
from test_nccl_standin import dev, fresh, gpu, host, runtime  # noqa: F401 (fixtures)

import hpccoll
from hpccoll._api import PAIRS

ROOT = Path(__file__).resolve().parent.parent
DIAGNOSTICS = ROOT / "docs" / "diagnostics.md"
AUTODIFF = ROOT / "docs" / "autodiff.md"
GPU = ROOT / "docs" / "gpu.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]

#: A ``Plan.methods`` value written in a code span: ``("persistent",)``, ``('call',)``, ...
METHODS_SPAN = re.compile(r"`[^`\n]*\(\s*[\"'](?:persistent|blocking|call)[\"']\s*,[^`\n]*\)[^`\n]*`")
SPAN = re.compile(r"`([^`\n]+)`")


def table_after(path: Path, heading: str) -> list:
    """The rows (lists of cell texts) of the first Markdown table after ``heading`` in ``path``, with the line
    each row is on."""
    lines = path.read_text().splitlines()
    start = lines.index(heading)
    rows, seen = [], False
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("|"):
            seen = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):  # not the rule under the header
                rows.append((number, cells))
        elif seen:
            break
    assert len(rows) > 1, f"{path.name}: expected a table after {heading!r}"
    return rows[1:]  # without the header


# ----------------------------------------------------------------------------- Plan.methods

METHODS_HEADING = "### What `Plan.methods` says"
ANY = ("auto", "persistent", "blocking")


def methods_rows() -> list:
    """``(line, the plan, the methods it is made with, the p.methods values the row allows)`` of the table."""
    out = []
    for line, (case, method, says) in table_after(DIAGNOSTICS, METHODS_HEADING):
        methods = ANY if method == "any" else (ast.literal_eval(method.strip("`")),)
        allowed = {ast.literal_eval(span) for span in SPAN.findall(says)}
        out.append((line, case, methods, allowed))
    return out


def _z(c, *shape, dtype=float):
    """Data of ``shape`` that differs by rank."""
    return (np.arange(int(np.prod(shape)), dtype=float).reshape(shape) + c.rank).astype(dtype)


def _sends_own_memory(c):
    """Plans whose calls send ``x``'s own memory: a reduction, a gather along an inner axis (derived datatypes),
    a rooted collective."""
    P = c.size
    return [("all_reduce", _z(c, 4), {}), ("all_gather", _z(c, 3, 2), {"axis": 1}), ("broadcast", _z(c, 4), {})], P > 1


def _own_memory(c):
    plans, several = _sends_own_memory(c)
    return plans, several and c.host_transport().persistent  # an MPI without persistent collectives: the next row


def _no_persistent(c):
    c.host_transport().persistent = False  # what an MPI without MPI_Allreduce_init reports
    return _sends_own_memory(c)


def _uneven_all_to_all(c):
    return [("all_to_all", _z(c, 2 * c.size + 1, 2), {})], 1 < c.size <= 8


def _halo_and_shift(c):
    """Several ranks: a halo exchange on a grid of every rank and a shift; one rank: a periodic halo exchange."""
    grid = c.cartesian([0, 0], periodic=(True, c.size > 1))
    x = _z(c, 6, 5)
    plans = [("halo_exchange", x, {"halo": 1, "out": x}), ("halo_exchange_adjoint", x, {"halo": 1, "out": x})]
    if c.size > 1:
        plans += [("shift", _z(c, 4), {}), ("shift_adjoint", _z(c, 4), {"offset": -1})]
    return [(name, x, dict(options, comm=grid)) for name, x, options in plans], True


def _watched(c):
    c.timeout = 600.0  # as HPCCOLL_TIMEOUT=600 sets it: a watchdog that never fires here
    plans, several = _sends_own_memory(c)
    more, _ = _halo_and_shift(c)
    return (plans if several else []) + more, True


def _shm(c):
    return [("all_reduce", _z(c, 4), {"comm": hpccoll.Communicator(c.mpi, transport="shm")})], c.size > 1


def _one_rank(c):
    one = c.split(c.rank)
    line = one.cartesian([1], periodic=False)
    x = _z(one, 6, 2)
    plans = [(pair.forward.__name__, _z(one, 3, 2), {"comm": one}) for pair in PAIRS[:8]]
    plans += [("shift", _z(one, 4), {"comm": one}), ("halo_exchange", x, {"halo": 1, "out": x, "comm": line})]
    return plans, True


def _nothing_to_replay(c):
    P = c.size
    return [
        ("all_reduce", _z(c, 8)[::2], {}),
        ("all_gather", _z(c, 8, 2)[::2], {}),
        ("all_reduce", [_z(c, 4), _z(c, 3)], {}),
        ("reduce_scatter", _z(c, 3, 2 * P), {"axis": 1}),
        ("all_reduce", _z(c, 4, dtype=np.float16), {}),
    ], True


#: The table's first column -> the plans its row is about (``(collective, x, options)``; ``comm`` among the
#: options when not the test's communicator) and whether the row applies at this rank count.
CASES = {
    "a collective that sends `x`'s own memory (contiguous `x`), several ranks": _own_memory,
    "the same on an MPI without persistent collectives (before MPI-4)": _no_persistent,
    "an all-to-all of uneven blocks (point-to-point pairs, at most 8 ranks)": _uneven_all_to_all,
    "`halo_exchange`, `shift` and their adjoints where a message moves (several ranks, or one rank on a periodic "
    "grid)": _halo_and_shift,
    "any plan that moves a message while `HPCCOLL_TIMEOUT` is set": _watched,
    'a collective that `shm` moves (`transport="shm"`, several ranks)': _shm,
    "one rank, where nothing moves (any collective but a halo exchange on a periodic grid)": _one_rank,
    "a strided `x`, a list of arrays, a reduce-scatter along an inner axis, a float16 reduction": _nothing_to_replay,
}


def test_every_row_has_a_case():
    rows = {case for _, case, _, _ in methods_rows()}
    assert rows == set(CASES), (
        f"docs/diagnostics.md's {METHODS_HEADING!r} rows without a case here: {sorted(rows - set(CASES))}; "
        f"cases here without a row: {sorted(set(CASES) - rows)}"
    )


@pytest.mark.mpi
@pytest.mark.parametrize("line, case, methods, allowed", methods_rows(), ids=[f"L{r[0]}" for r in methods_rows()])
def test_plan_methods_as_documented(comm, line, case, methods, allowed):
    c = hpccoll.Communicator(comm.mpi)  # its own: some cases change its settings
    plans, applies = CASES[case](c)
    errors, made = [], []
    for name, x, options in plans:
        options = dict(options)
        on = options.pop("comm", c)
        if on is not c and on not in made:
            made.append(on)
        for method in methods if applies else ():
            with hpccoll.plan(name, x, on, method=method, **options) as p:
                if p.methods not in allowed:
                    errors.append(f"{name} {options} method={method!r}: p.methods {p.methods}")
    for other in reversed(made):
        other.free()
    c.free()
    agree(comm, not errors, lambda: f"docs/diagnostics.md:{line} says {sorted(allowed)}; got " + "; ".join(errors))


def test_no_methods_claim_outside_the_table():
    """A ``Plan.methods`` value in a code span anywhere but the table is a claim this test does not check."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        table = set()
        if page == DIAGNOSTICS:
            table = {line for line, _, _, _ in methods_rows()}
        for number, text in enumerate(lines, 1):
            if number not in table and METHODS_SPAN.search(text):
                found.append(f"{page.relative_to(ROOT)}:{number}: {text.strip()}")
    assert not found, "Plan.methods values stated outside docs/diagnostics.md's table:\n" + "\n".join(found)


# ----------------------------------------------------------------------------- the adapters' functions

ADAPTERS_HEADING = "### Every adapter's functions"


def module_all(path: Path) -> list:
    """``__all__`` of a module, read from its source (importing it would need its framework)."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{path}: no __all__")


def exported(adapter: str) -> list:
    """An adapter's ``__all__`` once imported: its source's, then the pairs it derives (``derive_missing``
    appends every public pair the module does not write out, in the order of ``PAIRS``)."""
    written = module_all(ROOT / "hpccoll" / "adapters" / f"{adapter}.py")
    if adapter == "scipy":
        return written
    return written + [pair.name for pair in PAIRS if pair.name not in written]


def test_adapter_lists_are_the_adapters():
    rows = table_after(AUTODIFF, ADAPTERS_HEADING)
    adapters = sorted(p.stem for p in (ROOT / "hpccoll" / "adapters").glob("[!_]*.py"))
    documented = {}
    for line, (module, names) in rows:
        documented[module.strip("`")] = (line, SPAN.findall(names))
    assert sorted(documented) == [f"hpccoll.adapters.{a}" for a in adapters], documented
    for adapter in adapters:
        line, names = documented[f"hpccoll.adapters.{adapter}"]
        want = exported(adapter)
        assert names == want, (
            f"docs/autodiff.md:{line}: hpccoll.adapters.{adapter} lists {names}; its __all__ is {want}"
        )


def test_differentiable_adapters_have_every_collective():
    """docs/autodiff.md and the README: autograd, JAX and PyTorch each have the ten collectives and ``replicate``."""
    want = {pair.forward.__name__ for pair in PAIRS} | {"replicate"}
    for adapter in ("autograd", "jax", "torch"):
        missing = want - set(exported(adapter))
        assert not missing, f"hpccoll.adapters.{adapter} lacks {sorted(missing)}"


# ----------------------------------------------------------------------------- CuPy arrays


def gpu_opening_names() -> list:
    """The function names in docs/gpu.md's first paragraph."""
    text = GPU.read_text().split("\n\n")[1]
    return [span for span in SPAN.findall(text) if span.isidentifier()]


def test_gpu_opening_names_every_collective():
    forwards = [pair.forward.__name__ for pair in PAIRS]
    assert gpu_opening_names() == forwards, f"docs/gpu.md's opening names {gpu_opening_names()}; PAIRS: {forwards}"


def _gpu_calls(c, grid):
    """``(name, function, x, options)``: every collective and adjoint on a small input of this rank."""
    P, me = c.size, c.rank
    z = (np.arange(6 * P, dtype=float) + me).reshape(2 * P, 3)
    root_x = z if me == 0 else z[:0]
    field = np.arange(12.0).reshape(4, 3) + me  # two owned rows between two ghost rows
    inputs = {
        "gather_adjoint": (root_x, {"sizes": [2] * P}),
        "scatter": (root_x, {}),
        "halo_exchange": (field, {"halo": 1}),
        "halo_exchange_adjoint": (field, {"halo": 1}),
        "permute": (z, {"perm": [(q, (q + 1) % P) for q in range(P)]}),
        "permute_adjoint": (z, {"perm": [(q, (q + 1) % P) for q in range(P)]}),
    }
    for pair in PAIRS:
        for fn in (pair.forward, pair.adjoint):
            x, options = inputs.get(fn.__name__, (z, {}))
            yield fn.__name__, fn, x, dict(options, comm=grid if "halo" in fn.__name__ else c)


@pytest.mark.mpi
def test_every_collective_takes_cupy_arrays(gpu, comm):  # noqa: F811 (the fixtures imported above)
    """Each collective and adjoint on stand-in CuPy arrays over the NCCL stand-in: a CuPy result equal to the
    same call's on NumPy arrays over host MPI."""
    errors = []
    with gpu.cartesian([0], periodic=True) as dgrid, comm.cartesian([0], periodic=True) as hgrid:
        device = list(_gpu_calls(gpu, dgrid))
        for (name, fn, x, options), (_, _, _, host_options) in zip(device, _gpu_calls(comm, hgrid)):
            got = fn(dev(x), **options)
            want = fn(x, **host_options)
            if not isinstance(got, cp.ndarray):
                errors.append(f"{name}: returned {type(got).__name__}, expected a CuPy array")
            elif not np.allclose(host(got), want):
                errors.append(f"{name}: {host(got)} on CuPy, {want} on NumPy")
    agree(comm, not errors, lambda: "; ".join(errors))
