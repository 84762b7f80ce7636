"""Remote side of the KCoral tools: runs inside a server worker, standard library only.

Uploaded as part of a generated module (see ``kcoral.runners.bundle_source``) together
with ``sandboxed.py`` and ``kcoral/iket.py``, so it must work on a stock KCoral
server that has no ``kcoral`` package. Entry points (each returns a plain dict, which
the protocol carries as a typed value; bytes travel as binary parts):

- ``run_python(archive, spec)``: ``python SCRIPT ARGS`` (the worker's interpreter).
- ``run_ncu(archive, spec)``: Nsight Compute around an app, then its raw CSV page.
- ``run_iket(archive, spec)``: an app with IKET=1, then every buffer converted to a trace.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:  # inside the uploaded bundle the sibling files are injected by the prelude
    _sandboxed = _KCORAL_EMBEDDED["sandboxed"]  # type: ignore[name-defined]
    _iket = _KCORAL_EMBEDDED["iket"]  # type: ignore[name-defined]
    _ncu_columns = _KCORAL_EMBEDDED["ncu_columns"]  # type: ignore[name-defined]
except NameError:  # imported as a normal module (tests, local use)
    from kcoral import iket as _iket
    from kcoral import ncu_columns as _ncu_columns
    from kcoral.runners import sandboxed as _sandboxed

# Never taken from the client: the server assigns the GPU through its own environment.
# CUDA_DEVICE_ORDER too: it changes which GPU an index in CUDA_VISIBLE_DEVICES names.
REFUSED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})
DEFAULT_OUTPUT_CAP = 4 << 20  # bytes of stdout and of stderr kept per run
DEFAULT_FILES_CAP = 512 << 20  # bytes of collected output files per run
PROFILE_IMPORT_MIN_S = 10.0  # the profile page is read only with this much of the timeout left


class RunnerError(RuntimeError):
    """A request the runner refuses; raised so the server answers FAILED with the text."""


def _spec_list(spec: dict, key: str) -> list[str]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RunnerError(f"spec field {key!r} must be a list of strings")
    return list(value)


def _environment(spec: dict) -> tuple[dict[str, str], list[str]]:
    env = dict(os.environ)
    ignored: list[str] = []
    overrides = spec.get("env") or {}
    if not isinstance(overrides, dict):
        raise RunnerError("spec field 'env' must be an object of strings")
    for name, value in overrides.items():
        if not isinstance(name, str) or not isinstance(value, str) or not name or "=" in name:
            raise RunnerError(f"bad environment variable {name!r}")
        if name in REFUSED_ENV:
            ignored.append(name)
            continue
        env[name] = value
    return env, ignored


def _resolve_app(app: list[str]) -> list[str]:
    # "python" in an app means the worker's interpreter (the one with the GPU stack),
    # not whichever python happens to be first on the server's PATH.
    if not app:
        raise RunnerError("no application command given")
    if app[0] in ("python", "python3"):
        return [sys.executable] + app[1:]
    return list(app)


def _read_capped(path: str, cap: int) -> tuple[str, bool]:
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        if size <= cap:
            return fh.read().decode("utf-8", "replace"), False
        # Keep the head and the tail: the start says what ran, the end how it ended.
        head = fh.read(cap // 2)
        fh.seek(size - cap // 2)
        tail = fh.read()
    skipped = size - len(head) - len(tail)
    text = (head.decode("utf-8", "replace")
            + f"\n[... {skipped} bytes of output dropped ...]\n"
            + tail.decode("utf-8", "replace"))
    return text, True


def _run(cmd: list[str], cwd: str, env: dict[str, str], timeout: float,
         scratch: str, output_cap: int) -> dict:
    out_path = os.path.join(scratch, "stdout")
    err_path = os.path.join(scratch, "stderr")
    started = time.monotonic()
    timed_out = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            # The app stays in the worker's process group: a server that kills a worker's
            # group (on its own timeout) then takes the app and the app's children too.
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err)
        except OSError as exc:
            raise RunnerError(f"cannot start {cmd[0]!r}: {exc}") from None
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _sandboxed.kill_tree(proc)
    stdout, out_trunc = _read_capped(out_path, output_cap)
    stderr, err_trunc = _read_capped(err_path, output_cap)
    return {"exit_code": code, "timed_out": timed_out, "stdout": stdout, "stderr": stderr,
            "stdout_truncated": out_trunc, "stderr_truncated": err_trunc,
            "elapsed_s": round(time.monotonic() - started, 3)}


def _normalize_output(path: str) -> str:
    try:
        return _sandboxed.normalize_path(path, allow_root=True)
    except _sandboxed.PathError as exc:
        raise RunnerError(f"bad output path {path!r}: {exc}") from None


def _through_link(run_dir: str, rel: str) -> bool:
    current = run_dir
    for part in rel.split("/") if rel else []:
        current = os.path.join(current, part)
        if os.path.islink(current):
            return True
    return False


def _collect(run_dir: str, wanted: list[str], cap: int) -> dict:
    """Read requested files (or every regular file under a requested directory).

    Links are never followed: a requested path through a link, or a link or special
    file inside a requested directory, is reported in ``refused`` instead."""
    files: dict[str, bytes] = {}
    missing: list[str] = []
    refused: list[str] = []
    total = 0
    for raw in wanted:
        rel = _normalize_output(raw)
        full = os.path.join(run_dir, *rel.split("/")) if rel else run_dir
        if _through_link(run_dir, rel):
            refused.append(raw)
            continue
        if not os.path.lexists(full):
            missing.append(raw)
            continue
        if os.path.isdir(full):
            items = []
            for cur, dirs, names in os.walk(full, followlinks=False):
                links = [d for d in dirs if os.path.islink(os.path.join(cur, d))]
                for n in names + links:
                    items.append(os.path.relpath(os.path.join(cur, n), run_dir)
                                 .replace(os.sep, "/"))
        else:
            items = [rel]
        for item in sorted(items):
            try:  # the app's leftover children may swap a checked path for a link
                fd = _sandboxed.open_read_under(run_dir, item)
            except OSError:  # a link on the way, or not a regular file
                refused.append(item)
                continue
            with os.fdopen(fd, "rb") as fh:
                total += os.fstat(fh.fileno()).st_size
                if total > cap:
                    raise RunnerError(f"output files exceed the limit of {cap} bytes at {item!r}")
                files[item] = fh.read()
    return {"files": files, "missing": missing, "refused": refused}


class _Workspace:
    """Fresh directories under the request's working directory, removed afterwards, so
    the runner leaves nothing behind even on a server that reuses its cwd."""

    def __init__(self, archive: bytes, spec: dict):
        self.base = tempfile.mkdtemp(prefix="kcoral-tool-", dir=os.getcwd())
        self.run_dir = os.path.join(self.base, "run")
        self.scratch = os.path.join(self.base, "scratch")
        os.mkdir(self.run_dir)
        os.mkdir(self.scratch)
        limit = spec.get("max_archive_bytes") or _sandboxed.DEFAULT_MAX_TOTAL_BYTES
        try:
            if archive:
                _sandboxed.safe_unpack(archive, self.run_dir, max_total_bytes=int(limit))
        except _sandboxed.ArchiveError as exc:
            self.close()
            raise RunnerError(f"refused the sent archive: {exc}") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> "_Workspace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timeout(spec: dict) -> float:
    value = spec.get("timeout", 300)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise RunnerError("spec field 'timeout' must be a positive number of seconds")
    return float(value)


def _caps(spec: dict) -> tuple[int, int]:
    return (int(spec.get("output_cap") or DEFAULT_OUTPUT_CAP),
            int(spec.get("files_cap") or DEFAULT_FILES_CAP))


def run_python(archive: bytes, spec: dict) -> dict:
    """spec: script, args, env, timeout, outputs. Runs ``python SCRIPT ARGS`` where the
    archive was unpacked; returns exit status, output, requested files."""
    script = spec.get("script")
    if not isinstance(script, str) or not script:
        raise RunnerError("spec field 'script' must name the script to run")
    args = _spec_list(spec, "args")
    outputs = _spec_list(spec, "outputs")
    env, ignored = _environment(spec)
    out_cap, files_cap = _caps(spec)
    with _Workspace(archive, spec) as ws:
        result = _run([sys.executable, script, *args], ws.run_dir, env, _timeout(spec),
                      ws.scratch, out_cap)
        result.update(_collect(ws.run_dir, outputs, files_cap))
    result["ignored_env"] = ignored
    return result


# Nsight Compute is often installed without being on PATH. (evolve's preflight asks the
# server the same question with these patterns: evolve/preflight.py.)
NCU_PATTERNS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/NVIDIA-Nsight-Compute*/ncu")


def _find_ncu(env: dict[str, str]) -> str:
    found = shutil.which("ncu", path=env.get("PATH"))
    if found:
        return found
    for pattern in NCU_PATTERNS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    raise RunnerError("ncu (Nsight Compute) was not found on the server: not on PATH nor "
                      "in /usr/local/cuda/bin or /opt/nvidia/nsight-compute")


def _merge_metrics(ncu_args: list[str], metrics: list[str]) -> tuple[list[str], list[str]]:
    # A user --metrics list joins ours rather than making ncu see the option twice.
    rest: list[str] = []
    merged = list(metrics)
    i = 0
    while i < len(ncu_args):
        a = ncu_args[i]
        value = None
        if a == "--metrics" and i + 1 < len(ncu_args):
            value, i = ncu_args[i + 1], i + 2
        elif a.startswith("--metrics="):
            value, i = a.split("=", 1)[1], i + 1
        else:
            rest.append(a)
            i += 1
            continue
        for m in value.split(","):
            if m and m not in merged:
                merged.append(m)
    return rest, merged


def _needs_source_counters(metric: str) -> bool:
    return metric.startswith("derived__") or metric.startswith("memory_l2_theoretical_sectors")


def ncu_command(ncu: str, report: str, ncu_args: list[str], metrics: list[str],
                app: list[str]) -> list[str]:
    """The profiling command line (kept separate so tests can check it exactly).

    Measured with ncu 2025.3.1: ``derived__*`` metrics cannot be requested at capture time
    ("Failed to find metric regex"); they come from the SourceCounters section and are
    read back at import. So only the other metrics go to ``--metrics`` here, and the
    section is added when a sector metric is wanted."""
    rest, merged = _merge_metrics(ncu_args, metrics)
    cmd = [ncu, "--export", report, "--force-overwrite"]
    if not any(a == "--clock-control" or a.startswith("--clock-control=") for a in rest):
        # Clocks as the benchmark sees them, not ncu's base-clock lock.
        cmd += ["--clock-control", "none"]
    capture = [m for m in merged if not m.startswith("derived__")]
    if capture:
        cmd += ["--metrics", ",".join(capture)]
    if any(_needs_source_counters(m) for m in merged) and not _has_section(rest, "SourceCounters"):
        cmd += ["--section", "SourceCounters"]
    return cmd + rest + app


def _has_section(args: list[str], name: str) -> bool:
    for i, a in enumerate(args):
        if a == "--section" and i + 1 < len(args) and args[i + 1] == name:
            return True
        if a == f"--section={name}":
            return True
    return False


def run_ncu(archive: bytes, spec: dict) -> dict:
    """spec: app, ncu_args, metrics, env, timeout. Profiles the app into a report, then
    prints the report's raw page as CSV; returns both (the client parses the CSV)."""
    app = _resolve_app(_spec_list(spec, "app"))
    ncu_args = _spec_list(spec, "ncu_args")
    metrics = _spec_list(spec, "metrics")
    env, ignored = _environment(spec)
    out_cap, _ = _caps(spec)
    ncu = _find_ncu(env)
    timeout = _timeout(spec)
    deadline = time.monotonic() + timeout
    with _Workspace(archive, spec) as ws:
        report = os.path.join(ws.scratch, "report.ncu-rep")
        result = _run(ncu_command(ncu, report, ncu_args, metrics, app), ws.run_dir, env,
                      timeout, ws.scratch, out_cap)
        result["report"] = None
        result["csv"] = None
        result["import_stderr"] = ""
        result["profile_csv"] = None
        if os.path.isfile(report):
            result["report"] = _read_under(ws.base, "scratch/report.ncu-rep")
            left = max(5.0, deadline - time.monotonic())
            imp = _run([ncu, "--import", report, "--page", "raw", "--csv", "--print-units",
                        "base", "--metrics", ",".join(_merge_metrics(ncu_args, metrics)[1])],
                       ws.run_dir, env, left, _fresh(ws.scratch, "import"), 64 << 20)
            result["csv"] = imp["stdout"]
            result["import_exit_code"] = imp["exit_code"]
            result["import_stderr"] = imp["stderr"]
            # Best effort, never the tool's failure: the whole raw page, cut to the profile
            # metrics (kcoral/ncu_columns.py says why they are matched rather than named),
            # only in the time left, so that it can never cost the report and key metrics.
            left = deadline - time.monotonic()
            if left >= PROFILE_IMPORT_MIN_S:
                page = _run([ncu, "--import", report, "--page", "raw", "--csv", "--print-units", "base"],
                            ws.run_dir, env, left, _fresh(ws.scratch, "profile"), 64 << 20)
                if page["exit_code"] == 0 and not page["timed_out"]:
                    result["profile_csv"] = _ncu_columns.profile_columns(page["stdout"])
    result["ignored_env"] = ignored
    return result


