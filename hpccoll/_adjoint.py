"""``adjoint_of``: the adjoint of a collective, for hand-written reverse passes and tape systems."""

from __future__ import annotations

import functools
from typing import Any, Callable, Union, overload

from . import _api
from ._api import pair_of
from ._errors import ArgumentError
from ._operators import Operator

__all__ = ["adjoint_of"]


@overload
def adjoint_of(fn_or_operator: Operator) -> Operator: ...
@overload
def adjoint_of(fn_or_operator: Callable[..., Any]) -> Callable[..., Any]: ...
def adjoint_of(fn_or_operator: Union[Operator, Callable[..., Any]]) -> Union[Operator, Callable[..., Any]]:
    """The adjoint of a collective function or operator, under the inner product summed over ranks.

    A reverse pass written by hand (or a tape-based autodiff system) can record
    which collective ran in the forward pass and look its adjoint up here, with
    no table of its own.

    Parameters
    ----------
    fn_or_operator : callable or Operator
        One of hpccoll's collectives (:func:`~hpccoll.all_gather`,
        :func:`~hpccoll.shift`, ...: every pair of ``hpccoll._api.PAIRS``)
        or their ``*_adjoint`` functions; a
        :class:`functools.partial` of one of them (its bound arguments carry
        over, see Notes); or an :class:`~hpccoll.Operator`.

    Returns
    -------
    callable or Operator
        The adjoint function (``adjoint_of(all_gather) is all_gather_adjoint``
        and ``adjoint_of(all_gather_adjoint) is all_gather``), a new
        :class:`functools.partial` of it, or ``op.H`` for an operator.

    Raises
    ------
    ArgumentError
        ``fn_or_operator`` is not one of hpccoll's collectives, or is a partial
        that binds ``out`` (the adjoint's result has another shape).

    Notes
    -----
    For partials, ``comm``, ``axis``, ``sizes`` and ``op`` (for
    all-to-all ``split_axis``, ``concat_axis``, ``sizes`` and ``recv_sizes``)
    carry over to the adjoint. ``cotangent`` is an argument of :func:`~hpccoll.all_reduce_adjoint`
    only: it is dropped when going from ``all_reduce_adjoint`` to
    ``all_reduce``; to choose the convention of the adjoint of
    ``all_reduce``, bind it on the result, e.g.
    ``functools.partial(adjoint_of(f), cotangent="replicated")``. The
    adjoint of ``all_reduce`` under ``cotangent="varying"`` (the default) is
    the true adjoint; see ``docs/autodiff.md`` for when ``"replicated"`` is
    the one you want.

    Examples
    --------
    >>> import hpccoll
    >>> hpccoll.adjoint_of(hpccoll.all_gather) is hpccoll.all_gather_adjoint
    True
    >>> hpccoll.adjoint_of(hpccoll.reduce_scatter_adjoint) is hpccoll.reduce_scatter
    True
    >>> import functools
    >>> f = functools.partial(hpccoll.all_gather, axis=1)
    >>> hpccoll.adjoint_of(f).keywords
    {'axis': 1}
    """
    if isinstance(fn_or_operator, Operator):
        return fn_or_operator.H
    if isinstance(fn_or_operator, functools.partial):
        return _adjoint_partial(fn_or_operator)
    found = pair_of(fn_or_operator)
    if found is not None:
        pair, forward = found
        return pair.adjoint if forward else pair.forward
    names = ", ".join(pair.name for pair in _api.PAIRS)  # read when asked, as pair_of reads it
    raise ArgumentError(
        f"fn_or_operator: expected one of hpccoll's collectives ({names}, their *_adjoint functions, a "
        f"functools.partial of one of them) or an hpccoll.Operator; got {_describe(fn_or_operator)}"
    )


def _adjoint_partial(p: functools.partial[Any]) -> functools.partial[Any]:
    found = pair_of(p.func)
    if found is None:
        raise ArgumentError(
            "fn_or_operator: expected a functools.partial of one of hpccoll's collectives; "
            f"got a partial of {_describe(p.func)}"
        )
    if p.args:
        # Bound positional arguments would bind the array itself; only comm may follow it.
        raise ArgumentError(
            "fn_or_operator: expected a partial that binds keyword arguments only (comm=..., axis=...); "
            f"got one that binds {len(p.args)} positional argument(s)"
        )
    keywords = dict(p.keywords)
    if "out" in keywords:
        raise ArgumentError(
            "fn_or_operator: expected a partial without out= (the adjoint's result has another shape); "
            f"got out bound to a {type(keywords['out']).__name__}"
        )
    pair, forward = found
    if forward:
        return functools.partial(pair.adjoint, **keywords)
    return functools.partial(pair.forward, **{k: v for k, v in keywords.items() if k not in pair.adjoint_only})


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    module = getattr(obj, "__module__", None)
    if name and module:
        return f"{module}.{name}"
    return f"a {type(obj).__name__}"
