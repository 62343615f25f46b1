"""What every adapter shares: replicate's maps, and the public functions derived from the pairs.

An adapter runs every pair one way: :meth:`hpccoll._api.Pair.bound` binds the
pair to an array's layout (its module's hooks, :mod:`hpccoll._spec`) and the
framework's linear-map machinery runs the two sides. The adapter writes out
the functions it documents itself; :func:`derive_missing` gives it one for
every other pair in :data:`hpccoll._api.PAIRS`, made by :func:`derive`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, List, MutableMapping, Tuple

from .._api import PAIRS, Pair, all_reduce
from .._comm import Communicator

__all__ = ["Apply", "replicate_maps", "derive", "derive_missing"]

#: A collective as the adapters see it: (forward, adjoint), each a function of one array.
Maps = Tuple[Callable[[Any], Any], Callable[[Any], Any]]

#: An adapter's one road: ``apply(pair, x, comm, **keywords)``, the pair's forward of ``x``, differentiable.
Apply = Callable[..., Any]


def replicate_maps(comm: Communicator) -> Maps:
    """Identity, whose adjoint (replicated value counted once) is the all-reduce with sum."""
    return identity, functools.partial(all_reduce, comm=comm, op="sum")


def identity(a: Any) -> Any:
    """``a`` itself (the forward of ``replicate``)."""
    return a


def signature(pair: Pair, array: Any) -> inspect.Signature:
    """An adapter's signature for ``pair``: the core forward's ``x``, ``comm`` and keyword-only parameters but
    ``out`` and ``async_op``, then the adjoint's own keywords; ``x`` and the result typed ``array``."""
    forward = list(inspect.signature(pair.forward).parameters.values())
    adjoint = inspect.signature(pair.adjoint).parameters
    keywords = pair.configuration + [p for name, p in adjoint.items() if name in pair.adjoint_only]
    return inspect.Signature([forward[0].replace(annotation=array), forward[1], *keywords], return_annotation=array)


def derive(pair: Pair, apply: Apply, array: Any, kind: str) -> Callable[..., Any]:
    """The public function of an adapter for ``pair``: ``apply(pair, x, comm, **keywords)`` with every keyword
    given or defaulted as :func:`signature` says, and a numpydoc docstring made from the core functions'.

    Parameters
    ----------
    pair : Pair
        The public pair.
    apply : callable
        The adapter's road: ``apply(pair, x, comm, **keywords)``.
    array : type
        The framework's array type (``torch.Tensor``), for the annotations.
    kind : str
        The framework's array in words (``"a tensor"``), for the docstring.

    Returns
    -------
    callable
        ``name(x, comm, *, ...)``, named as the pair's forward.
    """
    sig = signature(pair, array)
    x, comm = list(sig.parameters)[:2]

    def fn(*args: Any, **kwargs: Any) -> Any:
        given = sig.bind(*args, **kwargs)
        given.apply_defaults()
        keywords = dict(given.arguments)
        return apply(pair, keywords.pop(x), keywords.pop(comm), **keywords)

    fn.__name__ = fn.__qualname__ = pair.name
    fn.__signature__ = sig  # type: ignore[attr-defined]
    fn.__doc__ = _docstring(pair, sig, getattr(array, "__qualname__", str(array)), kind)
    return fn


def derive_missing(namespace: MutableMapping[str, Any], apply: Apply, array: Any, kind: str) -> List[str]:
    """Add to an adapter module's ``namespace`` (its ``globals()``) and ``__all__`` a function :func:`derive`\\ d
    for every pair it does not define itself (by ``__all__``); the names added."""
    public = namespace["__all__"]
    added = [pair.name for pair in PAIRS if pair.name not in public]
    for name in added:
        fn = derive(next(p for p in PAIRS if p.name == name), apply, array, kind)
        fn.__module__ = namespace["__name__"]
        namespace[name] = fn
        public.append(name)
    return added


def _docstring(pair: Pair, sig: inspect.Signature, array: str, kind: str) -> str:
    forward, adjoint = pair.name, pair.adjoint.__name__
    entries = pair.documented()
    names = list(sig.parameters)
    lines = [
        f"Differentiable :func:`hpccoll.{forward}` of {kind}; backward: :func:`hpccoll.{adjoint}`.",
        "",
        "Parameters",
        "----------",
        f"{names[0]} : {array}",
        f"    This rank's input, as for :func:`hpccoll.{forward}`.",
    ]
    written: List[str] = []
    for name in names[1:]:
        entry = entries.get(name, f"{name}\n    As for :func:`hpccoll.{forward}`.")
        if entry not in written:  # one entry may describe two parameters ("split_axis, concat_axis : int")
            written.append(entry)
    lines += written
    lines += ["", "Returns", "-------", array, f"    This rank's result of :func:`hpccoll.{forward}`.", ""]
    return "\n".join(lines)