def _read_under(base: str, rel: str) -> bytes | None:
    """A file the app wrote, or None if it is not a regular file: the app shares the
    workspace, so a link it put in place of the file, or of its folder, is not followed."""
    try:
        fd = _sandboxed.open_read_under(base, rel)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _fresh(parent: str, name: str) -> str:
    path = os.path.join(parent, name)
    os.mkdir(path)
    return path


def run_iket(archive: bytes, spec: dict) -> dict:
    """spec: app, env, timeout, include_raw. Runs the app with IKET=1 and IKET_OUT set,
    converts each ``<kernel>.iket.bin`` + ``.iket.json`` pair to ``<kernel>.trace.json``."""
    app = _resolve_app(_spec_list(spec, "app"))
    env, ignored = _environment(spec)
    out_cap, files_cap = _caps(spec)
    include_raw = bool(spec.get("include_raw", True))
    with _Workspace(archive, spec) as ws:
        iket_dir = _fresh(ws.base, "iket")
        env["IKET"] = "1"
        env["IKET_OUT"] = iket_dir
        result = _run(app, ws.run_dir, env, _timeout(spec), ws.scratch, out_cap)
        names = [n for n in os.listdir(iket_dir)
                 if os.path.isfile(os.path.join(iket_dir, n))
                 and not os.path.islink(os.path.join(iket_dir, n))]
        pairs, lonely = _iket.find_pairs(names)
        traces: dict[str, bytes] = {}
        raw: dict[str, bytes] = {}
        errors: dict[str, str] = {}
        total = 0
        for kernel, (bin_name, meta_name) in sorted(pairs.items()):
            bin_bytes = _read_under(ws.base, "iket/" + bin_name)
            meta_bytes = _read_under(ws.base, "iket/" + meta_name)
            if bin_bytes is None or meta_bytes is None:
                errors[kernel] = "its files are not regular files (a link?): not read"
                continue
            try:
                trace = _iket.convert_pair(bin_bytes, meta_bytes)
            except _iket.IketError as exc:
                errors[kernel] = str(exc)
                trace = None
            total += len(trace or b"") + (len(bin_bytes) + len(meta_bytes) if include_raw else 0)
            if total > files_cap:
                raise RunnerError(f"IKET files exceed the limit of {files_cap} bytes")
            if trace is not None:
                traces[kernel + _iket.TRACE_SUFFIX] = trace
            if include_raw:
                raw[bin_name] = bin_bytes
                raw[meta_name] = meta_bytes
        result.update({"traces": traces, "raw": raw, "errors": errors, "unpaired": lonely})
    result["ignored_env"] = ignored
    return result
