# Generated from _api.py by `python tests/gen_api_stub.py`: do not edit (tests/test_api_stub.py fails on drift).

from inspect import Parameter
from typing import Any, Callable, Dict, FrozenSet, List, Literal, NamedTuple, Optional, Sequence, Tuple, Union, overload

from ._arrays import Array, ArrayT, split_sizes
from ._comm import Communicator
from ._request import Request
from ._spec import Bound, Hooks, Meta
from .transports._mpitypes import MPIComm, MPIOp

__all__ = [
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
    "split_sizes",
    "CommLike",
    "OpLike",
    "Sizes",
    "Pair",
    "PAIRS",
    "PAIR",
    "pair_of",
]
CommLike = Union[Communicator, "MPIComm", None]
OpLike = Union[str, "MPIOp"]
Sizes = Optional[Sequence[int]]

@overload
def all_gather(
    x: Array,
    comm: CommLike = None,
    *,
    axis: None,
    sizes: None = None,
    out: Optional[Sequence[Array]] = None,
    async_op: Literal[False] = False,
) -> List[Array]: ...
@overload
def all_gather(
    x: Array,
    comm: CommLike = None,
    *,
    axis: None,
    sizes: None = None,
    out: Optional[Sequence[Array]] = None,
    async_op: Literal[True],
) -> Request[List[Array]]: ...
@overload
def all_gather(
    x: ArrayT,
    comm: CommLike = None,
    *,
    axis: int = 0,
    sizes: Sizes = None,
    out: Union[ArrayT, Literal["shared"], None] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def all_gather(
    x: ArrayT,
    comm: CommLike = None,
    *,
    axis: int = 0,
    sizes: Sizes = None,
    out: Union[ArrayT, Literal["shared"], None] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def all_gather_adjoint(
    y: Sequence[Array],
    comm: CommLike = None,
    *,
    axis: None,
    sizes: None = None,
    out: Optional[Array] = None,
    async_op: Literal[False] = False,
) -> Array: ...
@overload
def all_gather_adjoint(
    y: Sequence[Array],
    comm: CommLike = None,
    *,
    axis: None,
    sizes: None = None,
    out: Optional[Array] = None,
    async_op: Literal[True],
) -> Request[Array]: ...
@overload
def all_gather_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def all_gather_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def reduce_scatter(
    x: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def reduce_scatter(
    x: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def reduce_scatter_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def reduce_scatter_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def all_reduce(
    x: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    out: Union[ArrayT, Literal["shared"], None] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def all_reduce(
    x: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    out: Union[ArrayT, Literal["shared"], None] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def all_reduce_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    cotangent: str = "varying",
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def all_reduce_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    cotangent: str = "varying",
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def all_to_all(
    x: ArrayT,
    comm: CommLike = None,
    *,
    split_axis: int = 0,
    concat_axis: int = 0,
    sizes: Sizes = None,
    recv_sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def all_to_all(
    x: ArrayT,
    comm: CommLike = None,
    *,
    split_axis: int = 0,
    concat_axis: int = 0,
    sizes: Sizes = None,
    recv_sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def all_to_all_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    split_axis: int = 0,
    concat_axis: int = 0,
    sizes: Sizes = None,
    recv_sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def all_to_all_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    split_axis: int = 0,
    concat_axis: int = 0,
    sizes: Sizes = None,
    recv_sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def broadcast(
    x: ArrayT, comm: CommLike = None, *, root: int = 0, out: Optional[ArrayT] = None, async_op: Literal[False] = False
) -> ArrayT: ...
@overload
def broadcast(
    x: ArrayT, comm: CommLike = None, *, root: int = 0, out: Optional[ArrayT] = None, async_op: Literal[True]
) -> Request[ArrayT]: ...
@overload
def broadcast_adjoint(
    y: ArrayT, comm: CommLike = None, *, root: int = 0, out: Optional[ArrayT] = None, async_op: Literal[False] = False
) -> ArrayT: ...
@overload
def broadcast_adjoint(
    y: ArrayT, comm: CommLike = None, *, root: int = 0, out: Optional[ArrayT] = None, async_op: Literal[True]
) -> Request[ArrayT]: ...
@overload
def reduce(
    x: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    root: int = 0,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def reduce(
    x: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    root: int = 0,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def reduce_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    root: int = 0,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def reduce_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    op: OpLike = "sum",
    root: int = 0,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def gather(
    x: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def gather(
    x: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def gather_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def gather_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def scatter(
    x: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def scatter(
    x: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def scatter_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def scatter_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    root: int = 0,
    axis: int = 0,
    sizes: Sizes = None,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def halo_exchange(
    x: ArrayT,
    comm: CommLike,
    *,
    halo: Union[int, Sequence[int]],
    corners: bool = False,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def halo_exchange(
    x: ArrayT,
    comm: CommLike,
    *,
    halo: Union[int, Sequence[int]],
    corners: bool = False,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def halo_exchange_adjoint(
    g: ArrayT,
    comm: CommLike,
    *,
    halo: Union[int, Sequence[int]],
    corners: bool = False,
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def halo_exchange_adjoint(
    g: ArrayT,
    comm: CommLike,
    *,
    halo: Union[int, Sequence[int]],
    corners: bool = False,
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def shift(
    x: ArrayT, comm: CommLike = None, *, offset: int = 1, out: Optional[ArrayT] = None, async_op: Literal[False] = False
) -> ArrayT: ...
@overload
def shift(
    x: ArrayT, comm: CommLike = None, *, offset: int = 1, out: Optional[ArrayT] = None, async_op: Literal[True]
) -> Request[ArrayT]: ...
@overload
def shift_adjoint(
    y: ArrayT, comm: CommLike = None, *, offset: int = 1, out: Optional[ArrayT] = None, async_op: Literal[False] = False
) -> ArrayT: ...
@overload
def shift_adjoint(
    y: ArrayT, comm: CommLike = None, *, offset: int = 1, out: Optional[ArrayT] = None, async_op: Literal[True]
) -> Request[ArrayT]: ...
@overload
def permute(
    x: ArrayT,
    comm: CommLike = None,
    *,
    perm: Sequence[Tuple[int, int]],
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def permute(
    x: ArrayT,
    comm: CommLike = None,
    *,
    perm: Sequence[Tuple[int, int]],
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...
@overload
def permute_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    perm: Sequence[Tuple[int, int]],
    out: Optional[ArrayT] = None,
    async_op: Literal[False] = False,
) -> ArrayT: ...
@overload
def permute_adjoint(
    y: ArrayT,
    comm: CommLike = None,
    *,
    perm: Sequence[Tuple[int, int]],
    out: Optional[ArrayT] = None,
    async_op: Literal[True],
) -> Request[ArrayT]: ...

class Pair(NamedTuple):
    forward: Callable[..., Any]
    adjoint: Callable[..., Any]
    operator: str
    adjoint_only: FrozenSet[str] = ...
    @property
    def name(self) -> str: ...
    @property
    def hooks(self) -> Hooks: ...
    def bind(self, **keywords: Any) -> Tuple[Callable[[Any], Any], Callable[[Any], Any]]: ...
    def configure(self, comm: Communicator, **keywords: Any) -> Dict[str, Any]: ...
    @property
    def configuration(self) -> List[Parameter]: ...
    def documented(self) -> Dict[str, str]: ...
    def bound(
        self, meta: Meta, comm: Communicator, tracing: bool = False, **keywords: Any
    ) -> Tuple[Callable[[Any], Any], Callable[[Any], Any], Bound]: ...

PAIRS: Tuple[Pair, ...]
PAIR: Dict[str, Pair]

def pair_of(fn: Any) -> Optional[Tuple[Pair, bool]]: ...
