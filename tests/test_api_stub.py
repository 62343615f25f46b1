"""``hpccoll/_api.pyi`` is what ``tests/gen_api_stub.py`` makes of ``hpccoll/_api.py``, and ``_api.py`` is type-checked.

mypy and IDEs read the stub in place of ``_api.py``: its overloads give ``async_op``'s result type and
``all_gather``'s list forms (tests/test_typing.py pins what a user's code sees). Since mypy then skips
``_api.py``, one test here runs mypy on ``_api.py`` itself. The drift test reads files only and runs at any rank
count (identically on every rank, with no collective); the mypy run is in the serial suite.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import os
import subprocess
import sys

import gen_api_stub
import pytest
from mpi4py import MPI

ROOT = gen_api_stub.ROOT


def test_the_stub_is_what_the_generator_makes_of_api_py():
    new = gen_api_stub.stub(gen_api_stub.SOURCE.read_text())
    old = gen_api_stub.STUB.read_text() if gen_api_stub.STUB.is_file() else ""
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "_api.pyi", "generated", n=1))
    # compared as syntax trees: ast.unparse's spelling may differ between Python versions, what it means may not
    assert ast.dump(ast.parse(old)) == ast.dump(ast.parse(new)), (
        f"hpccoll/_api.pyi is stale: run `{gen_api_stub.COMMAND}`\n{diff}"
    )


def test_the_stub_declares_every_name_api_py_exports():
    """mypy takes the stub's word for what hpccoll._api holds: a name the stub lacks is an error in user code."""
    import hpccoll._api as api

    tree = ast.parse(gen_api_stub.STUB.read_text())
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            declared.update(t.id for t in ast.walk(node) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store))
        elif isinstance(node, ast.ImportFrom):
            declared.update(alias.asname or alias.name for alias in node.names)
    assert set(api.__all__) <= declared, sorted(set(api.__all__) - declared)
    overloaded = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.decorator_list]
    functions = [getattr(api, n) for n in api.__all__ if inspect.isfunction(getattr(api, n))]
    takes_async_op = [f.__name__ for f in functions if "async_op" in inspect.signature(f).parameters]
    assert sorted(set(overloaded)) == sorted(takes_async_op)


#: The two functions of NONE_FORMS, as _api.py writes them: the generator's cases below add to them.
GATHERS = "".join(
    f"def {name}({first}: ArrayT, *, axis: Optional[int] = 0, sizes: Sizes = None, out: Optional[ArrayT] = None,"
    " async_op: bool = False) -> Union[ArrayT, Request[ArrayT]]: ...\n"
    for name, first in (("all_gather", "x"), ("all_gather_adjoint", "y"))
)


@pytest.mark.parametrize(
    "source, message",
    [
        (GATHERS + "PAIR = {1: 2}", "PAIR: annotate it in _api.py"),
        (GATHERS + "@overload\ndef f() -> int: ...", "f: write one plain signature"),
        (GATHERS + "def f(*, async_op: bool = False) -> int: ...", r"f: with async_op, expected a result Union\[R, "),
        (GATHERS + "import typing\nX: typing.Any", "import typing: use `from ... import`"),
        (GATHERS + "if X:\n    Y = int", "line 3: the generator does not know what a stub makes of 'if X:"),
        (GATHERS.replace("all_gather_adjoint", "g"), "NONE_FORMS names all_gather_adjoint, which _api.py does not"),
        (GATHERS.replace("sizes", "s"), r"NONE_FORMS\['all_gather'\]: all_gather has no \['sizes'\]"),
        (GATHERS.replace("Optional[int]", "int"), r"NONE_FORMS: expected an Optional\[...\] parameter; got 'int'"),
    ],
)
def test_the_generator_refuses_what_it_cannot_type(source, message):
    with pytest.raises(gen_api_stub.StubError, match=message):
        gen_api_stub.stub(source)


def test_async_op_and_the_none_forms_become_overloads():
    text = gen_api_stub.stub(
        GATHERS + "def f(x: int) -> int: ...\ndef g(*, async_op: bool) -> Union[A, Request[A]]: ..."
    )
    overloads = [part.replace("\n", "").replace("    ", "") for part in text.split("@overload")[1:]]
    assert len(overloads) == 10
    assert overloads[0].startswith("def all_gather(x: Array, *, axis: None, sizes: None = None,")
    assert overloads[0].endswith(
        "out: Optional[Sequence[Array]] = None, async_op: Literal[False] = False) -> List[Array]: ..."
    )
    assert overloads[1].endswith(
        "out: Optional[Sequence[Array]] = None, async_op: Literal[True]) -> Request[List[Array]]: ..."
    )
    assert overloads[2].startswith("def all_gather(x: ArrayT, *, axis: int = 0, sizes: Sizes = None,")
    assert overloads[2].endswith("async_op: Literal[False] = False) -> ArrayT: ...")
    assert overloads[3].endswith("async_op: Literal[True]) -> Request[ArrayT]: ...")
    assert overloads[4].startswith("def all_gather_adjoint(y: Sequence[Array], *, axis: None,")
    assert overloads[4].endswith(") -> Array: ...")
    assert overloads[8].startswith("def g(*, async_op: Literal[False] = False) -> A: ...")
    assert overloads[9].startswith("def g(*, async_op: Literal[True]) -> Request[A]: ...")
    assert "\ndef f(x: int) -> int: ...\n" in text
    assert "from typing import List, Literal, Optional, Sequence, overload\n" in text


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="mypy reads files only; runs in the serial suite")
def test_mypy_checks_the_bodies_of_api_py(tmp_path):
    """``make lint``'s mypy reads the stub for hpccoll._api; naming the ``.py`` makes mypy check it instead.

    ``--follow-imports=silent``: the modules _api imports are read but their errors are left to ``make lint``,
    as are those of the modules that import _api and would see its plain (Union) results here.
    """
    pytest.importorskip("mypy")
    cmd = [sys.executable, "-m", "mypy", "--follow-imports=silent", "--cache-dir", str(tmp_path), "hpccoll/_api.py"]
    got = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stdout + got.stderr
