"""kcoral-evolve: an evolutionary search orchestrator for GPU kernel candidates."""
import os as _os

# The search's surrogate factors matrices of a few hundred rows per proposal. OpenBLAS's
# threads, spinning against the orchestrator's other work on a loaded machine, made one
# such Cholesky 100 times slower (300 rows: 216 ms against 1.9 ms on a busy 2-core
# machine). One BLAS thread, unless the user chose otherwise; set here, before anything
# under `evolve` imports NumPy (the orchestrator runs no candidate code to slow down).
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_name, "1")
