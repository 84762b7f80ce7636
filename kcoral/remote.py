"""Remote tools as a library: run a Python script, Nsight Compute or an IKET capture on
a KCoral server, with local directories sent along. The CLI tools and ``evolve`` both
call these functions.

Each call builds one program: upload the runner module (``kcoral.runners``), upload the
packed sends as bytes, run the runner's entry point, return its result dict.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .archive import ArchiveError, pack_directories
from .capabilities import capabilities_of
from .client import Client
from .errors import NcuError, RemoteError, ToolInputError
from .ncu import KEY_METRICS, NcuMetrics, add_profile, parse_raw_csv
from .outcome import Outcome
from .program import Program
from .protocol.error_kind import ErrorKind
from .protocol.limits import MAX_TIMEOUT_SECONDS
from .runners import bundle_source
from .runners.sandboxed import PathError, normalize_path

# Set by the server for each worker; a client value would point the app at another GPU.
# CUDA_DEVICE_ORDER too: it changes which GPU an index in CUDA_VISIBLE_DEVICES names.
REFUSED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})
# Credentials and evolve's settings (its database above all) never reach a remote app:
# what the app can read, the candidate it imports can read.
PRIVATE_ENV_PREFIXES = ("KCORAL_TOKEN", "KCORAL_SERVER_TOKEN", "EVOLVE_")


@dataclass(frozen=True)
class SendSpec:
    """A local directory, placed remotely at ``remote_subdir`` ("" = the run directory)."""

    local_dir: Path
    remote_subdir: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "local_dir", Path(self.local_dir))
        if not isinstance(self.remote_subdir, str):
            raise ToolInputError("remote_subdir must be a string")
        if self.remote_subdir:
            try:
                norm = normalize_path(self.remote_subdir, allow_root=True)
            except PathError as exc:
                raise ToolInputError(f"bad remote directory {self.remote_subdir!r}: {exc}") from None
            object.__setattr__(self, "remote_subdir", norm)

    @classmethod
    def parse(cls, text: str) -> "SendSpec":
        """``DIR`` or ``DIR:SUBDIR`` (a DIR that exists with its colon wins)."""
        if ":" in text and not os.path.isdir(text):
            local, _, sub = text.rpartition(":")
            return cls(Path(local), sub)
        return cls(Path(text))


def pack_sends(sends: Sequence[SendSpec]) -> bytes:
    """One archive of every send; links refused, colliding sends refused (ToolInputError)."""
    if not sends:
        return b""
    for s in sends:
        if not Path(s.local_dir).is_dir():
            raise ToolInputError(f"--send {s.local_dir}: not a directory")
    try:
        return pack_directories([(s.local_dir, s.remote_subdir) for s in sends])
    except ArchiveError as exc:
        raise ToolInputError(str(exc)) from None


def parse_env(items: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``NAME=VALUE`` or ``NAME`` (taken from the local environment) -> dict."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not name or not (name[0].isalpha() or name[0] == "_") or not all(
                c.isalnum() or c == "_" for c in name):
            raise ToolInputError(f"-e {item!r}: not a valid environment variable name")
        if not eq:
            if name not in environ:
                raise ToolInputError(f"-e {name}: not set in the local environment "
                                     f"(give -e {name}=VALUE)")
            value = environ[name]
        out[name] = value
    check_env(out)
    return out


def is_private_env(name: str) -> bool:
    """A credential or an evolve setting: never sent with a program."""
    return name.upper().startswith(PRIVATE_ENV_PREFIXES)


def check_env(env: Mapping[str, str], token: str | None = None) -> None:
    """Refuse what a client must not set remotely: the GPU assignment, private names, and
    any value holding the client's own token (`-e X=$KCORAL_TOKEN`)."""
    refused = sorted(REFUSED_ENV & set(env))
    if refused:
        raise ToolInputError(f"{', '.join(refused)} cannot be set by the client: the server "
                             "assigns each worker its GPU")
    private = sorted(name for name in env if is_private_env(name))
    if private:
        raise ToolInputError(f"{', '.join(private)} is private (a credential or an evolve setting) "
                             "and is never sent to the server")
    holding = sorted(name for name, value in env.items() if token and token in value)
    if holding:
        raise ToolInputError(f"{', '.join(holding)} holds the client's token, which is never sent "
                             "to the server")


def server_max_timeout(client: Any) -> float:
    """The server's timeout ceiling (stock: 900 s); our server's for a client that cannot say."""
    ask = getattr(client, "max_timeout", None)
    return float(ask()) if callable(ask) else MAX_TIMEOUT_SECONDS


def require_gpu(client: Any, tool: str) -> None:
    """Refuse a GPU-only tool on a stock CPU server before sending anything (ours answers
    for itself: its CPU workers may still have the tool)."""
    info = capabilities_of(client)
    if info is not None and info.stock_cpu:
        raise RemoteError(ErrorKind.UNAVAILABLE, f"{tool} needs a GPU, and this server ({info.describe()}) "
                          "has none (gpu_count=0)")


def inner_timeout(timeout: float) -> float:
    """The runner's own limit: a little below the program's, so that the runner (not the
    server) stops the app and still returns its output and files."""
    if timeout <= 0:
        raise ToolInputError("timeout must be positive")
    margin = min(30.0, max(2.0, 0.1 * timeout))
    return max(1.0, timeout - margin)


