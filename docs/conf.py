"""Sphinx configuration: the API reference (autodoc + numpydoc), the guides (MyST) and the benchmark plots.

``make docs`` builds it twice with warnings as errors: ``-b html`` (the site) and ``-b doctest`` (every
``>>>`` example in the public docstrings and in the pages). Needs only the ``docs`` extra: the optional
frameworks the adapters import are mocked (torch, autograd, CuPy) or in the extra (JAX, SciPy).
"""

import os
import sys
from typing import Any, Optional, Tuple

from sphinx.application import Sphinx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # hpccoll from this checkout, installed or not
sys.path.insert(0, os.path.join(HERE, "_ext"))

import hpccoll  # noqa: E402

project = "hpccoll"
author = "the hpccoll developers"
copyright = "the hpccoll developers"
release = hpccoll.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "numpydoc",
    "benchplots",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

html_theme = "alabaster"
html_static_path: list = []
html_title = f"hpccoll {release}"
html_theme_options = {"description": "Array-level MPI/NCCL collectives with adjoints", "fixed_sidebar": True}

# MyST: anchors for the headings the guides link to (``[x](#some-heading)``, ``[x](gpu.md#install)``).
myst_heading_anchors = 4

# autodoc: signatures as written (type hints in them, not repeated in the text); members in source order.
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
# Defaults as written in the source (``np.float64``, not ``<class 'numpy.float64'>``, which breaks the signature).
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True, "show-inheritance": True}
# NumPy's typing aliases by name, not as the unions they stand for.
autodoc_type_aliases = {"npt.DTypeLike": "numpy.typing.DTypeLike", "npt.ArrayLike": "numpy.typing.ArrayLike"}
# The adapters import their framework at import time and CuPy is imported inside the GPU transports. torch,
# autograd and CuPy are mocked (also where they are installed, so that every build sees the same thing). JAX
# cannot be: hpccoll.adapters.jax traces a function and registers rules with JAX when it is imported, so the
# docs extra installs JAX (and with it SciPy, which JAX needs, and which the SciPy adapter subclasses).
autodoc_mock_imports = ["torch", "autograd", "cupy", "cupyx", "cupy_backends"]

# numpydoc: every check but the extended summary (ES01), examples (EX01) and See Also (SA01), on the public
# API only (private names, dunder methods included, are not validated).
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks = {"all", "ES01", "EX01", "SA01"}
# A typing.Protocol's signature is (*args, **kwargs) but it takes no arguments: its docstring has none to list.
numpydoc_validation_exclude = {r"\._", r"^hpccoll\.adapters\.scipy\.LinearMap$"}

# doctest: the ``>>>`` blocks of the docstrings (and of the pages) run at one rank, no mpiexec needed.
doctest_test_doctest_blocks = "default"
doctest_global_setup = """
import numpy as np
import hpccoll
from hpccoll import *
from hpccoll.testing import dottest
"""

# benchplots: docs/bench/*.json drawn (by the pages that show them) into _build/benchplots/, which `make docs`
# removes with the rest of _build before it builds.
benchplots_source = "bench"
benchplots_output = "_build/benchplots"


def _init_signature(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: Optional[str],
    return_annotation: Optional[str],
) -> Optional[Tuple[str, Optional[str]]]:
    """A class whose base hides its ``__init__`` behind ``__new__(*args, **kwargs)`` (SciPy's LinearOperator)
    gets the signature of its own ``__init__``; a ``typing.Protocol`` (never instantiated) gets none."""
    if what != "class" or signature != "(*args, **kwargs)":
        return None
    if getattr(obj, "_is_protocol", False):
        return "", return_annotation
    if "__init__" in vars(obj):
        from sphinx.util import inspect as sphinx_inspect

        sig = sphinx_inspect.signature(obj.__init__, bound_method=True, type_aliases=app.config.autodoc_type_aliases)
        return sphinx_inspect.stringify_signature(sig, show_return_annotation=False), return_annotation
    return None


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-signature", _init_signature)
