"""Gradients of a loss summed over the row blocks of Dask arrays, computed on the workers.

The loss is plain NumPy code for one block of rows, ``fun(params, X, y, ...)``; the total
loss is the sum of ``fun`` over the row blocks of the data arguments. ``value_and_grad``,
``grad`` and ``hvp`` compute that sum, its gradient and its Hessian-vector product on the
active Dask scheduler (a ``distributed.Client`` when one is active, else Dask's default).
Each worker compiles the per-block function once (``gradtape.compile``, from its disk cache
when present) and reuses it for every block and every later call. Parameters enter the task
graph once per call, so each worker receives them once, not once per block; the per-block
results are added in a tree on the workers, and only the final sum reaches the client.

Install with ``pip install "gradtape[dask]"`` (Dask's array module and distributed).

Example::

    import dask.array as da
    import numpy as np
    import gradtape.dask as gtd

    def loss(w, X, y):  # one block of rows
        z = X @ w
        return np.sum(np.logaddexp(0.0, z) - y * z)

    X = da.random.normal(size=(1_000_000, 20), chunks=(100_000, 20))
    y = (da.random.uniform(size=1_000_000, chunks=100_000) < 0.5).astype(float)
    value, g = gtd.value_and_grad(loss, data_argnums=(1, 2))(np.zeros(20), X, y)
"""

from __future__ import annotations

import functools
import operator
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

try:
    import dask
    import dask.array as da
    from dask.delayed import Delayed
except ImportError as error:  # pragma: no cover - exercised in a process without Dask
    raise ImportError(
        'gradtape.dask needs Dask: install it with  pip install "gradtape[dask]"'
    ) from error

from .core.errors import GradtapeError
from .core.pytree import tree_flatten, tree_unflatten

__all__ = ["grad", "hvp", "value_and_grad"]

#: How many partial results one task adds together in the tree sum.
TREE_FAN_IN = 8


# --- the worker side ---------------------------------------------------------------------------
#: How many compiled per-block functions a process keeps (least recently used dropped first).
COMPILED_LIMIT = 64
#: (function token, kind, argnums, backend) -> compiled per-block function, per process.
_COMPILED: OrderedDict[tuple, Callable] = OrderedDict()
_COMPILED_LOCK = threading.Lock()
#: This process's counts of compiled per-block functions created and of blocks evaluated.
_STATS = {"compiled": 0, "blocks": 0}


def _block_function(fun: Callable, kind: str, argnums: int | tuple[int, ...]) -> Callable:
    """The per-block function of one kind ("value_and_grad" or "hvp"), not yet compiled."""
    from .transforms.forward import jvp
    from .transforms.reverse import grad as reverse_grad
    from .transforms.reverse import value_and_grad as reverse_value_and_grad

    if kind == "value_and_grad":
        return reverse_value_and_grad(fun, argnums)

    gradient = reverse_grad(fun, argnums)

    def block_hvp(params, tangent, *rest):
        def along(p):
            return gradient(*_insert(rest, argnums, p))

        return jvp(along, (params,), (tangent,))[1]

    return block_hvp


def _insert(rest: tuple, argnums: int | tuple[int, ...], params) -> tuple:
    """The full argument tuple: `params` placed at `argnums` among the other arguments."""
    positions = (argnums,) if isinstance(argnums, int) else argnums
    values = (params,) if isinstance(argnums, int) else tuple(params)
    args = list(rest)
    for position, value in sorted(zip(positions, values, strict=True)):
        args.insert(position, value)
    return tuple(args)


def _compiled(fun: Callable, token: str, kind: str, argnums, backend: str) -> Callable:
    """This process's compiled per-block function, compiled on its first use."""
    key = (token, kind, argnums, backend)
    with _COMPILED_LOCK:
        compiled = _COMPILED.get(key)
        if compiled is None:
            from .compile import compile as gradtape_compile

            compiled = gradtape_compile(_block_function(fun, kind, argnums), backend=backend)
            _COMPILED[key] = compiled
            _STATS["compiled"] += 1
            while len(_COMPILED) > COMPILED_LIMIT:
                _COMPILED.popitem(last=False)
        else:
            _COMPILED.move_to_end(key)
    return compiled


