"""Scenarios run by a released KCoral client against our server, in a subprocess.

Usage: python -P scenarios.py EXPECTED_DIR URL
Prints one JSON object: {scenario name: what the released client saw}. Only the released
client's own API (and its light dependencies) is used here; a scenario's exception is
reported as data so that every scenario runs.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable

import kcoral
from kcoral import Client, Program

ECHO = "def echo(*args):\n    return list(args)\n"


def _outcome(result: Any) -> dict[str, Any]:
    return {"status": result.status, "error": result.error, "request_id": result.request_id}


def _raised(exc: BaseException) -> dict[str, Any]:
    return {"raised": type(exc).__name__, "message": str(exc)[:2000],
            "status_code": getattr(exc, "status_code", None), "kind": getattr(exc, "kind", None),
            "trace": traceback.format_exc()[-2000:]}


def _module_program(source: str, name: str, args: list[Any] | None = None, cpu_only: bool = False) -> Program:
    p = Program()
    mod = p.upload(kind="module", source=source)
    fn = p.get_function(module=mod, name=name, cpu_only=cpu_only)
    p.return_(key="out", value=p.run(fn=fn, args=args or []))
    return p


def folder_upload(c: Client) -> dict[str, Any]:
    """upload_folder and upload_file (0.1.1 gives both ids; 0.1.0 neither)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sub").mkdir()
        (Path(tmp) / "a.txt").write_bytes(b"alpha")
        (Path(tmp) / "sub" / "b.txt").write_bytes(b"beta")
        p = Program()
        p.upload_folder(tmp, path="data")
        p.upload_file(blob=b"delta", path="d.txt")
        p.return_folder(key="data", path="data")
        p.return_file(key="d", path="d.txt")
        r = c.execute(p, timeout_seconds=60)
    return {**_outcome(r), "files": sorted(r.results["data"].files) if "data" in r.results else None,
            "ids": [i.get("id") for i in p.instructions if i["op"] == "upload" and i.get("kind") == "file"],
            "d": r.results["d"].read_bytes().decode() if "d" in r.results else None}


def file_upload_ids(c: Client) -> dict[str, Any]:
    p = Program()
    named = p.upload_file(blob=b"gamma", path="c.txt", id="c_file")
    mod = p.upload(kind="module", source="def read(path):\n    return open(path).read()\n")
    p.return_(key="c", value=p.run(fn=p.get_function(module=mod, name="read"), args=[named]))
    p.return_file(key="named", path=named)
    r = c.execute(p, timeout_seconds=60)
    return {**_outcome(r), "c": r.results.get("c"),
            "named": r.results["named"].read_bytes().decode() if "named" in r.results else None}


def worker_death(c: Client) -> dict[str, Any]:
    return _outcome(c.execute(_module_program("import os\ndef main():\n    os._exit(3)\n", "main"), timeout_seconds=60))


def cuda_error_kind(c: Client) -> dict[str, Any]:
    # The exception class CuPy raises for a CUDA fault, raised here without a GPU.
    src = ("class CUDARuntimeError(RuntimeError):\n    pass\n"
           "def main():\n    raise CUDARuntimeError('cudaErrorIllegalAddress: an illegal memory access')\n")
    return _outcome(c.execute(_module_program(src, "main"), timeout_seconds=60))


def extra_dtype_return(c: Client) -> dict[str, Any]:
    src = "import numpy as np\ndef main():\n    return np.arange(4, dtype=np.uint16)\n"
    return _outcome(c.execute(_module_program(src, "main"), timeout_seconds=60))


def zero_d_array(c: Client) -> dict[str, Any]:
    src = "import numpy as np\ndef main():\n    return np.array(2.5, dtype=np.float32)\n"
    r = c.execute(_module_program(src, "main"), timeout_seconds=60)
    out = r.results.get("out")
    return {**_outcome(r), "shape": list(out.shape) if out is not None else None,
            "value": float(out) if out is not None else None}


