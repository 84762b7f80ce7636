"""The protocol's limits: a program's timeout and output size (defaults and ceilings the
server clamps to), a traceback's length, and how many GPUs one program may lease."""
from __future__ import annotations

DEFAULT_TIMEOUT_SECONDS = 300.0
MAX_TIMEOUT_SECONDS = 3600.0
DEFAULT_OUTPUT_LIMIT = 1 << 20
MAX_OUTPUT_LIMIT = 16 << 20
TRACEBACK_LIMIT = 8 << 10
MAX_GPU_COUNT = 8