def _run_block(fun, token, kind, argnums, backend, shared, data_positions, *blocks):
    """Evaluate one row block on a worker: (value, gradient) or the Hessian-vector product."""
    args = list(shared)
    for position, block in zip(data_positions, blocks, strict=True):
        args.insert(position, block)
    compiled = _compiled(fun, token, kind, argnums, backend)
    _STATS["blocks"] += 1
    if kind == "value_and_grad":
        value, gradient = compiled(*args)  # grad refuses a non-scalar loss, naming it
        return np.asarray(value).item(), gradient
    return compiled(*args)


def _add(*parts):
    """The sum of partial results (scalars, arrays, pytrees of arrays)."""
    leaves_list = []
    treedef = None
    for part in parts:
        leaves, treedef = tree_flatten(part)
        leaves_list.append(leaves)
    total = [functools.reduce(np.add, column) for column in zip(*leaves_list, strict=True)]
    return tree_unflatten(treedef, total)


# --- the client side ---------------------------------------------------------------------------
def _normalize_argnums(argnums, data_argnums, nargs: int, who: str):
    def as_tuple(value, name):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return (int(value),)
        if isinstance(value, Sequence) and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value
        ):
            return tuple(int(v) for v in value)
        raise GradtapeError(f"{who}: {name} must be an int or a tuple of ints, got {value!r}.")

    params = as_tuple(argnums, "argnums")
    data = as_tuple(data_argnums, "data_argnums")
    for name, nums in (("argnums", params), ("data_argnums", data)):
        for n in nums:
            if not -nargs <= n < nargs:
                raise GradtapeError(
                    f"{who}: {name} contains {n}, but the function was called with {nargs} "
                    "positional arguments."
                )
    params = tuple(n % nargs for n in params)
    data = tuple(sorted(n % nargs for n in data))
    if set(params) & set(data):
        raise GradtapeError(
            f"{who}: argument(s) {sorted(set(params) & set(data))} are in both argnums and "
            "data_argnums; differentiate with respect to parameters, and pass the data "
            "(Dask arrays summed over row blocks) at other positions."
        )
    if not data:
        raise GradtapeError(f"{who}: data_argnums is empty; name the data arguments.")
    single = isinstance(argnums, (int, np.integer))
    return (params[0] if single else params), data


def _row_blocks(args: tuple, data_positions: tuple[int, ...], who: str) -> list[list]:
    """For each data argument, its row blocks as Delayed objects (one list per argument)."""
    arrays = {}
    for position in data_positions:
        value = args[position]
        if isinstance(value, da.Array):
            arrays[position] = value
        elif isinstance(value, np.ndarray):
            arrays[position] = None
        else:
            raise GradtapeError(
                f"{who}: the data argument at position {position} is a "
                f"{type(value).__name__}; pass a Dask array (chunked along axis 0) or a NumPy "
                "array, e.g. da.from_array(np.asarray(value), chunks=(rows_per_block, ...))."
            )
    dask_arrays = {p: a for p, a in arrays.items() if a is not None}
    if not dask_arrays:
        return [[dask.delayed(args[p], pure=True)] for p in data_positions]
    first_position, first = next(iter(dask_arrays.items()))
    row_chunks = first.chunks[0]
    blocks = []
    for position in data_positions:
        value = arrays[position]
        if value is None:  # a NumPy array next to Dask arrays: split it the same way
            value = args[position]
            if np.ndim(value) == 0 or value.shape[0] != sum(row_chunks):
                raise GradtapeError(
                    f"{who}: the NumPy data argument at position {position} has "
                    f"{np.shape(value)[0] if np.ndim(value) else 'no'} rows, the Dask array at "
                    f"position {first_position} has {sum(row_chunks)}; data arguments share "
                    "their rows."
                )
            value = da.from_array(value, chunks=(row_chunks,) + value.shape[1:])
        if value.ndim == 0:
            raise GradtapeError(
                f"{who}: the data argument at position {position} is 0-dimensional; data "
                "arguments have rows along axis 0."
            )
        if value.chunks[0] != row_chunks:
            raise GradtapeError(
                f"{who}: the data arguments' row chunks differ: position {first_position} has "
                f"{_short(row_chunks)}, position {position} has {_short(value.chunks[0])}. "
                f"Rechunk one like the other, e.g. arg.rechunk({{0: other.chunks[0]}})."
            )
        if any(n != 1 for n in value.numblocks[1:]):
            raise GradtapeError(
                f"{who}: the data argument at position {position} is chunked along axes "
                f"other than 0 (chunks {tuple(_short(c) for c in value.chunks)}); a block holds "
                "whole rows: rechunk with arg.rechunk({i: -1 for i in range(1, arg.ndim)})."
            )
        blocks.append(list(value.to_delayed().reshape(-1)))
    return blocks


