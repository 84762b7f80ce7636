"""The KDA forward judge: inputs, references, correctness gate and timer.

Shipped with every bench and run on the server, so it depends only on the standard
library, NumPy and ml_dtypes, plus CuPy / torch / fla when the server has them.
"""

import sys as _sys

# The sandbox helpers (process trees, no-follow opens) are kcoral's: every bench archive
# carries a copy here (kcoral.bench.staging); a judge run beside kcoral (its tests, the
# installed package) uses kcoral's, under the same name.
try:
    from . import sandboxed  # type: ignore[attr-defined]  # staged in bench archives only
except ImportError:
    from kcoral.runners import sandboxed

    _sys.modules[__name__ + ".sandboxed"] = sandboxed

__all__ = ["sandboxed"]
