"""What a KCoral server offers beyond the released protocol, as the client learns it.

Our server lists its extensions in `/health` (`"extensions": [...]`); a stock server has
no such key, and its version is in `/openapi.json` (`info.version`). The client asks once
and builds every program for what the server announced, so one client serves both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .extensions import OptIn
from .protocol.limits import MAX_TIMEOUT_SECONDS

# Extension names our server announces in /health (it announces SERVER_EXTENSIONS).
BUILTINS = "builtins"                    # run targets "builtin.<name>"
CUDA_SOURCE = "cuda_source"              # module uploads with language="cuda"
EXTRA_DTYPES = "extra_dtypes"            # uint16/32/64, complex64/128 tensors
HOLDOUT_SEEDS = "holdout_seeds"          # builtin.holdout_seeds (server-salted seeds)
MAX_TIMEOUT_3600 = "max_timeout_3600"    # timeout_seconds honoured up to 3600 s
FOLDER_RETURN_DOT = "folder_return_dot"  # a folder return of "." (the whole workspace)

STOCK_MAX_TIMEOUT = 900.0  # a stock server's default --max-timeout-seconds (it clamps silently)
# The released protocol from 0.1.1 on gives every instruction an id, file uploads included;
# 0.1.0 refuses an id there.
FILE_ID_SINCE = (0, 1, 1)


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


# A router's /health has no `extensions`; our nodes pass theirs in the `versions` map they
# report (the released gateway protocol has no other free-form field). The router admits one
# cohort, nodes whose target and versions are identical, so every node it routes to has them.
ROUTED_EXTENSIONS_KEY = "kcoral-evolve.extensions"


def routed_extensions(health: dict[str, Any]) -> list[str] | None:
    """The extensions our nodes behind a router announced, or None (not a router of ours)."""
    versions = health.get("versions")
    if "extensions" in health or not isinstance(versions, dict):
        return None
    text = versions.get(ROUTED_EXTENSIONS_KEY)
    return [e for e in text.split(",") if e] if isinstance(text, str) else None


def is_stock_health(health: dict[str, Any]) -> bool:
    """A stock `/health` (a released server's, or a router's with released nodes): no
    `extensions`, and its load counters in `load`."""
    return ("extensions" not in health and isinstance(health.get("load"), dict)
            and routed_extensions(health) is None)


@dataclass(frozen=True)
class ServerCapabilities:
    """`ours`: the server announced its extensions; otherwise it is treated as stock."""

    ours: bool
    extensions: frozenset[str] = field(default_factory=frozenset)
    gpu_count: int | None = None
    stock_version: str | None = None
    routed: bool = False   # a released router in front: a program in flight has no journal to replay it

    @classmethod
    def from_health(cls, health: dict[str, Any], stock_version: str | None = None) -> "ServerCapabilities":
        ext = health.get("extensions")
        gpus = health.get("gpu_count")
        gpu_count = gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else None
        # A router reports no GPU count (null) where every server reports a number.
        routed = "gpu_count" in health and health["gpu_count"] is None and isinstance(health.get("load"), dict)
        if not isinstance(ext, list):
            ext = routed_extensions(health)
        if isinstance(ext, list):
            return cls(ours=True, extensions=frozenset(str(e) for e in ext), gpu_count=gpu_count, routed=routed)
        if not is_stock_health(health):
            return UNKNOWN  # e.g. our server's short answer to a client without its token
        return cls(ours=False, gpu_count=gpu_count, stock_version=stock_version, routed=routed)

    def has(self, extension: str) -> bool:
        return extension in self.extensions

    @property
    def max_timeout(self) -> float:
        return MAX_TIMEOUT_SECONDS if self.has(MAX_TIMEOUT_3600) else STOCK_MAX_TIMEOUT

    @property
    def file_upload_ids(self) -> bool:
        """Whether file uploads carry an `id`: a stock server from 0.1.1 on needs one, 0.1.0
        and our server refuse or ignore it (ours accepts none before it learns them)."""
        if self.ours:
            return False
        version = _version_tuple(self.stock_version)
        return version is None or version >= FILE_ID_SINCE

    @property
    def has_gpu(self) -> bool | None:
        return None if self.gpu_count is None else self.gpu_count > 0

    @property
    def stock_cpu(self) -> bool:
        """A stock server without GPUs: GPU tools and workloads cannot run there (our CPU
        servers answer such programs for themselves)."""
        return not self.ours and self.has_gpu is False

    def describe(self) -> str:
        if self.ours:
            return "kcoral-server (extensions: " + (", ".join(sorted(self.extensions)) or "none") + ")"
        return f"stock KCoral {self.stock_version or '(version unknown)'}"


# Everything our server offers beyond the released protocol; those that are opt-ins apply
# only to requests that name them (KCoral-Extensions).
SERVER_EXTENSIONS = (BUILTINS, CUDA_SOURCE, EXTRA_DTYPES, HOLDOUT_SEEDS, MAX_TIMEOUT_3600, FOLDER_RETURN_DOT,
                     *(o.value for o in OptIn if o.value != EXTRA_DTYPES))

# Before the first answer, or when /health could not be read: send programs as they are.
UNKNOWN = ServerCapabilities(ours=True, extensions=frozenset(SERVER_EXTENSIONS))


def capabilities_of(client: Any) -> ServerCapabilities | None:
    """The client's view of its server, or None for a client that cannot say (a test fake)."""
    ask = getattr(client, "capabilities", None)
    return ask() if callable(ask) else None