def _short(chunks: tuple) -> str:
    return str(chunks) if len(chunks) <= 4 else f"({chunks[0]}, {chunks[1]}, ..., {chunks[-1]})"


def _tree_sum(parts: list, name: str) -> Delayed:
    level = 0
    while len(parts) > 1:
        level += 1
        parts = [
            dask.delayed(_add)(*parts[i : i + TREE_FAN_IN], dask_key_name=f"{name}-sum-{level}-{i}")
            for i in range(0, len(parts), TREE_FAN_IN)
        ]
    return parts[0]


def _compute(total: Delayed, who: str):
    try:
        (result,) = dask.compute(total)
    except Exception as error:
        if type(error).__name__ == "KilledWorker":
            raise GradtapeError(
                f"{who}: the Dask cluster lost the workers computing the blocks ({error}); "
                "no partial sum is returned. Check the workers' memory and logs, then call "
                "again."
            ) from error
        raise
    return result


def _summed(fun: Callable, kind: str, argnums, data_argnums, backend: str, who: str) -> Callable:
    token = dask.base.tokenize(fun)

    def lazy(*args) -> Delayed:
        """The result as a Dask Delayed object, not yet computed (compose it with others)."""
        if kind == "hvp":
            if len(args) < 2:
                raise GradtapeError(f"{who}: call it as hvp_fun(params, v, *data).")
            params, tangent, rest = args[0], args[1], args[2:]
            nums, data_positions = _normalize_argnums(argnums, data_argnums, len(rest) + 1, who)
            if not isinstance(nums, int):
                raise GradtapeError(
                    f"{who}: argnums must be one int for hvp; pass the parameters as one pytree."
                )
            full = _insert(rest, nums, params)
            # the block function takes (params, tangent, *rest): where each data argument sits
            in_rest = [p - (p > nums) for p in data_positions]
            shared = (params, tangent) + tuple(r for j, r in enumerate(rest) if j not in in_rest)
            data_in_shared = tuple(2 + j for j in in_rest)
        else:
            nums, data_positions = _normalize_argnums(argnums, data_argnums, len(args), who)
            full = args
            shared = tuple(a for i, a in enumerate(args) if i not in data_positions)
            data_in_shared = data_positions
        blocks = _row_blocks(full, data_positions, who)
        # one fresh name per call for its task keys: hashing every task's arguments (as
        # Dask does for unnamed tasks) costs milliseconds on the client, and keys shared by
        # two calls with equal parameters race in the scheduler (a key released by one call
        # while the other gathers it)
        name = f"gradtape-{kind}-{uuid.uuid4().hex}"
        shared_delayed = dask.delayed(shared, traverse=False, name=f"{name}-shared")
        fun_delayed = dask.delayed(fun, pure=True, traverse=False)
        parts = [
            dask.delayed(_run_block)(
                fun_delayed,
                token,
                kind,
                nums,
                backend,
                shared_delayed,
                data_in_shared,
                *block_row,
                dask_key_name=f"{name}-block-{i}",
            )
            for i, block_row in enumerate(zip(*blocks, strict=True))
        ]
        return _tree_sum(parts, name)

    @functools.wraps(fun)
    def call(*args):
        return _compute(lazy(*args), who)

    call.lazy = lazy
    return call


