"""The numba backend: a compiled tape as fused native loops (`compile(f, backend="numba")`).

One job per module; the modules import one way, none in a circle:

* `status`, `notices`, `drivers`: leaves (the status codes kernels return, warnings said once,
  which loop primitives have native drivers).
* `scalar`: the scalar expression of an elementwise instruction, from its primitive's
  declared `native` form; literals, casts and the dtypes kernels take.
* `fusion`: which instructions share a loop, what is stored (the plan).
* `lowering`: the table of the other primitives the kernels compute (keyed by Primitive).
* `generator`: what the writers of one variant share and produce (plain data).
* `kernel`: the kernel of one segment of a plan (`matmul`: matrix products; `indexing`:
  reads and writes through indices).
* `wrapper`: the generated Python function around the kernels (results, fallbacks).
* `codegen`: `generate(program)`: plan, kernels' module and wrapper of one variant.
* `backend`: compiling kernels (a background thread, the tiers, the thread setting).
* `loops`: native drivers of loop primitives (scan, its backward loop, while_loop); it
  registers them in `drivers`, so the code generator never imports it.
* `runtime`, `fastmath`: what the kernels import (helpers, vectorizable libm).
* `cache`: the disk cache of kernel modules (`numba_cache`: Numba's own cache files of a
  kernel, kept there and checksummed, and building a module's kernels through them; the one
  cache module that imports Numba).
* `handle_status`: the status codes of native handles (a leaf).
* `export`: native handles (`CompiledFunction.as_native`): a variant's kernels behind a
  Numba function and a C entry point (`export_runtime`: the entry points, written as LLVM IR).

Importing this package imports neither Numba nor its modules; `backend` registers the
backend (gradtape.compile imports it).
"""
