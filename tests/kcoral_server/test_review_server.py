"""Review findings on the server: output capture files, holdout seeds, blob cache, worker kills."""
from __future__ import annotations

import os
import signal
import time

import httpx

from kcoral import Client, Program
from tests.serverproc import ServerProcess

from .helpers import assert_gone_then_kill, function_program, post_program, processes_with_argv, sha, unique_sleep


def test_captured_stdout_is_not_read_through_a_planted_symlink(client: Client, tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SERVER-SIDE-SECRET")
    # The capture files are outside the sandbox; the program tries anyway.
    src = ("import os\ndef main(target):\n    print('hello')\n"
           "    try:\n        os.unlink('../stdout')\n        os.symlink(target, '../stdout')\n"
           "    except OSError:\n        pass\n    return 1\n")
    res = client.execute(function_program(src, args=[str(secret)]), timeout_seconds=30)
    assert res.status == "COMPLETED", res.error
    assert "SERVER-SIDE-SECRET" not in res.stdout


def test_a_fifo_in_place_of_captured_stderr_does_not_hang_the_server() -> None:
    src = ("import os\ndef main():\n    for name in ('../stderr', '../stdout'):\n        try:\n"
           "            os.unlink(name)\n            os.mkfifo(name)\n        except OSError:\n            pass\n"
           "    return 7\n")
    body = function_program(src).to_dict({"timeout_seconds": 10})
    with ServerProcess(["--cpu-workers", "1"]) as srv:
        try:
            resp = _post(srv.url, body)
            assert resp.status_code == 200
            assert resp.json()["status"] == "COMPLETED"
            assert resp.json()["results"]["out"]["value"] == 7
            assert httpx.get(f"{srv.url}/health", timeout=5).status_code == 200
        finally:
            if srv.proc is not None and srv.proc.poll() is None:
                os.killpg(srv.proc.pid, signal.SIGKILL)  # a wedged server would not drain
                srv.proc.wait(10)


def _post(url: str, program: dict, timeout: float = 20) -> httpx.Response:
    import json

    from kcoral.protocol.multipart import encode_multipart

    ctype, chunks = encode_multipart([("program", "application/json", json.dumps(program).encode())])
    return httpx.post(f"{url}/execute", content=b"".join(bytes(c) for c in chunks),
                      headers={"Content-Type": ctype}, timeout=timeout)


def test_worker_cannot_ask_the_server_for_unbounded_holdout_seeds(client: Client) -> None:
    # Program code can reach the worker's control channel directly, skipping the
    # builtin's argument checks; the server must check what it computes itself.
    src = ("import gc\ndef main():\n"
           "    ex = next(o for o in gc.get_objects() if type(o).__name__ == 'Executor')\n"
           "    return len(ex.holdout_seeds('ns', 100001))\n")
    res = client.execute(function_program(src), timeout_seconds=30)
    assert res.status == "FAILED", res.results
    assert res.error.kind == "unavailable"
    # The builtin path still works.
    p = Program()
    out = p.run(fn="builtin.holdout_seeds", args=["ns", 3])
    p.return_(key="s", value=out)
    assert len(client.execute(p, timeout_seconds=30).raise_for_failure().results["s"]) == 3


def test_blob_cache_stays_bounded_when_requests_miss_blobs() -> None:
    cap = 1 << 20
    with ServerProcess(["--cpu-workers", "1", "--blob-cache-bytes", str(cap)]) as srv:
        for i in range(4):
            sent = bytes([i]) * (700 << 10)
            absent = sha(b"never sent %d" % i)
            program = {"instructions": [
                {"op": "upload", "kind": "bytes", "id": "a", "blob": sha(sent)},
                {"op": "upload", "kind": "bytes", "id": "b", "blob": absent},
            ]}
            r = post_program(srv.url, program, {sha(sent): sent})
            assert r.status_code == 200 and r.json()["status"] == "CACHE_MISS"
        cache = srv.health()["blob_cache"]
        assert cache["bytes"] <= cap, cache


def test_background_children_die_with_a_crashed_worker(client: Client) -> None:
    marker = unique_sleep()
    p = Program()
    mod = p.upload(kind="module", source=(
        "import os, subprocess\n"
        f"def spawn():\n    return subprocess.Popen(['sleep', '{marker}']).pid\n"
        "def die():\n    os._exit(3)\n"))
    pid = p.run(fn=p.get_function(module=mod, name="spawn"))
    p.return_(key="pid", value=pid)
    p.run(fn=p.get_function(module=mod, name="die"))
    res = client.execute(p, timeout_seconds=30)
    assert res.status == "FAILED" and "exited with status 3" in res.error.message
    assert_gone_then_kill(("sleep", marker), 10, "a process of the crashed program outlived its worker")


def test_declared_oversized_return_is_refused_before_it_is_read() -> None:
    # A frame announcing more than --max-response-bytes must be refused from its header,
    # not buffered in the server (or awaited until the program's timeout).
    src = ("import gc, json, struct, time\ndef main():\n"
           "    ex = next(o for o in gc.get_objects() if type(o).__name__ == 'Executor')\n"
           "    raw = json.dumps({'t': 'return', 'key': 'k', 'node': None, 'bin': [10 ** 10]}).encode()\n"
           "    ex.chan.sock.sendall(struct.pack('>I', len(raw)) + raw)\n"
           "    time.sleep(60)\n")
    body = function_program(src).to_dict({"timeout_seconds": 20})
    with ServerProcess(["--cpu-workers", "1", "--max-response-bytes", str(1 << 20)]) as srv:
        t0 = time.monotonic()
        resp = _post(srv.url, body, timeout=60)
        assert resp.status_code == 500, resp.text
        assert resp.json()["error"]["kind"] == "response_too_large"
        assert time.monotonic() - t0 < 15


def test_generated_salt_file_path_is_not_in_worker_environment(tmp_path) -> None:
    state = tmp_path / "state"
    salt_path = str(state / "holdout_salt")
    env = {"REVIEW_SALT_PATH": salt_path, "REVIEW_PLAIN": "kept"}
    src = "import os\ndef main():\n    return [os.environ.get('REVIEW_SALT_PATH'), os.environ.get('REVIEW_PLAIN')]\n"
    with ServerProcess(["--cpu-workers", "1", "--state-dir", str(state)], env=env) as srv:
        with Client(srv.url) as c:
            out = c.execute(function_program(src), timeout_seconds=30).raise_for_failure().results["out"]
    assert out == [None, "kept"]


def test_salt_file_named_through_a_symlink_is_not_in_worker_environment(tmp_path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "salt").write_text("s3cret\n")
    (tmp_path / "via").symlink_to(real)
    env = {"REVIEW_SALT_PATH": str(real / "salt")}
    src = "import os\ndef main():\n    return os.environ.get('REVIEW_SALT_PATH')\n"
    with ServerProcess(["--cpu-workers", "1", "--holdout-salt-file", str(tmp_path / "via" / "salt")], env=env) as srv:
        with Client(srv.url) as c:
            out = c.execute(function_program(src), timeout_seconds=30).raise_for_failure().results["out"]
    assert out is None


def test_captured_output_replaced_by_a_directory_is_ignored(client: Client) -> None:
    src = ("import os\ndef main():\n    print('x')\n    try:\n        os.unlink('../stdout')\n"
           "        os.mkdir('../stdout')\n    except OSError:\n        pass\n    return 5\n")
    res = client.execute(function_program(src), timeout_seconds=30)
    assert res.status == "COMPLETED" and res.results["out"] == 5


def test_processes_left_running_by_a_finished_program_are_killed(client: Client) -> None:
    # Stray processes would keep running (on the GPU, in later programs' timings) while
    # the worker serves the next program; even a double-forked, setsid'd daemon.
    marker = unique_sleep()
    src = ("import subprocess, sys\ndef main():\n"
           f"    a = subprocess.Popen(['sleep', '{marker}']).pid\n"
           "    code = ('import os, sys\\nif os.fork(): sys.exit(0)\\ntry:\\n    os.setsid()\\nexcept OSError:\\n    pass\\n'\n"
           "            'print(os.getpid(), flush=True)\\nsys.stdout.close()\\n'\n"
           f"            'os.execvp(\"sleep\", [\"sleep\", \"{marker}\"])\\n')\n"
           "    p = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE)\n"
           "    b = int(p.stdout.readline())\n"
           "    p.wait()\n"
           "    return [a, b]\n")
    res = client.execute(function_program(src), timeout_seconds=30)
    assert res.status == "COMPLETED", res.error
    try:
        deadline = time.monotonic() + 5
        while processes_with_argv("sleep", marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes_with_argv("sleep", marker), "a finished program's process is still running"
    finally:
        for pid in processes_with_argv("sleep", marker):
            os.kill(pid, signal.SIGKILL)
    # The worker still serves programs afterwards.
    again = client.execute(function_program("def main():\n    return 9\n"), timeout_seconds=30)
    assert again.raise_for_failure().results["out"] == 9


def test_worker_gpu_index_uses_pci_bus_order(tmp_path) -> None:
    # Server GPU ids come from nvidia-smi (PCI bus order): CUDA must count the same way.
    from kcoral_server.config import ServerConfig
    from kcoral_server.engine import Engine
    from kcoral_server.pool import WorkerSpec

    engine = Engine(ServerConfig(cpu_workers=1, work_dir=str(tmp_path), blob_dir=str(tmp_path)))
    try:
        env = engine._env_for(WorkerSpec("gpu1/w0", 1, "gpu"))
        assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    finally:
        engine.blobs.close()
        import shutil
        shutil.rmtree(engine.run_root, ignore_errors=True)


def test_deeply_nested_program_is_a_clear_400(client: Client, cpu_server) -> None:
    for depth in (100_000, 5_000):
        raw = ('{"instructions":[{"op":"run","id":"r","fn":"builtin.zeros","args":['
               + "[" * depth + "]" * depth + ']}]}').encode()
        r = post_program(cpu_server.url, raw)
        assert r.status_code == 400, (depth, r.status_code, r.text[:200])
        assert r.json()["error"]["kind"] == "parse" and "deep" in r.json()["error"]["message"]
