"""The public API's types and docstrings: ``py.typed``, the array types in the signatures, what mypy makes of a
user's code, and numpydoc validation of every public docstring.

Serial only (no collective runs: mypy and numpydoc read the code). The mypy and numpydoc tests need the lint
and docs extras (``make venv-dev``); without them they skip.
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import List

import numpy as np
import pytest

import hpccoll
from hpccoll import _arrays

ROOT = Path(__file__).resolve().parent.parent

FUNCTIONS = [
    hpccoll.all_gather,
    hpccoll.all_gather_adjoint,
    hpccoll.reduce_scatter,
    hpccoll.reduce_scatter_adjoint,
    hpccoll.all_reduce,
    hpccoll.all_reduce_adjoint,
    hpccoll.all_to_all,
    hpccoll.all_to_all_adjoint,
]


def test_py_typed_ships_with_the_package():
    assert (Path(hpccoll.__file__).parent / "py.typed").is_file()


def test_the_array_alias_covers_numpy_and_names_cupy_without_importing_it():
    assert np.ndarray in typing.get_args(_arrays.Array)
    assert "cupy.ndarray" in repr(_arrays.Array)
    assert _arrays.ArrayT.__constraints__ == (typing.Sequence[_arrays.Array], _arrays.Array)
    code = "import sys, hpccoll, hpccoll._arrays; sys.exit('cupy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_collectives_take_and_return_the_array_type(fn):
    sig = inspect.signature(fn)
    first = next(iter(sig.parameters.values()))
    assert first.annotation == "ArrayT"
    assert sig.parameters["comm"].annotation == "CommLike"
    assert "ArrayT" in sig.parameters["out"].annotation
    assert sig.return_annotation == "Union[ArrayT, Request[ArrayT]]"
    assert "Any" not in str(sig)


@pytest.mark.parametrize("name", ["forward", "adjoint", "__call__"])
def test_operators_take_and_return_the_array_type(name):
    sig = inspect.signature(getattr(hpccoll.AllGather, name))
    assert sig.return_annotation == "ArrayT"
    assert [p.annotation for p in list(sig.parameters.values())[1:]] == ["ArrayT", "Optional[ArrayT]"]


def test_request_wait_returns_the_result_type():
    assert inspect.signature(hpccoll.Request.wait).return_annotation == "ResultT"
    assert hpccoll.Request.completed(np.ones(2)).wait().shape == (2,)


# --------------------------------------------------------------------------- mypy on a user's code

USER_CODE = """\
import numpy as np
import hpccoll

x = np.ones(3)
y: np.ndarray = hpccoll.all_gather(x, axis=0)
ys = hpccoll.reduce_scatter([x, x])
first: np.ndarray = ys[0]
req = hpccoll.all_reduce(x, async_op=True)
z: np.ndarray = req.wait()
op = hpccoll.AllToAll(split_axis=0, concat_axis=0)
back: np.ndarray = op.H(op(x))
f = hpccoll.adjoint_of(hpccoll.all_gather)
g = hpccoll.adjoint_of(hpccoll.AllGather())
h: hpccoll.Operator = g
bad_axis = hpccoll.all_gather(x, axis="0")  # E: call-overload
not_a_request = hpccoll.all_reduce(x).wait()  # E: union-attr
not_an_int: int = hpccoll.all_to_all(x)  # E: assignment
list_form_has_no_shape = ys.shape  # E: attr-defined
bad_sizes = hpccoll.all_gather(x, sizes=3)  # E: call-overload
"""


def test_mypy_sees_the_public_types_in_user_code(tmp_path):
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(USER_CODE)
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--no-error-summary",
        "--show-error-codes",
        "--hide-error-context",
        "--follow-imports=silent",  # hpccoll's own errors are `make lint`'s; here only the user's code
        "--cache-dir",
        str(tmp_path / "cache"),
        "--python-version",
        "3.10",
        str(tmp_path / "user.py"),
    ]
    env = dict(os.environ, MYPYPATH=str(ROOT))
    got = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    found = set()
    for line in got.stdout.splitlines():
        if ": error:" in line:
            lineno = int(line.split(":")[1])
            code = line.rsplit("[", 1)[-1].rstrip("]")
            found.add((lineno, code))
    expected = {
        (i, line.split("# E: ")[1]) for i, line in enumerate(USER_CODE.splitlines(), start=1) if "# E: " in line
    }
    assert found == expected, got.stdout + got.stderr


# --------------------------------------------------------------------------- numpydoc

#: Checks the Sphinx build leaves out as well (docs/conf.py): extended summary, examples, see also.
NUMPYDOC_IGNORE = {"ES01", "EX01", "SA01"}
PUBLIC_MODULES = [
    "hpccoll",
    "hpccoll.testing",
    "hpccoll.transports",
    "hpccoll.adapters.autograd",
    "hpccoll.adapters.jax",
    "hpccoll.adapters.scipy",
    "hpccoll.adapters.torch",
]
#: The public names of hpccoll.transports (its __all__ holds the registry's internals too).
TRANSPORT_NAMES = ["Transport", "register", "unregister"]


def _members(qualname: str, cls: type) -> List[str]:
    """The public methods and properties of ``cls`` that hpccoll defines (its own and its hpccoll bases')."""
    names: List[str] = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("hpccoll"):
            continue
        for attr, val in vars(klass).items():
            routine = isinstance(val, (staticmethod, classmethod, property)) or inspect.isfunction(val)
            if routine and not attr.startswith("_") and f"{qualname}.{attr}" not in names:
                names.append(f"{qualname}.{attr}")
    return names


def public_objects() -> List[str]:
    """Every public function, class and method reachable from the public modules' ``__all__``."""
    names: List[str] = []
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(modname)
        for name in TRANSPORT_NAMES if modname == "hpccoll.transports" else module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(inspect.unwrap(obj)):  # unwrap: split_sizes is an lru_cache wrapper
                names.append(f"{modname}.{name}")
            elif inspect.isclass(obj):
                names.append(f"{modname}.{name}")
                names += _members(f"{modname}.{name}", obj)
    return names


def numpydoc_errors() -> List[str]:
    from numpydoc.validate import validate
    from sphinx.ext.autodoc.mock import mock

    errors = []
    before = set(sys.modules)
    try:
        with mock(["torch", "autograd", "cupy", "cupyx", "cupy_backends"]):  # as Sphinx does (docs/conf.py)
            for name in public_objects():
                for code, message in validate(name)["errors"]:
                    if code not in NUMPYDOC_IGNORE:
                        errors.append(f"{name}: {code} {message}")
    finally:  # hpccoll's modules imported on the mocks (the adapters) go: a later test imports them anew
        for module in set(sys.modules) - before:
            if module.startswith("hpccoll."):
                del sys.modules[module]
    return errors


def test_public_docstrings_are_numpydoc_valid():
    pytest.importorskip("numpydoc")
    pytest.importorskip("sphinx")
    errors = numpydoc_errors()
    assert not errors, "\n".join(errors)


if __name__ == "__main__":  # python tests/test_typing.py: the numpydoc findings, one a line, and their count
    found = numpydoc_errors()
    print("\n".join(found))
    print(f"{len(found)} numpydoc errors")
