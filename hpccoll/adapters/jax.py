"""JAX primitives for hpccoll's collectives: eager, under ``jax.jit``, differentiable and batchable.

:func:`all_gather`, :func:`reduce_scatter`, :func:`all_reduce`, :func:`all_to_all`,
:func:`replicate`, the rooted :func:`broadcast`, :func:`reduce`, :func:`gather` and
:func:`scatter`, :func:`halo_exchange` and :func:`shift` are JAX primitives with the same signatures and conventions as
``hpccoll.adapters.autograd`` and ``hpccoll.adapters.torch``. Every map with
``op`` ``"sum"`` or ``"avg"`` (or none) is linear: its JVP is the map applied to the
tangent, its transpose is the adjoint (whose transpose is the map again), so
``jax.grad``, ``jax.vjp``, ``jax.jvp``, ``jax.linear_transpose``, higher orders and
their compositions with ``jax.jit``, ``lax.scan``, ``lax.while_loop`` and ``lax.cond``
work. ``max``, ``min`` and ``prod`` are not linear: differentiating them in either
mode raises :class:`hpccoll.UnsupportedOpError`.

``jax.vmap`` (and so ``jax.jacfwd``, ``jax.jacrev``, ``jax.hessian``) batches a
collective into one collective on arrays with one more axis: vmap runs the same
way on every rank, so the batch axis is one more axis of every rank's array.
A reduction reduces the stacked array, a gather or all-to-all moves its axes
one further, a halo exchange carries the batch axis after the others (its
leading axes are the process grid's). A batch size that differs between ranks is a cross-rank mismatch
like any other (check mode reports it).

How a collective runs:

* **Eagerly** (concrete arrays, including inside an un-jitted ``jax.grad``) the
  primitive calls hpccoll directly: a CPU array is handed over as a zero-copy
  NumPy view and the result comes back with one copy (``jnp.asarray``); a GPU
  array goes to CuPy through DLPack and takes hpccoll's GPU transports (NCCL,
  CUDA-aware MPI, staged), with no host round trip. The GPU path has not been
  run on a GPU.
* **Under** ``jax.jit`` the primitive runs exactly once per execution, in
  program order with every other ordered effect (those of
  ``io_callback(..., ordered=True)`` included): many collectives in one jitted
  function, and their adjoints in its backward pass, run one at a time and in
  the same order on every rank, in loops and branches too. Where JAX has
  ``jax.experimental.buffer_callback`` (0.7 and later; :data:`LOWERING`
  ``"buffer"``) the call is a custom call on XLA's own buffers that also takes
  and returns the ordered effect's token (``buffer_callback`` alone is not
  ordered): on the CPU hpccoll reads XLA's input and writes XLA's output
  through NumPy views, no copy in or out; on a GPU it gets CuPy views of them,
  with XLA's stream current, so NCCL (or CUDA-aware MPI, or the staged
  transport) runs on that stream with no host round trip. That GPU path has
  not been run on a GPU. Older JAX (and ``LOWERING = "callback"``) use the
  ordered host callback io_callback emits, on XLA's NumPy views, its result
  copied by XLA (a GPU array then goes to the host and back); more than one
  device, or ``LOWERING = "io_callback"``, goes through ``io_callback``.

While JAX traces without values (``jax.jit``, ``jax.vmap``, control flow), the
result's shape must be known without communicating: ``all_gather(x)`` without
``sizes`` then means "every rank's extent along ``axis`` equals mine", and
``all_to_all(x)`` without ``recv_sizes`` "every rank sends me a block like the
one I send myself" (every rank splits alike), ``gather(x)`` without ``sizes`` the
same as ``all_gather(x)``, and ``scatter(x)`` without ``sizes`` "root's extent
along ``axis`` equals mine". The callback checks that
assumption when it runs (one small exchange, in program order on every rank)
and raises :class:`hpccoll.MismatchError` on every rank if it does not hold;
pass ``sizes`` / ``recv_sizes`` for uneven shards (and to ``scatter`` where
the other ranks pass arrays of another extent than root's, such as empty ones).
A halo exchange's result has its input's shape: it assumes nothing.

Every rank must run the same sequence of collectives, forward and backward, as
for any collective. Gradients are those of the **sum over ranks** of what each
rank differentiates; for a value replicated on every rank and counted once use
``all_reduce(..., cotangent="replicated")`` and :func:`replicate` (see
``docs/autodiff.md``).

What cannot work raises :class:`hpccoll.UnsupportedOpError` naming the
transform, when JAX traces, before anything communicates: ``jax.shard_map`` /
``jax.pmap`` bodies (a collective over MPI ranks runs once per process, not once
per device), and the transpose of ``max``, ``min``, ``prod``. Their JVP raises
the same: an eager ``jax.jvp`` at once, before anything communicates, and
otherwise when it would run (under ``jax.jit``: when it is compiled).

Errors: argument and dtype errors are raised as hpccoll's exceptions when the
function is called or traced, before any communication. An exception raised
inside a jitted callback (a cross-rank mismatch found in check mode, say)
reaches JAX, which reports it as ``jax.errors.JaxRuntimeError`` carrying the
message; run the call under :func:`reraise` to get hpccoll's exception back
(same type, same message), on every rank alike.

Requires ``pip install jax`` (``hpccoll[jax]``).

Examples
--------
>>> import jax, jax.numpy as jnp                               # doctest: +SKIP
>>> from hpccoll.adapters import jax as hcj                     # doctest: +SKIP
>>> def loss(w_shard):                                          # doctest: +SKIP
...     w = hcj.all_gather(w_shard)   # equal shards; backward: reduce-scatter
...     return jnp.sum(jnp.tanh(w) ** 2)
>>> g = jax.jit(jax.grad(loss))(w_shard)  # doctest: +SKIP

``g`` is this rank's shard of the gradient.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.typing import ArrayLike

from .._api import PAIR, CommLike, OpLike, Pair
from .._comm import Communicator, as_communicator
from .._core.validate import LINEAR_OPS
from .._core.validate import linear_op as _linear_op
from .._dtypes import check_dtype, normalize_op, reduce_plan
from .._errors import ArgumentError, HpccollError, UnsupportedOpError
from .._spec import Meta
from ..transports._cuda import device_view, external_stream
from ._common import derive_missing, identity, replicate_maps

__all__ = [
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "all_to_all",
    "replicate",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "halo_exchange",
    "shift",
    "reraise",
]

Fn = Callable[..., Any]
Shape = Tuple[int, ...]

#: The keywords of a bound pair's maps that name an axis (normalised, non-negative): what ``jax.vmap`` shifts.
_AXES = ("axis", "split_axis", "concat_axis")

#: The keyword of a bound pair's maps whose leading axes are a process grid's (the halo exchange): ``jax.vmap``
#: puts its batch axis after them instead, where the map carries it along.
_GRID = "halo"


# --------------------------------------------------------------------------- one direction of a collective


class _Map:
    """One direction of a collective: its array function and what it accepts.

    ``fn`` is hpccoll's function of one NumPy or CuPy array, a
    ``functools.partial`` from :meth:`hpccoll._api.Pair.bound` (``None`` for the identity, which
    needs no callback). ``op`` is the reduction it performs, if any: a dtype it
    cannot reduce, or a non-linear op in an adjoint, raises hpccoll's own
    exception when JAX traces the map, not later in a callback. ``verify``, if
    given, is a collective check run before ``fn`` (the extents assumed while
    tracing). ``refusal``, if given, is why this map may be traced but never run
    (the JVP of a non-linear op): :class:`UnsupportedOpError` when it would run.
    Compared by identity, as JAX compares primitive parameters.
    """

    __slots__ = ("name", "fn", "op", "adjoint", "verify", "refusal", "call")

    def __init__(
        self,
        name: str,
        fn: Optional[Fn],
        op: Any = None,
        adjoint: bool = False,
        verify: Optional[Callable[[], None]] = None,
        refusal: Optional[str] = None,
    ) -> None:
        self.name = name
        self.fn = fn
        self.op = op
        self.adjoint = adjoint
        self.verify = verify
        self.refusal = refusal
        self.call = fn if verify is None and refusal is None else _guarded(fn, verify, refusal)  # what runs

    def check(self, dtype: np.dtype) -> None:
        check_dtype(np.dtype(dtype))
        if self.op is not None:
            op = _linear_op(self.op, self.name) if self.adjoint else normalize_op(self.op)
            reduce_plan(np.dtype(dtype), op)

    @property
    def linear(self) -> bool:
        """Whether the map is linear in its argument (an adjoint is, or :meth:`check` raises)."""
        return self.adjoint or self.op is None or normalize_op(self.op) in LINEAR_OPS

    def shifted(self, b: int) -> "_Map":
        """The same map on arrays with one more axis at ``b`` (``jax.vmap``'s batch axis): axes from ``b`` on, +1."""
        fn = self.fn
        if fn is not None:
            moved = {k: v + (v >= b) for k, v in getattr(fn, "keywords", {}).items() if k in _AXES}
            if moved:
                fn = functools.partial(fn, **moved)  # a partial of a partial: the keywords merge
        return _Map(self.name, fn, self.op, self.adjoint, self.verify, self.refusal)

    def refusing(self, why: str) -> "_Map":
        """This map, traceable and transposable, but raising ``UnsupportedOpError(why)`` if it would run."""
        return _Map(self.name, self.fn, self.op, self.adjoint, self.verify, why)

    def __repr__(self) -> str:  # what jax.make_jaxpr shows
        return self.name


def _guarded(fn: Optional[Fn], verify: Optional[Callable[[], None]], refusal: Optional[str]) -> Fn:
    """``fn`` after ``verify`` (a collective check), or a function raising ``UnsupportedOpError(refusal)``."""
    if refusal is not None:

        def refused(a: Any, **kw: Any) -> Any:
            raise UnsupportedOpError(refusal)

        return refused
    assert fn is not None and verify is not None, "called with a refusal, or a check of a collective"

    def verified(a: Any, **kw: Any) -> Any:
        verify()
        return fn(a, **kw)

    return verified


# --------------------------------------------------------------------------- the primitive


def _ordered_io_effect() -> Any:
    """The effect JAX gives an ordered io_callback (read off a traced one: no private import)."""
    probe = jax.ShapeDtypeStruct((), np.float32)
    jaxpr = jax.make_jaxpr(lambda v: io_callback(lambda a: a, probe, v, ordered=True))(np.float32(0))
    (effect,) = jaxpr.effects
    return effect


_ORDERED = _ordered_io_effect()

_linear_p = Primitive("hpccoll")
"""``y = fwd(x)`` with result shape ``shape``; its transpose is the same primitive with ``fwd`` and ``adj`` swapped."""


def _abstract_eval(x: Any, *, fwd: _Map, adj: _Map, shape: Shape) -> Any:
    fwd.check(x.dtype)
    effects = {_ORDERED} if fwd.fn is not None else set()
    return jax.core.ShapedArray(shape, x.dtype), effects


def _impl(x: Any, *, fwd: _Map, adj: _Map, shape: Shape) -> Any:
    """Eager: hpccoll on a NumPy view (CPU) or a CuPy view (GPU) of ``x``."""
    if not isinstance(x, jax.Array):  # a host literal (JAX's, for a Python or NumPy scalar under grad or jvp)
        x = np.asarray(x, dtype=getattr(x, "dtype", None))
        if fwd.call is None:
            return jnp.asarray(x)
        jax.effects_barrier()
        return jnp.asarray(fwd.call(x))
    if fwd.call is None:
        return x
    jax.effects_barrier()  # earlier jitted collectives finish first: one order on every rank
    device = _device_of(x)
    if device.platform == "cpu":
        return jnp.asarray(fwd.call(np.asarray(x)))
    return _on_gpu(fwd.call, x, device)


def _device_of(x: Any) -> Any:
    devices = x.devices()
    if len(devices) != 1:
        raise ArgumentError(
            f"x: expected an array on one device (one process, one rank); got one sharded over {len(devices)} devices"
        )
    return next(iter(devices))


_FLOAT8 = ("float8_e4m3fn", "float8_e5m2")  # ml_dtypes' 8-bit floats, which hpccoll moves as bytes


def _on_gpu(fn: Fn, x: Any, device: Any) -> Any:
    """``fn`` on a CuPy view of a GPU array (DLPack both ways, no host copy). Unverified on a GPU."""
    import cupy  # only reached for GPU arrays

    with cupy.cuda.Device(getattr(device, "local_hardware_id", device.id)):
        if x.dtype.name not in _FLOAT8:
            return jax.dlpack.from_dlpack(fn(cupy.from_dlpack(x)))
        # CuPy's DLPack import has no float8 (cupy/_core/dlpack.pyx): its bits go as uint8, both ways
        out = fn(cupy.from_dlpack(jax.lax.bitcast_convert_type(x, jnp.uint8)).view(x.dtype))
        return jax.lax.bitcast_convert_type(jax.dlpack.from_dlpack(out.view(np.uint8)), x.dtype)


_emit_python_callback: Optional[Callable[..., Any]]
try:  # what io_callback's own lowering calls; private, so only used when it fits (see _lowering)
    from jax._src.callback import emit_python_callback

    _emit_python_callback = emit_python_callback
    # JAX 0.7 added returns_token (before, a token was always returned)
    _EMIT_KW = {"has_side_effect": True}
    if "returns_token" in inspect.signature(emit_python_callback).parameters:
        _EMIT_KW["returns_token"] = True
except (ImportError, TypeError, ValueError):  # pragma: no cover - a JAX without it takes the public route
    _emit_python_callback = None

_buffer_callback_lowering: Optional[Callable[..., Any]]
try:  # the lowering rule of jax.experimental.buffer_callback (JAX 0.7+), given our token (see _buffer_lowering)
    from jax._src.buffer_callback import _buffer_callback_lowering as _lower
    from jax._src.core import abstract_token as _TOKEN  # the token's aval, the one instance JAX compares with
    from jax.experimental.buffer_callback import buffer_callback as _public  # noqa: F401 - the public API exists

    _WANTED = (
        "callback",
        "in_tree",
        "out_tree",
        "has_side_effect",
        "input_output_aliases",
        "command_buffer_compatible",
    )
    if not set(_WANTED) <= set(inspect.signature(_lower).parameters):  # pragma: no cover
        raise ImportError("another buffer_callback lowering")
    _buffer_callback_lowering = _lower
except (ImportError, TypeError, ValueError):  # pragma: no cover - an older JAX: the ordered host callback
    _buffer_callback_lowering = None

#: The lowerings under ``jax.jit`` this JAX offers, best first: ``"buffer"`` (hpccoll on XLA's own
#: buffers through ``jax.experimental.buffer_callback``: NumPy views on the CPU, CuPy views on XLA's
#: stream on the GPU, the result written into XLA's output), ``"callback"`` (the ordered host callback
#: that io_callback emits, on XLA's NumPy views, its result copied by XLA) and ``"io_callback"``
#: (``jax.experimental.io_callback`` itself, which also copies the argument).
LOWERINGS = tuple(
    name
    for name, have in (
        ("buffer", _buffer_callback_lowering is not None),
        ("callback", _emit_python_callback is not None),
        ("io_callback", True),
    )
    if have
)

#: The lowering jitted collectives use (one of :data:`LOWERINGS`; read when a function is compiled).
#: ``"buffer"`` and ``"callback"`` need one device and one platform; elsewhere ``"io_callback"`` runs.
LOWERING = LOWERINGS[0]


def _lowering(ctx: Any, x: Any, *, fwd: _Map, adj: _Map, shape: Shape) -> Any:
    """Under jit: ``fwd`` in program order with every ordered effect (none for the identity)."""
    _refuse_mapped_axes(ctx, fwd.name)
    if fwd.refusal is not None:  # when compiled, before anything runs
        raise UnsupportedOpError(fwd.refusal)
    if fwd.call is None:
        return [x]
    if _one_device(ctx):
        if LOWERING == "buffer" and ctx.module_context.platforms[0] in _BUFFER_CALLS:
            return _buffer_lowering(ctx, x, fwd.call)
        if LOWERING in ("buffer", "callback") and _emit_python_callback is not None:
            try:
                return _direct_lowering(ctx, x, _host_callback(fwd.call))
            except TypeError:  # pragma: no cover - another JAX's private signature: the public route
                pass
    (out_aval,) = ctx.avals_out
    result = jax.ShapeDtypeStruct(shape, out_aval.dtype)
    call = _host_callback(fwd.call)
    return mlir.lower_fun(lambda v: io_callback(call, result, v, ordered=True), multiple_results=False)(ctx, x)


def _one_device(ctx: Any) -> bool:
    context = ctx.module_context
    return getattr(context.axis_context, "num_devices", None) == 1 and len(context.platforms) == 1


def _direct_lowering(ctx: Any, x: Any, call: Fn) -> Any:
    """The ordered callback as io_callback lowers it, on XLA's NumPy views of the buffers (no extra copy)."""
    emit = _emit_python_callback
    assert emit is not None, "_lowering checked"
    token = ctx.tokens_in.get(_ORDERED)
    results, token, _ = emit(ctx, lambda a: (call(a),), token, [x], ctx.avals_in, ctx.avals_out, **_EMIT_KW)
    ctx.set_tokens_out(mlir.TokenSet({_ORDERED: token}))
    return results


def _buffer_lowering(ctx: Any, x: Any, fn: Fn) -> Any:
    """``fn`` on XLA's own buffers, ordered by the token of the ordered effect.

    ``buffer_callback`` alone is not ordered: its effect is unordered and its
    custom call shares no data with other effects, so XLA's CPU runtime runs
    independent ones concurrently, in any order (``tests/test_jax_order.py``).
    Here its custom call also takes the ordered effect's token and returns the
    next one, as io_callback's does: XLA runs it after the previous ordered
    effect and before the next, on every rank in program order.
    """
    lower = _buffer_callback_lowering
    assert lower is not None, "_lowering checked"
    run = _BUFFER_CALLS[ctx.module_context.platforms[0]](fn)
    (a,), (b,) = ctx.avals_in, ctx.avals_out
    ctx_token = ctx.replace(avals_in=[a, _TOKEN], avals_out=[b, _TOKEN])
    y, token = lower(
        ctx_token,
        x,
        ctx.tokens_in.get(_ORDERED),
        callback=run,
        in_tree=_BUFFER_IN,
        out_tree=_BUFFER_OUT,
        has_side_effect=True,
        input_output_aliases=(),
        command_buffer_compatible=False,  # a collective runs at every execution, never replayed from a graph
    )
    ctx.set_tokens_out(mlir.TokenSet({_ORDERED: token}))
    return [y]


_BUFFER_IN = jax.tree_util.tree_structure(((0, 0), {}))  # the callback's arguments: (x, token), no keywords
_BUFFER_OUT = jax.tree_util.tree_structure([0, 0])  # its outputs: [y, token]


def _on_cpu_buffers(fn: Fn) -> Fn:
    """The buffer callback on the CPU: ``fn`` from a NumPy view of XLA's input into one of its output."""

    def run(ctx: Any, outs: Any, a: Any, token: Any) -> None:
        with _KEEP:
            fn(np.asarray(a), out=np.asarray(outs[0]))

    return run


def _on_gpu_buffers(fn: Fn) -> Fn:
    """The buffer callback on a GPU: ``fn`` on CuPy views of XLA's buffers, with XLA's stream current.

    hpccoll's GPU transports then run on XLA's stream: NCCL enqueues there,
    the MPI transports synchronise it before MPI reads the input, and the
    staged one's copy back is queued on it, before what XLA runs next.
    """

    def run(ctx: Any, outs: Any, a: Any, token: Any) -> None:
        import cupy  # only reached on a GPU

        out = outs[0]
        device = int(out.__dlpack_device__()[1])
        with _KEEP, cupy.cuda.Device(device), external_stream(cupy, int(ctx.stream), device):
            fn(_cupy_view(cupy, a), out=_cupy_view(cupy, out))

    return run


def _cupy_view(cupy: Any, buffer: Any) -> Any:
    """A CuPy array on XLA's device memory with the buffer's dtype, bfloat16 and float8 included (no copy;
    :func:`~hpccoll.transports._cuda.device_view`); a new one when empty (XLA may give it no address)."""
    return device_view(cupy, buffer)


#: The buffer callback for each platform the buffer lowering serves.
_BUFFER_CALLS = {"cpu": _on_cpu_buffers, "cuda": _on_gpu_buffers, "rocm": _on_gpu_buffers}


def _refuse_mapped_axes(ctx: Any, name: str) -> None:
    context = ctx.module_context.axis_context
    manual = getattr(context, "manual_axes", None)
    if manual or type(context).__name__ == "ReplicaAxisContext":
        axes = f" (mesh axes {sorted(map(str, manual))})" if manual else ""
        raise UnsupportedOpError(
            f"{name}: expected to run once per process, outside jax.shard_map and jax.pmap; got a call inside "
            f"a mapped body{axes}, which would run it once per device. Call it outside the mapped function, or "
            "use jax.lax collectives over mesh axes"
        )


def _batching(args: Any, dims: Any, *, fwd: _Map, adj: _Map, shape: Shape) -> Any:
    """vmap: one collective on the stacked array (every rank batches alike), its axes one further from ``b``."""
    (x,), (b,) = args, dims
    keywords = getattr(fwd.fn, "keywords", {})
    if _GRID in keywords:  # the leading axes are the grid's: the batch axis is carried after them
        d = len(keywords["comm"].dims)
        if b < d:
            x, b = jnp.moveaxis(x, b, d), d
        return _linear_p.bind(x, fwd=fwd, adj=adj, shape=x.shape), b
    batched = shape[:b] + (x.shape[b],) + shape[b:]
    return _linear_p.bind(x, fwd=fwd.shifted(b), adj=adj.shifted(b), shape=batched), b


def _transpose(ct: Any, x: Any, *, fwd: _Map, adj: _Map, shape: Shape) -> list:
    return [_linear_p.bind(ct, fwd=adj, adj=fwd, shape=x.aval.shape)]


def _jvp(primals: Any, tangents: Any, *, fwd: _Map, adj: _Map, shape: Shape) -> Any:
    """The map on the tangent for a linear map; for ``max``, ``min``, ``prod``, a tangent that refuses to run.

    Not the reduction of the tangents, which is not their JVP. Eagerly it
    raises at once, before anything communicates; while tracing (``jax.jit``,
    ``jax.jacfwd``) the tangent stays traceable, so that ``jax.grad`` still
    reaches the transpose, which raises naming the adjoint, and a JVP that would
    run raises when it is compiled (or run eagerly).
    """
    (t,) = tangents
    if fwd.linear or type(t) is ad.Zero:
        return _linear_jvp(primals, tangents, fwd=fwd, adj=adj, shape=shape)
    why = _nonlinear_jvp(fwd)
    if not isinstance(t, jax.core.Tracer):
        raise UnsupportedOpError(why)
    (x,) = primals
    y = _linear_p.bind(x, fwd=fwd, adj=adj, shape=shape)
    return y, _linear_p.bind(t, fwd=fwd.refusing(why), adj=adj, shape=shape)


def _nonlinear_jvp(fwd: _Map) -> str:
    op = normalize_op(fwd.op)
    how = "on the other ranks' factors" if op == "prod" else "on which rank holds the extreme"
    return (
        f"{fwd.name}: expected op 'sum' or 'avg' (the linear reductions) to differentiate in forward mode "
        f"(jax.jvp, jax.jacfwd, jax.linearize); got {op!r}, whose JVP is not the {op} of the tangents: it "
        f"depends {how}. Differentiate it yourself"
    )


_linear_p.def_impl(_impl)
_linear_p.def_effectful_abstract_eval(_abstract_eval)
try:
    mlir.register_lowering(_linear_p, _lowering, cacheable=False)  # the callback is captured per lowering
except TypeError:  # JAX before lowering caches (0.6): every lowering is fresh anyway
    mlir.register_lowering(_linear_p, _lowering)
ad.deflinear2(_linear_p, _transpose)  # transpose: the adjoint
_linear_jvp = ad.primitive_jvps[_linear_p]  # JAX's linear JVP: the map on the tangent
ad.primitive_jvps[_linear_p] = _jvp  # ... but not for max, min, prod
batching.primitive_batchers[_linear_p] = _batching


# --------------------------------------------------------------------------- callbacks and their errors


_failed: dict = {}  # "last": the exception a callback raised (XLA may run callbacks on a thread of its own)
_failed_lock = threading.Lock()


def _host_callback(fn: Fn) -> Fn:
    """The callback for one call site: ``fn`` on NumPy arrays, its hpccoll errors kept for :func:`reraise`."""

    def call(a: Any) -> np.ndarray:
        with _KEEP:
            return np.asarray(fn(np.asarray(a)))

    return call


class _Keep:
    """A callback's context: the hpccoll exception raised inside it is kept for :func:`reraise`, and goes on."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, e: Any, tb: Any) -> None:
        if isinstance(e, HpccollError):
            with _failed_lock:
                _failed["last"] = e


_KEEP = _Keep()


_RUNTIME_ERRORS = tuple(
    t for t in (getattr(jax.errors, "JaxRuntimeError", None), getattr(jax.errors, "XlaRuntimeError", None)) if t
)


@contextlib.contextmanager
def reraise() -> Iterator[None]:
    """Give back the hpccoll exception that failed a jitted collective, instead of JAX's runtime error.

    JAX reports an exception raised inside a callback as
    ``jax.errors.JaxRuntimeError`` with the original message in its text.
    Inside this context (or in a function decorated with it), such an error
    that came from one of this module's callbacks is replaced by the hpccoll
    exception itself (same type and message; the runtime error is its
    ``__cause__``). Other exceptions pass through unchanged. Eager calls need
    none of this: they raise hpccoll's exceptions directly.

    Yields
    ------
    None
        Run the jitted calls inside the ``with`` block.

    Raises
    ------
    HpccollError
        The hpccoll exception behind a ``JaxRuntimeError`` raised in the block.

    Examples
    --------
    >>> with hcj.reraise():                      # doctest: +SKIP
    ...     y = jax.jit(step)(x)                 # a MismatchError, not a JaxRuntimeError
    """
    with _failed_lock:
        _failed.pop("last", None)
    try:
        yield
    except _RUNTIME_ERRORS as e:
        with _failed_lock:
            original = _failed.pop("last", None)
        if original is not None and str(original) in str(e):
            raise original.with_traceback(None) from e
        raise


# --------------------------------------------------------------------------- arguments


def _prepare(x: Any, comm: Any) -> Tuple[jax.Array, Communicator]:
    """``x`` as a JAX array (or tracer) and the communicator; argument errors raised here."""
    if not isinstance(x, (jax.Array, jax.core.Tracer)):
        if not isinstance(x, (np.ndarray, np.generic, int, float, complex, bool)):
            raise ArgumentError(f"x: expected a JAX array (or a NumPy array or scalar); got {type(x).__name__}")
        x = jnp.asarray(x)
    return x, as_communicator(comm)


def _staged(x: Any) -> bool:
    """True when JAX traces ``x`` without a value (jit, vmap, checkpoint, control flow): no collective may run now."""
    return isinstance(x, jax.core.Tracer) and x.to_concrete_value() is None


def _apply(pair: Pair, x: Any, comm: Any, **keywords: Any) -> Any:
    """``pair``'s forward of ``x`` with ``keywords`` as this module's primitive: bound to ``x``'s layout (no
    communication while JAX traces without values: what is assumed then is checked when the call runs), its
    transpose the adjoint with the same resolved keywords (the one road of every function here)."""
    x, c = _prepare(x, comm)
    meta = Meta(tuple(x.shape), x.ndim, np.dtype(x.dtype))
    forward, adjoint, b = pair.bound(meta, c, _staged(x), **keywords)
    return _linear(x, (forward, adjoint), b.shape, pair.name, b.op, b.adjoint_op, b.verify)


def _linear(
    x: Any,
    maps: Tuple[Fn, Fn],
    shape: Shape,
    name: str,
    op: Any,
    adjoint_op: Any,
    verify: Optional[Callable[[], None]] = None,
) -> Any:
    """Bind the primitive for a pair of maps (the identity needs no callback)."""
    forward, adjoint = (None if f is identity else f for f in maps)
    fwd = _Map(name, forward, op, False, verify)
    adj = _Map(name + "_adjoint", adjoint, adjoint_op, True, verify)  # verified too: linear_transpose runs it alone
    fwd.check(x.dtype)  # eagerly too: the same exception as hpccoll's, before anything runs
    return _linear_p.bind(x, fwd=fwd, adj=adj, shape=tuple(shape))


# --------------------------------------------------------------------------- public functions


def all_gather(
    x: ArrayLike, comm: CommLike = None, *, axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> jax.Array:
    """Differentiable :func:`hpccoll.all_gather` of a JAX array; its transpose is the reduce-scatter (sum).

    Parameters
    ----------
    x : jax.Array
        This rank's shard, at least 1-D (a NumPy array or scalar is converted).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    axis : int
        The axis to concatenate along.
    sizes : sequence of int, optional
        Every rank's extent along ``axis``. ``None``, eagerly: discovered (one
        small exchange, as :func:`hpccoll.all_gather` does), uneven shards
        included, and the backward pass reuses them. ``None`` while JAX traces
        without values (``jax.jit``, ``jax.vmap``, control flow): every rank's
        extent is taken to be this rank's, so the result's shape is known then;
        the callback checks it when it runs.

    Returns
    -------
    jax.Array
        The concatenation of every rank's ``x``.

    Raises
    ------
    ArgumentError
        Bad ``axis`` or ``sizes``; a 0-D ``x``.
    DTypeError
        A dtype hpccoll does not move (int4, ...).
    MismatchError
        ``sizes=None`` while tracing, and the ranks' extents differ (when the
        call runs, on every rank; under ``jax.jit`` inside JAX's runtime error,
        see :func:`reraise`).
    UnsupportedOpError
        Inside ``jax.shard_map`` or ``jax.pmap``.
    """
    return _apply(PAIR["all_gather"], x, comm, axis=axis, sizes=sizes)


def reduce_scatter(
    x: ArrayLike, comm: CommLike = None, *, op: OpLike = "sum", axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> jax.Array:
    """Differentiable :func:`hpccoll.reduce_scatter` of a JAX array; transpose: all-gather (/P for ``avg``).

    Parameters
    ----------
    x : jax.Array
        The full array, the same shape on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction. Only ``"sum"`` and ``"avg"`` can be differentiated; the
        others raise :class:`hpccoll.UnsupportedOpError`: the transpose when
        ``jax.grad`` traces it, the JVP eagerly at once and under ``jax.jit``
        when compiled.
    axis : int
        The axis the result is split along.
    sizes : sequence of int, optional
        Every rank's block extent; ``None`` splits like ``numpy.array_split``.

    Returns
    -------
    jax.Array
        This rank's block of the reduction.
    """
    return _apply(PAIR["reduce_scatter"], x, comm, op=op, axis=axis, sizes=sizes)


def all_reduce(x: ArrayLike, comm: CommLike = None, *, op: OpLike = "sum", cotangent: str = "varying") -> jax.Array:
    """Differentiable :func:`hpccoll.all_reduce` of a JAX array, with the transpose convention selectable.

    Parameters
    ----------
    x : jax.Array
        The same shape on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; only ``"sum"`` and ``"avg"`` can be differentiated
        (forward or reverse mode; see :func:`reduce_scatter`).
    cotangent : {"varying", "replicated"}
        ``"varying"`` (default): the transpose is an all-reduce, the true
        adjoint when each rank differentiates its own value (the objective is
        the sum over ranks). ``"replicated"``: the transpose is the identity
        (``/P`` for ``avg``), right when the result is used identically on
        every rank and the objective counts it once, as in tensor-parallel
        layers (TransformerEngine / Megatron, and mpi4jax's ``allreduce``).
        The wrong choice is off by exactly a factor of P.

    Returns
    -------
    jax.Array
        The reduction.
    """
    return _apply(PAIR["all_reduce"], x, comm, op=op, cotangent=cotangent)


def all_to_all(
    x: ArrayLike,
    comm: CommLike = None,
    *,
    split_axis: int = 0,
    concat_axis: int = 0,
    sizes: Optional[Sequence[int]] = None,
    recv_sizes: Optional[Sequence[int]] = None,
) -> jax.Array:
    """Differentiable :func:`hpccoll.all_to_all` of a JAX array; its transpose is the all-to-all back (axes swapped).

    Parameters
    ----------
    x : jax.Array
        This rank's array (a NumPy array or scalar is converted).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    split_axis, concat_axis : int
        The axis ``x`` is split along and the axis the received blocks are
        concatenated along.
    sizes : sequence of int, optional
        The split of ``x`` along ``split_axis``; ``None``: ``numpy.array_split``'s.
    recv_sizes : sequence of int, optional
        The extents along ``concat_axis`` of the blocks every rank sends this
        one. ``None``, eagerly: learned (one small exchange, as
        :func:`hpccoll.all_to_all` does) and the transpose reuses them.
        ``None`` while JAX traces without values (``jax.jit``, ``jax.vmap``,
        control flow): every rank is taken to send this one a block like the
        one this rank sends itself (every rank splits alike and has this
        rank's extent along ``concat_axis``), so the result's shape is known
        then; the callback checks it when it runs.

    Returns
    -------
    jax.Array
        The concatenation of the blocks this rank receives.

    Raises
    ------
    ArgumentError
        Bad axes, ``sizes`` or ``recv_sizes``.
    DTypeError
        A dtype hpccoll does not move.
    MismatchError
        ``recv_sizes=None`` while tracing, and a rank's blocks differ from
        that (when the call runs, on every rank).
    UnsupportedOpError
        Inside ``jax.shard_map`` or ``jax.pmap``.
    """
    return _apply(
        PAIR["all_to_all"], x, comm, split_axis=split_axis, concat_axis=concat_axis, sizes=sizes, recv_sizes=recv_sizes
    )


def replicate(x: ArrayLike, comm: CommLike = None) -> jax.Array:
    """Identity forward; all-reduce (sum) of the cotangent in the transpose.

    Marks a value that is replicated (identical on every rank, counted once)
    as it enters rank-local computation, such as the input of a
    column-parallel layer: each rank's backward pass holds only its part of
    the gradient and the all-reduce adds them. The partner of
    ``all_reduce(..., cotangent="replicated")`` (Megatron's "copy to
    tensor-parallel region"). The forward needs no callback, under ``jit`` too.

    Parameters
    ----------
    x : jax.Array
        The replicated value.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.

    Returns
    -------
    jax.Array
        ``x`` itself.
    """
    x, c = _prepare(x, comm)
    return _linear(x, replicate_maps(c), x.shape, "replicate", None, "sum")


def broadcast(x: ArrayLike, comm: CommLike = None, *, root: int = 0) -> jax.Array:
    """Differentiable :func:`hpccoll.broadcast` of a JAX array; its transpose sums over ranks to ``root``.

    Parameters
    ----------
    x : jax.Array
        Root's value; every rank passes an array of the same shape and dtype
        (the other ranks' values are ignored, and their gradient is zero).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose ``x`` every rank gets.

    Returns
    -------
    jax.Array
        Root's ``x``.

    Raises
    ------
    ArgumentError
        A bad ``root``.
    DTypeError
        A dtype hpccoll does not move.
    UnsupportedOpError
        Inside ``jax.shard_map`` or ``jax.pmap``.
    """
    return _apply(PAIR["broadcast"], x, comm, root=root)


def reduce(x: ArrayLike, comm: CommLike = None, *, op: OpLike = "sum", root: int = 0) -> jax.Array:
    """Differentiable :func:`hpccoll.reduce` of a JAX array; its transpose broadcasts root's cotangent (/P for avg).

    Parameters
    ----------
    x : jax.Array
        The same shape on every rank.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    op : str or mpi4py.MPI.Op
        The reduction; only ``"sum"`` and ``"avg"`` can be differentiated
        (forward or reverse mode; see :func:`reduce_scatter`).
    root : int
        The rank that gets the reduction.

    Returns
    -------
    jax.Array
        The reduction on ``root``, zeros of ``x``'s shape on the other ranks.
    """
    return _apply(PAIR["reduce"], x, comm, op=op, root=root)


def gather(
    x: ArrayLike, comm: CommLike = None, *, root: int = 0, axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> jax.Array:
    """Differentiable :func:`hpccoll.gather` of a JAX array; its transpose scatters root's cotangent.

    Parameters
    ----------
    x : jax.Array
        This rank's shard, at least 1-D.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank that gets the concatenation.
    axis : int
        The axis to concatenate along.
    sizes : sequence of int, optional
        Every rank's extent along ``axis``; ``None`` as for
        :func:`all_gather`: discovered eagerly (and reused by the transpose),
        taken to be this rank's while JAX traces without values (checked
        when the call runs).

    Returns
    -------
    jax.Array
        On ``root`` the concatenation of every rank's ``x``; elsewhere ``x``'s
        shape with extent 0 along ``axis``.

    Raises
    ------
    ArgumentError
        Bad ``root``, ``axis`` or ``sizes``; a 0-D ``x``.
    DTypeError
        A dtype hpccoll does not move.
    MismatchError
        ``sizes=None`` while tracing, and the ranks' extents differ (when the
        call runs, on every rank; see :func:`reraise`).
    UnsupportedOpError
        Inside ``jax.shard_map`` or ``jax.pmap``.
    """
    return _apply(PAIR["gather"], x, comm, root=root, axis=axis, sizes=sizes)


def scatter(
    x: ArrayLike, comm: CommLike = None, *, root: int = 0, axis: int = 0, sizes: Optional[Sequence[int]] = None
) -> jax.Array:
    """Differentiable :func:`hpccoll.scatter` of a JAX array; its transpose gathers the cotangents to ``root``.

    Parameters
    ----------
    x : jax.Array
        On ``root`` the array to split, at least 1-D; elsewhere only its dtype
        and extents other than along ``axis`` count (its gradient there is zero).
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks; ``None`` is the world.
    root : int
        The rank whose ``x`` is split.
    axis : int
        The axis to split along.
    sizes : sequence of int, optional
        Every rank's block extent. ``None``, eagerly: root's extent split like
        ``numpy.array_split`` (the other ranks learn it with one small
        exchange; the transpose reuses the sizes). ``None`` while JAX traces
        without values: root's extent is taken to be this rank's (checked
        when the call runs); pass ``sizes`` where the ranks' extents differ.

    Returns
    -------
    jax.Array
        This rank's block of root's ``x``.

    Raises
    ------
    ArgumentError
        Bad ``root``, ``axis`` or ``sizes``.
    DTypeError
        A dtype hpccoll does not move.
    MismatchError
        ``sizes=None`` while tracing, and the ranks' extents differ (when the
        call runs, on every rank; see :func:`reraise`).
    UnsupportedOpError
        Inside ``jax.shard_map`` or ``jax.pmap``.
    """
    return _apply(PAIR["scatter"], x, comm, root=root, axis=axis, sizes=sizes)


def halo_exchange(x: ArrayLike, comm: CommLike, *, halo: Union[int, Sequence[int]], corners: bool = False) -> jax.Array:
    """Differentiable :func:`hpccoll.halo_exchange` of a JAX array; its transpose: the exchange's adjoint.

    Parameters
    ----------
    x : jax.Array
        This rank's block *including* its ghost layers: ``halo[i]`` on each
        side of the first ``len(comm.dims)`` axes; later axes are carried
        along (``jax.vmap``'s batch axis too). The result has ``x``'s shape,
        under ``jax.jit`` as eagerly.
    comm : Communicator
        A Cartesian Communicator (:meth:`hpccoll.Communicator.cartesian`).
    halo : int or sequence of int
        The ghost layers on each side, one width for every grid axis or one per axis.
    corners : bool
        Also fill the ghosts outside the owned extent along two or more axes
        (from the diagonal neighbours).

    Returns
    -------
    jax.Array
        ``x`` with every ghost that stands for a cell inside the domain filled
        from the neighbour that owns it. The transpose adds each filled
        ghost's cotangent into that owned cell (on its owner) and zeroes the ghost.

    Raises
    ------
    ArgumentError
        ``comm`` without a process grid, a bad ``halo`` or ``corners`` (when
        called or traced); ``x`` with fewer dimensions than the grid, or a
        halo wider than ``x`` or a neighbour's owned cells allow (when the
        exchange runs, on every rank; under ``jax.jit`` inside JAX's runtime
        error, see :func:`reraise`).
    DTypeError
        A dtype hpccoll does not move.
    MismatchError
        The ranks disagree on the dtype, the number of dimensions, ``halo``
        or ``corners`` (when the exchange runs, on every rank).
    UnsupportedOpError
        Inside ``jax.shard_map`` or ``jax.pmap``.
    """
    return _apply(PAIR["halo_exchange"], x, comm, halo=halo, corners=corners)


def shift(x: ArrayLike, comm: CommLike = None, *, offset: int = 1) -> jax.Array:
    """Differentiable :func:`hpccoll.shift` of a JAX array; its transpose: :func:`hpccoll.shift_adjoint`.

    Parameters
    ----------
    x : jax.Array
        This rank's block; every rank's has the same shape and dtype.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks, in ring order.
    offset : int
        How many ranks along the ring each block moves.

    Returns
    -------
    jax.Array
        The block of rank ``(r - offset) mod P``, of ``x``'s shape. The
        transpose passes each cotangent back ``offset`` ranks.

    Raises
    ------
    ArgumentError
        A bad ``offset`` (when called or traced).
    DTypeError
        A dtype hpccoll does not move.
    MismatchError
        The ranks disagree on the shape or dtype (in check mode, when the shift runs, on every rank).
    UnsupportedOpError
        Inside ``jax.shard_map`` or ``jax.pmap``.
    """
    return _apply(PAIR["shift"], x, comm, offset=offset)


#: The pairs not written out above (:data:`hpccoll._api.PAIRS`), each derived from its pair.
DERIVED = derive_missing(globals(), _apply, jax.Array, "a JAX array")