def nested_ref_literal(c: Client) -> dict[str, Any]:
    @c.function(timeout=60)
    def echo(value):
        return value

    direct = _module_program(ECHO, "echo", args=[{"k": {"$ref": "nowhere"}}, [{"$ref": "upload_0"}]])
    r = c.execute(direct, timeout_seconds=60)
    return {**_outcome(r), "direct": r.results.get("out"), "function": echo.remote({"$ref": "module"})}


def gpu_count_option(c: Client) -> dict[str, Any]:
    r = c.execute(_module_program("def main():\n    return 1\n", "main"), gpu_count=1, timeout_seconds=60)
    return {**_outcome(r), "gpu_ids": list(r.gpu_ids)}


def program_exception_kind(c: Client) -> dict[str, Any]:
    return _outcome(c.execute(_module_program("def main():\n    raise ValueError('boom')\n", "main"),
                              timeout_seconds=60))


def module_error_kinds(c: Client) -> dict[str, Any]:
    syntax = c.execute(_module_program("def broken(:\n", "broken"), timeout_seconds=60)
    body = c.execute(_module_program("raise RuntimeError('at import')\n", "main"), timeout_seconds=60)
    missing = c.execute(_module_program("def main():\n    return 1\n", "absent"), timeout_seconds=60)
    return {"syntax": _outcome(syntax), "body": _outcome(body), "missing": _outcome(missing)}


def file_return_error_kind(c: Client) -> dict[str, Any]:
    p = Program()
    p.return_file(key="f", path="not/there.bin")
    return _outcome(c.execute(p, timeout_seconds=60))


def non_callable_get_function(c: Client) -> dict[str, Any]:
    p = Program()
    mod = p.upload(kind="module", source="LIMIT = 7\n")
    p.return_(key="out", value=p.get_function(module=mod, name="LIMIT"))
    r = c.execute(p, timeout_seconds=60)
    return {**_outcome(r), "out": r.results.get("out")}


def health_load(c: Client) -> dict[str, Any]:
    return {"health": c.health()}


def request_ids(c: Client, url: str) -> dict[str, Any]:
    mine = str(uuid.uuid4())
    with Client(url, headers={"X-Request-ID": mine}) as adopting:
        adopted = adopting.execute(_module_program("def main():\n    return 1\n", "main"), timeout_seconds=60)
    fresh = c.execute(_module_program("def main():\n    return 1\n", "main"), timeout_seconds=60)
    return {"sent": mine, "adopted": adopted.request_id, "fresh": fresh.request_id}


def stock_builtins(c: Client) -> dict[str, Any]:
    src = ("from kcoral.builtins import benchmark, compile_tirx\n"
           "def work(n):\n    return sum(range(n))\n"
           "def timed():\n    return benchmark(work, 1000, {'warmup_ms': 1, 'repeat_ms': 5})\n"
           "def tvm():\n    return compile_tirx(work)\n")
    timed = c.execute(_module_program(src, "timed"), timeout_seconds=60)
    tvm = c.execute(_module_program(src, "tvm"), timeout_seconds=60)
    return {"timed": {**_outcome(timed), "out": timed.results.get("out")}, "tvm": _outcome(tvm)}


