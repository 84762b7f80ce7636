"""Server settings (filled by cli.py from flags and environment)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from .sandbox import SandboxMode

GiB = 1 << 30

# Distinct blobs one program may upload: each is an open descriptor in the server while it
# runs (and in its worker). A client's program sends one archive, or a tensor or bytes per
# argument; 21,000 of them once took every descriptor the server had.
MAX_BLOBS_PER_PROGRAM = 1024
# A worker holds its program's blob descriptors besides its own few; below this a program
# of many blobs would have descriptors dropped in passing (and hang until its timeout).
MIN_OPEN_FILES = MAX_BLOBS_PER_PROGRAM + 128


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8901, ge=0, le=65535)
    gpus: list[int] | None = None          # None: every visible GPU, else CPU workers
    cpu_workers: int | None = Field(None, ge=1)
    virtual_gpus: int = Field(0, ge=0)     # test-only: fake GPUs served by NumPy workers
    workers_per_gpu: int = Field(1, ge=1)
    token: SecretStr | None = None
    state_dir: str | None = None
    holdout_salt_file: str | None = None
    max_request_bytes: int = Field(2 * GiB, ge=1024)
    max_response_bytes: int = Field(4 * GiB, ge=1024)
    max_queue: int = Field(64, ge=0)        # requests waiting for a worker beyond this get 503
    queue_timeout_seconds: float = Field(120.0, gt=0)  # longest wait for a worker, then 503
    max_connections: int = Field(1000, ge=1)  # HTTP connections at once (uvicorn's limit_concurrency); more are closed
    header_timeout_seconds: float = Field(30.0, gt=0)  # to send a request head, from connecting or the last response
    blob_cache_bytes: int = Field(8 * GiB, ge=1 << 20)
    blob_dir: str | None = None             # parent of the blob cache folder (default: /dev/shm if roomy)
    work_dir: str | None = None             # parent of request folders (default: /dev/shm if roomy, else $TMPDIR)
    journal_retention_seconds: float = Field(3600.0, gt=0)
    journal_max_bytes: int = Field(1 << 30, gt=0)
    drain_timeout_seconds: float = Field(3900.0, gt=0)
    token_file: str | None = None            # hidden from requests, like the state directory
    sandbox: SandboxMode = SandboxMode.BWRAP  # none: programs run as the server's uid, unisolated
    sandbox_uid: int | None = Field(None, ge=1)  # as root: slot i runs as this + i (None: a free range, uidrange.py)
    max_memory_bytes: int = Field(2 * GiB, ge=0)   # RLIMIT_AS beyond the preloaded worker's (0: none; never on GPU workers)
    max_processes: int = Field(256, ge=0)          # RLIMIT_NPROC per request (0: none)
    max_file_bytes: int = Field(1 * GiB, ge=0)     # RLIMIT_FSIZE per request (0: none)
    max_open_files: int = Field(4096, ge=0)        # RLIMIT_NOFILE per process of a request (0: the server's)
    workspace_bytes: int = Field(2 * GiB, ge=1 << 20)  # the request's tmpfs: workspace, /tmp and /dev/shm
    # all of a request's processes together, a memory cgroup each (None: 3/4 of the memory over the slots; 0: none)
    request_memory_bytes: int | None = Field(None, ge=0)
    trusted_cache: str | None = None         # compile caches trusted code in requests may read (a bench's baseline)
    pin_cpus: bool = True                    # each worker slot's programs on their own share of the CPUs
    node_id: str | None = Field(None, min_length=1, max_length=128)  # set when joined to a router
    node_token_file: str | None = None       # hidden from requests, like token_file

    @field_validator("max_open_files")
    @classmethod
    def _room_for_blobs(cls, v: int) -> int:
        if 0 < v < MIN_OPEN_FILES:
            raise ValueError(f"max_open_files must be 0 (the server's own limit) or at least {MIN_OPEN_FILES}: "
                             f"a program's worker holds up to {MAX_BLOBS_PER_PROGRAM} blob descriptors")
        return v
