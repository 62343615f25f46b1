"""hpccoll: array-level collectives (all-gather, reduce-scatter, all-reduce, all-to-all, broadcast, reduce,
gather, scatter, halo exchange, shift, permute), each with a forward and an adjoint.

Every collective takes NumPy arrays (and CuPy arrays where a GPU transport is
available), an optional communicator (``None`` is a private duplicate of
``MPI.COMM_WORLD``), and has an explicit adjoint under the inner product
summed over ranks.
"""

from . import testing
from ._adjoint import adjoint_of
from ._api import (
    all_gather,
    all_gather_adjoint,
    all_reduce,
    all_reduce_adjoint,
    all_to_all,
    all_to_all_adjoint,
    broadcast,
    broadcast_adjoint,
    gather,
    gather_adjoint,
    halo_exchange,
    halo_exchange_adjoint,
    permute,
    permute_adjoint,
    reduce,
    reduce_adjoint,
    reduce_scatter,
    reduce_scatter_adjoint,
    scatter,
    scatter_adjoint,
    shift,
    shift_adjoint,
    split_sizes,
)
from ._comm import Communicator
from ._dtypes import OPS, SUPPORTED_DTYPES
from ._errors import (
    ArgumentError,
    CollectiveError,
    DTypeError,
    HpccollError,
    MismatchError,
    TransportUnavailable,
    UnsupportedOpError,
)
from ._faults import abort_on_exception
from ._operators import (
    AllGather,
    AllReduce,
    AllToAll,
    Broadcast,
    Gather,
    HaloExchange,
    Operator,
    Permute,
    Reduce,
    ReduceScatter,
    Scatter,
    Shift,
)
from ._plan import Plan, plan
from ._request import Request

__version__ = "0.1.0"

__all__ = [
    "Communicator",
    "all_gather",
    "all_gather_adjoint",
    "reduce_scatter",
    "reduce_scatter_adjoint",
    "all_reduce",
    "all_reduce_adjoint",
    "all_to_all",
    "all_to_all_adjoint",
    "broadcast",
    "broadcast_adjoint",
    "reduce",
    "reduce_adjoint",
    "gather",
    "gather_adjoint",
    "scatter",
    "scatter_adjoint",
    "halo_exchange",
    "halo_exchange_adjoint",
    "shift",
    "shift_adjoint",
    "permute",
    "permute_adjoint",
    "adjoint_of",
    "split_sizes",
    "plan",
    "Plan",
    "Request",
    "Operator",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
    "AllToAll",
    "Broadcast",
    "Reduce",
    "Gather",
    "Scatter",
    "HaloExchange",
    "Shift",
    "Permute",
    "HpccollError",
    "ArgumentError",
    "DTypeError",
    "UnsupportedOpError",
    "MismatchError",
    "TransportUnavailable",
    "CollectiveError",
    "OPS",
    "SUPPORTED_DTYPES",
    "TRANSPORTS",
    "abort_on_exception",
    "testing",
    "__version__",
]


def __getattr__(name: str) -> object:
    """``hpccoll.TRANSPORTS``, read when asked: :func:`hpccoll.transports.register` after import adds names."""
    if name == "TRANSPORTS":
        from . import transports

        return transports.TRANSPORTS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