# The programs of the TIRx harness's tool wrappers (`kcoral_python.py`, `kcoral_ncu.py` and
# the like, and `kcoral_remote.py --cmd`), the commands an agent of the seed drove: a tar of
# the local inputs as a named bytes upload, a runner module, one run whose arguments are the
# archive, the tool's argument list and an environment dict, the 16 MiB output limit and a
# long timeout; the runner unpacks the tar and runs a subprocess whose stdout and stderr are
# the request's own. Written here from the programs' shape, not copied.
HARNESS_RUNNER = """
import io, os, subprocess, sys, tarfile, tempfile

def _unpack(archive):
    work = tempfile.mkdtemp(prefix="tool_")
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        tar.extractall(work, filter="data")
    return work

def python(archive, arguments, environment):
    work = _unpack(archive)
    env = dict(os.environ, **environment, KCORAL_DIR=work)
    done = subprocess.run([sys.executable, *arguments], cwd=work, env=env)
    return {"returncode": done.returncode, "files": sorted(os.listdir(work))}

def bash(script, archive=None):
    work = _unpack(archive) if archive is not None else None
    env = dict(os.environ, **({"KCORAL_DIR": work} if work else {}))
    return {"returncode": subprocess.run(["bash", "-c", script], cwd=work, env=env).returncode}
"""
HARNESS_OUTPUT_LIMIT = 16 * 1024**2


def _tar(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def harness_tool(c: Client) -> dict[str, Any]:
    """`kcoral_python.py --send DIR -e MODE=test -- check.py`: exit status 3 comes back."""
    archive = _tar({"check.py": b"import os, sys\nprint('mode', os.environ['MODE'], os.path.basename(os.getcwd())[:5])\n"
                                b"print('to stderr', file=sys.stderr)\nsys.exit(3)\n",
                    "data/input.txt": b"x"})
    p = Program()
    mod = p.upload(id="tool_runner", kind="module", source=HARNESS_RUNNER)
    runner = p.get_function(id="runner", module=mod, name="python")
    inputs = p.upload(id="inputs", kind="bytes", value=archive)
    p.return_(key="outcome", value=p.run(id="run", fn=runner, args=[inputs, ["check.py"], {"MODE": "test"}]))
    r = c.execute(p, timeout_seconds=3600, output_limit_bytes=HARNESS_OUTPUT_LIMIT)
    return {**_outcome(r), "outcome": r.results.get("outcome"), "stdout": r.stdout, "stderr": r.stderr,
            "truncated": [r.stdout_truncated, r.stderr_truncated]}


def harness_cmd(c: Client) -> dict[str, Any]:
    """`kcoral_remote.py --cmd 'ls; cat notes.txt' --send DIR`."""
    p = Program()
    mod = p.upload(id="runner", kind="module", source=HARNESS_RUNNER)
    runner = p.get_function(id="main", module=mod, name="bash")
    sent = p.upload(id="send", kind="bytes", value=_tar({"notes.txt": b"sent along\n"}))
    p.return_(key="cmd", value=p.run(id="cmd", fn=runner,
                                     args=['ls "$KCORAL_DIR"; cat notes.txt; echo done >&2', sent]))
    r = c.execute(p, timeout_seconds=600, output_limit_bytes=HARNESS_OUTPUT_LIMIT)
    return {**_outcome(r), "cmd": r.results.get("cmd"), "stdout": r.stdout, "stderr": r.stderr}


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    f.__name__: f for f in (
        folder_upload, file_upload_ids, worker_death, cuda_error_kind, extra_dtype_return, zero_d_array,
        nested_ref_literal, gpu_count_option, program_exception_kind, module_error_kinds,
        file_return_error_kind, non_callable_get_function, health_load, request_ids, stock_builtins,
        harness_tool, harness_cmd,
    )
}


def main() -> None:
    expected_dir, url = Path(sys.argv[1]).resolve(), sys.argv[2]
    origin = Path(kcoral.__file__).resolve()
    if expected_dir not in origin.parents:
        raise SystemExit(f"imported kcoral from {origin}, not from {expected_dir}")
    report: dict[str, Any] = {"kcoral_file": str(origin)}
    with Client(url) as c:
        for name, scenario in SCENARIOS.items():
            try:
                report[name] = scenario(c, url) if name == "request_ids" else scenario(c)
            except Exception as exc:  # noqa: BLE001 - what the released client raised is the result
                report[name] = _raised(exc)
    print(json.dumps(report, default=repr))


if __name__ == "__main__":
    os.environ.pop("KCORAL_TOKEN", None)
    main()
