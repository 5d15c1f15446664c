"""The Triton KDA kernels by stage (prep, solve, state, bwd) and their shared pieces (common);
`kernels/kda/chunk_triton.py` puts them together (its docstring has the mathematics)."""
