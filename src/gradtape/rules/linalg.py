"""Linear algebra primitives (matmul, einsum, solve, inv, cholesky, ...): being written."""