class ToolRun(BaseModel):
    """What every tool returns: the app's exit status and output, and the outcome."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    exit_code: int
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    elapsed_s: float = 0.0
    ignored_env: list[str] = Field(default_factory=list)
    outcome: Outcome | None = Field(default=None, exclude=True)


class PythonResult(ToolRun):
    files: dict[str, bytes] = Field(default_factory=dict)
    missing: list[str] = Field(default_factory=list)
    refused: list[str] = Field(default_factory=list)


class NcuResult(ToolRun):
    report: bytes | None = None
    csv: str | None = None
    import_exit_code: int | None = None
    import_stderr: str = ""
    profile_csv: str | None = None  # the raw page's profile columns (kcoral/ncu_columns.py)
    metrics: NcuMetrics = Field(default_factory=NcuMetrics)
    metrics_error: str | None = None  # why the CSV could not be parsed, if it could not


class IketResult(ToolRun):
    traces: dict[str, bytes] = Field(default_factory=dict)
    raw: dict[str, bytes] = Field(default_factory=dict)
    errors: dict[str, str] = Field(default_factory=dict)
    unpaired: list[str] = Field(default_factory=list)


def _execute(client: Client, entry: str, sends: Sequence[SendSpec], spec: dict[str, Any],
             timeout: float) -> tuple[dict[str, Any], Outcome]:
    check_env(spec.get("env") or {}, getattr(client, "token", None))
    # Clamp to the server's own ceiling, so the runner's limit stays below what it enforces.
    timeout = min(float(timeout), server_max_timeout(client))
    spec = dict(spec, timeout=inner_timeout(timeout))
    archive = pack_sends(sends)
    p = Program()
    module = p.upload(kind="module", source=bundle_source())
    fn = p.get_function(module=module, name=entry)  # keeps the GPU lease: the app needs it
    data = p.upload(kind="bytes", value=archive)
    out = p.run(fn=fn, args=[data, spec])
    p.return_(key="result", value=out)
    outcome = client.execute(p, timeout_seconds=timeout)
    outcome.raise_for_failure()
    result = outcome.results.get("result")
    if not isinstance(result, dict):
        raise RemoteError(ErrorKind.SERIALIZATION, f"the runner returned {type(result).__name__}, "
                          "not its result object", None, outcome.request_id)
    return result, outcome


def _model(cls: type[ToolRun], result: dict[str, Any], outcome: Outcome) -> Any:
    try:
        return cls.model_validate({**result, "outcome": outcome})
    except ValidationError as exc:
        raise RemoteError(ErrorKind.SERIALIZATION, f"unexpected runner result: {exc}", None,
                          outcome.request_id) from None


def run_python(client: Client, sends: Sequence[SendSpec], script: str,
               args: Sequence[str] = (), env: Mapping[str, str] | None = None,
               timeout: float = 600, outputs: Sequence[str] = ()) -> PythonResult:
    """``python SCRIPT ARGS`` with the worker's interpreter where the sends are unpacked.
    ``outputs`` are paths (files or directories) relative to that directory."""
    for o in outputs:
        try:
            normalize_path(o, allow_root=True)
        except PathError as exc:
            raise ToolInputError(f"-o {o!r}: {exc}") from None
    spec = {"script": script, "args": list(args), "env": dict(env or {}),
            "outputs": list(outputs)}
    result, outcome = _execute(client, "run_python", sends, spec, timeout)
    return _model(PythonResult, result, outcome)


def run_ncu(client: Client, sends: Sequence[SendSpec], app: Sequence[str],
            ncu_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
            timeout: float = 600, metrics: Sequence[str] | None = None) -> NcuResult:
    """Nsight Compute around ``app``; ``metrics`` defaults to the key metrics (KEY_METRICS),
    always collected in addition to whatever ``ncu_args`` asks for."""
    if not app:
        raise ToolInputError("no application to profile (give it after --)")
    for a in ncu_args:
        if a in ("-o", "--export", "-f", "--force-overwrite", "--import") or a.startswith("--export="):
            raise ToolInputError(f"ncu option {a} is managed by the tool (use -o LOCAL.ncu-rep)")
    require_gpu(client, "kcoral ncu")
    spec = {"app": list(app), "ncu_args": list(ncu_args), "env": dict(env or {}),
            "metrics": list(KEY_METRICS if metrics is None else metrics)}
    result, outcome = _execute(client, "run_ncu", sends, spec, timeout)
    res: NcuResult = _model(NcuResult, result, outcome)
    if res.csv is not None:
        try:
            res.metrics = parse_raw_csv(res.csv)
        except NcuError as exc:
            res.metrics_error = str(exc)
        if res.profile_csv:
            try:
                add_profile(res.metrics, parse_raw_csv(res.profile_csv))
            except NcuError:
                pass  # the profile columns are extra: the key metrics stand without them
    elif res.report is None:
        res.metrics_error = "ncu wrote no report"
    return res


def run_iket(client: Client, sends: Sequence[SendSpec], app: Sequence[str],
             env: Mapping[str, str] | None = None, timeout: float = 600,
             include_raw: bool = True, files_cap: int | None = None) -> IketResult:
    """``app`` with IKET=1 and IKET_OUT set; every buffer/meta pair comes back converted
    to ``<kernel>.trace.json`` (and, with ``include_raw``, as the raw pair too);
    ``files_cap``: the most bytes of them the server sends (else its own default)."""
    if not app:
        raise ToolInputError("no application to run (give it after --)")
    require_gpu(client, "kcoral iket")
    spec: dict[str, Any] = {"app": list(app), "env": dict(env or {}), "include_raw": include_raw}
    if files_cap is not None:
        spec["files_cap"] = files_cap
    result, outcome = _execute(client, "run_iket", sends, spec, timeout)
    return _model(IketResult, result, outcome)
