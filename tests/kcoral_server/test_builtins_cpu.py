"""NumPy builtins on a CPU server, holdout seeds, and fd-level output capture."""
from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest

from kcoral import Client, Program
from tests.serverproc import ServerProcess

from .helpers import function_program


def run_builtin(client: Client, name: str, *args):
    p = Program()
    p.return_(key="out", value=p.run(fn=f"builtin.{name}", args=list(args)))
    return client.execute(p, timeout_seconds=60)


def test_allocation_builtins(client: Client) -> None:
    z = run_builtin(client, "zeros", {"shape": [2, 3], "dtype": "float16"}).raise_for_failure().results["out"]
    assert z.dtype == np.float16 and z.shape == (2, 3) and not z.any()
    e = run_builtin(client, "empty", [4], "int32").raise_for_failure().results["out"]
    assert e.dtype == np.int32 and e.shape == (4,)
    a = run_builtin(client, "randn", {"shape": [1000], "dtype": "float32", "seed": 7}).raise_for_failure().results["out"]
    b = run_builtin(client, "randn", {"shape": [1000], "dtype": "float32", "seed": 7}).raise_for_failure().results["out"]
    assert np.array_equal(a, b) and abs(float(a.mean())) < 0.2 and 0.8 < float(a.std()) < 1.2
    bad = run_builtin(client, "zeros", {"shape": [-1]})
    assert bad.status == "FAILED" and bad.error.kind == "engine"


def test_check_close_and_assert_close(client: Client) -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    b = a.copy()
    b[3] = 4.5
    rep = run_builtin(client, "check_close", a, b, {"rtol": 0, "atol": 0.1}).raise_for_failure().results["out"]
    assert rep["ok"] is False and rep["mismatch_fraction"] == 0.25
    assert rep["max_abs_err"] == pytest.approx(0.5) and rep["max_rel_err"] == pytest.approx(0.5 / 4.5)
    rep = run_builtin(client, "check_close", a, a, {}).raise_for_failure().results["out"]
    assert rep == {"ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "mismatch_fraction": 0.0}
    failed = run_builtin(client, "assert_close", a, b, {"atol": 0.1})
    assert failed.status == "FAILED" and failed.error.kind == "correctness" and "mismatch_fraction" in failed.error.message
    nan = np.array([np.nan], np.float32)
    rep = run_builtin(client, "check_close", nan, nan).raise_for_failure().results["out"]
    assert rep["ok"] is False and rep["max_abs_err"] is None


def test_benchmark_times_a_function(client: Client) -> None:
    p = Program()
    mod = p.upload(kind="module", source="import time\ndef work(n):\n    time.sleep(n)\n")
    fn = p.get_function(module=mod, name="work")
    stats = p.run(fn="builtin.benchmark", args=[fn, [0.002], {"warmup_ms": 5, "rep_ms": 40}])
    p.return_(key="stats", value=stats)
    s = client.execute(p, timeout_seconds=60).raise_for_failure().results["stats"]
    assert set(s) == {"latency_ms_median", "latency_ms_mean", "latency_ms_min", "latency_ms_max", "samples"}
    assert s["samples"] >= 5
    assert 1.9 <= s["latency_ms_min"] <= s["latency_ms_median"] <= s["latency_ms_max"]


def test_output_is_captured_at_the_fd_level(client: Client) -> None:
    src = (
        "import os, subprocess, sys\n"
        "def main():\n"
        "    print('from print')\n"
        "    os.write(1, b'from fd1\\n')\n"
        "    subprocess.run(['sh', '-c', 'echo from child; echo child err >&2'], check=True)\n"
        "    sys.stderr.write('from stderr\\n')\n"
    )
    out = client.execute(function_program(src), timeout_seconds=30).raise_for_failure()
    for text in ("from print", "from fd1", "from child"):
        assert text in out.stdout
    assert "child err" in out.stderr and "from stderr" in out.stderr
    assert not out.stdout_truncated


def test_output_limit_truncates_and_zero_disables(client: Client) -> None:
    src = "def main():\n    print('x' * 5000)\n"
    out = client.execute(function_program(src), timeout_seconds=30, output_limit_bytes=100).raise_for_failure()
    assert out.stdout == "x" * 100 and out.stdout_truncated
    out = client.execute(function_program(src), timeout_seconds=30, output_limit_bytes=0).raise_for_failure()
    assert out.stdout == "" and not out.stdout_truncated


def test_holdout_seeds_come_from_the_salt_which_workers_never_see(tmp_path) -> None:
    salt = b"holdout-salt-value-0123456789"
    salt_file = tmp_path / "salt.bin"
    salt_file.write_bytes(salt + b"\n")
    probe = (
        "import os\n"
        "def main(path, needle):\n"
        "    env = '\\n'.join(f'{k}={v}' for k, v in os.environ.items())\n"
        "    return {'path_in_env': path in env, 'salt_in_env': needle in env,\n"
        "            'proc_env': needle.encode() in open('/proc/self/environ', 'rb').read()}\n"
    )
    with ServerProcess(["--cpu-workers", "1", "--holdout-salt-file", str(salt_file)],
                       env={"KCORAL_HOLDOUT_SALT_FILE": str(salt_file), "MY_SALT_PATH": str(salt_file)}) as srv:
        with Client(srv.url) as c:
            seeds = run_builtin(c, "holdout_seeds", "kda/forward", 4).raise_for_failure().results["out"]
            again = run_builtin(c, "holdout_seeds", "kda/forward", 4).raise_for_failure().results["out"]
            leak = c.execute(function_program(probe, args=[str(salt_file), salt.decode()]), timeout_seconds=30)
            bad = run_builtin(c, "holdout_seeds", "", 2)
    # Each call draws a fresh nonce: no program can obtain the seeds a bench will use (the
    # same namespace once gave every program the workload's holdout), and one run's seeds
    # say nothing of another's.
    fixed = [int.from_bytes(hmac.new(salt, f"kda/forward:{i}".encode(), hashlib.sha256).digest()[:8], "big") for i in range(4)]
    assert len(seeds) == len(again) == 4 and len(set(seeds)) == 4
    assert seeds != again and not set(seeds) & set(again)
    assert not set(seeds) & set(fixed)
    assert leak.raise_for_failure().results["out"] == {"path_in_env": False, "salt_in_env": False, "proc_env": False}
    assert bad.status == "FAILED"