def value_and_grad(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    *,
    data_argnums: int | Sequence[int],
    backend: str = "auto",
) -> Callable:
    """Value and gradient of ``fun`` summed over the row blocks of Dask arrays.

    Args:
        fun: plain NumPy code for one block of rows, returning a scalar: the total loss is
            the sum of ``fun`` over the blocks.
        argnums: position(s) of the parameters to differentiate (NumPy arrays or pytrees).
        data_argnums: position(s) of the data: Dask arrays chunked along axis 0 with the
            same row chunks and one chunk along every other axis, or NumPy arrays (one block,
            or split like the Dask arrays beside them).
        backend: the ``gradtape.compile`` backend each worker uses.

    Returns:
        ``f(*args) -> (value, gradient)``: a Python float and the gradient as NumPy arrays
        with the structure of the parameters, computed on the active Dask scheduler.

    Raises:
        GradtapeError: mismatched row chunks, data chunked along other axes, data that is
            not an array, a non-scalar block loss, or a cluster that lost its workers.

    Example:
        >>> import dask.array as da, numpy as np, gradtape.dask as gtd
        >>> X = da.ones((1000, 3), chunks=(250, 3))
        >>> vg = gtd.value_and_grad(lambda w, X: np.sum((X @ w) ** 2), data_argnums=1)
        >>> value, g = vg(np.ones(3), X)
        >>> float(value), g.tolist()
        (9000.0, [6000.0, 6000.0, 6000.0])
    """
    return _summed(fun, "value_and_grad", argnums, data_argnums, backend, "value_and_grad")


def grad(
    fun: Callable,
    argnums: int | Sequence[int] = 0,
    *,
    data_argnums: int | Sequence[int],
    backend: str = "auto",
) -> Callable:
    """Gradient of ``fun`` summed over the row blocks of Dask arrays.

    Arguments, errors and scheduling as ``value_and_grad``; returns only the gradient.

    Example:
        >>> import dask.array as da, numpy as np, gradtape.dask as gtd
        >>> X = da.ones((100, 2), chunks=(30, 2))
        >>> gtd.grad(lambda w, X: np.sum(X @ w), data_argnums=1)(np.zeros(2), X).tolist()
        [100.0, 100.0]
    """
    value_and_gradient = _summed(
        fun, "value_and_grad", argnums, data_argnums, backend, "value_and_grad"
    )

    @functools.wraps(fun)
    def gradient(*args):
        return value_and_gradient(*args)[1]

    gradient.lazy = lambda *args: dask.delayed(operator.itemgetter(1), pure=True)(
        value_and_gradient.lazy(*args)
    )
    return gradient


def hvp(
    fun: Callable,
    argnums: int = 0,
    *,
    data_argnums: int | Sequence[int],
    backend: str = "auto",
) -> Callable:
    """Hessian-vector product of ``fun`` summed over the row blocks of Dask arrays.

    Returns ``h(params, v, *data) -> H v``, where ``params`` stands at ``argnums`` among
    the function's arguments (``data`` are the others, in order) and ``v`` has the structure
    of ``params``. The product is forward over reverse on each block, summed in a tree.

    Raises:
        GradtapeError: as ``value_and_grad``; and for a tuple ``argnums`` (pass the
            parameters as one pytree instead).

    Example:
        >>> import dask.array as da, numpy as np, gradtape.dask as gtd
        >>> X = da.ones((10, 2), chunks=(5, 2))
        >>> h = gtd.hvp(lambda w, X: np.sum((X @ w) ** 2), data_argnums=1)
        >>> h(np.zeros(2), np.array([1.0, 0.0]), X).tolist()
        [20.0, 20.0]
    """
    return _summed(fun, "hvp", argnums, data_argnums, backend, "hvp")
