"""What a primitive is, declared once: the hooks each collective's module registers for its public pair.

A collective's module registers (:func:`register`), next to the code that moves its data:

- ``configure(comm, keywords)``: its configuration keywords checked and
  normalised, locally, with no array (``offset``, ``root``, ``halo``...). What
  an operator's constructor and an adapter check before anything is traced
  or communicates.
- ``bind(meta, comm, tracing, keywords)``: a :class:`Bound`: every keyword of
  the pair resolved for an array described by ``meta`` (its ``shape``,
  ``ndim`` and ``dtype``; no data), the forward's result shape, the
  reductions each side performs, and, while a framework traces without values
  (``tracing``), the check of what was assumed. Resolving may communicate
  where the collective would (``sizes=None``: one small exchange of the
  extents), never while tracing.

- its transport primitive, and for the point-to-point ones (``sendrecv``)
  the peers of a rank and a typical call's keywords.

The public pair (:data:`hpccoll._api.PAIRS`) joins them to its forward and
adjoint functions; the operators, ``adjoint_of``, the adapters (torch,
autograd, JAX, SciPy), plans, :meth:`hpccoll.Communicator.explain` and the
bench CLI derive what they need from it. This module sits below the
Communicator, so that every layer can read :data:`HOOKS`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

__all__ = ["Meta", "Bound", "Configure", "Bind", "Hooks", "HOOKS", "register", "names", "same_shape"]


class Meta(NamedTuple):
    """An array as :func:`bind` sees it: no data, any library or device."""

    shape: Tuple[int, ...]
    ndim: int
    dtype: Any


class Bound(NamedTuple):
    """A pair bound to one array's layout (see the module's docstring).

    Attributes
    ----------
    keywords : dict
        Both sides' keywords, resolved (the forward drops the pair's ``adjoint_only`` ones).
    shape : tuple of int
        The forward's result shape on this rank.
    op, adjoint_op : str or mpi4py.MPI.Op or None
        The reduction each side performs (``None``: data movement only): a
        framework checks the dtype (and, for the adjoint, linearity) while it
        traces, not later in a callback.
    verify : callable or None
        A collective check the forward runs first: what ``bind`` assumed while
        tracing (every rank's extents), raising on every rank where it was wrong.
    adjoint_as : callable or None
        Wraps the adjoint function (the scatter off root: zeros of the input's
        extent, where the gather gives an empty array).
    """

    keywords: Dict[str, Any]
    shape: Tuple[int, ...]
    op: Any = None
    adjoint_op: Any = None
    verify: Optional[Callable[[], None]] = None
    adjoint_as: Optional[Callable[[Callable[[Any], Any]], Callable[[Any], Any]]] = None


#: ``configure(comm, keywords) -> keywords``: the configuration checked, locally.
Configure = Callable[[Any, Dict[str, Any]], Dict[str, Any]]
#: ``bind(meta, comm, tracing, keywords) -> Bound``.
Bind = Callable[[Meta, Any, bool, Dict[str, Any]], Bound]


def same_shape(configure: Configure) -> Bind:
    """The ``bind`` of a pair whose result has its input's shape and that reduces nothing (``configure`` checks)."""

    def bind(meta: Meta, comm: Any, tracing: bool, keywords: Dict[str, Any]) -> Bound:
        return Bound(configure(comm, keywords), tuple(meta.shape))

    return bind


class Hooks(NamedTuple):
    """What a collective's module declares about one public pair (see the module's docstring).

    Attributes
    ----------
    name : str
        The public forward's name (``"shift"``).
    configure : callable
        ``configure(comm, keywords) -> keywords``.
    bind : callable
        ``bind(meta, comm, tracing, keywords) -> Bound``.
    primitive : str
        The transport primitive the forward's data moves by (``"allgatherv"``,
        ``"sendrecv"``...: the transport contract's name), which
        :meth:`hpccoll.Communicator.explain` and the bench CLI name.
    peers : callable or None
        ``sendrecv`` pairs: ``peers(rank, size, keywords) -> (to, source)``,
        the rank this one sends to and the one it receives from (``None``:
        none), for the forward with ``keywords`` configured.
    example : callable or None
        ``example(size) -> keywords``: a typical call's configuration on
        ``size`` ranks (the bench CLI's rows).
    """

    name: str
    configure: Configure
    bind: Bind
    primitive: str
    peers: Optional[Callable[[int, int, Dict[str, Any]], Tuple[Optional[int], Optional[int]]]] = None
    example: Optional[Callable[[int], Dict[str, Any]]] = None


#: Every registered pair's hooks, by the forward's name, in the order the collectives' modules registered them.
HOOKS: Dict[str, Hooks] = {}


def register(hooks: Hooks) -> Hooks:
    """Declare a public pair's hooks (its module does, once, at import); ``hooks``."""
    HOOKS[hooks.name] = hooks
    return hooks


def names(primitive: str) -> List[str]:
    """The registered pairs whose forward moves by ``primitive``."""
    return [name for name, h in HOOKS.items() if h.primitive == primitive]
