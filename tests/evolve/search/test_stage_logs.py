"""Issue 15, item 2: a crash is a `runtime` failure with its exception, and every stage's
full output is kept (bounded, compressed) and shown by `evolve show ID --logs`."""
from __future__ import annotations

from evolve.commands.register import register_candidate
from tests.evolve.search.helpers import WORKLOAD, population, run_cli

CRASH = "chunk size 48 does not divide T"


def test_a_crash_in_setup_is_a_runtime_failure_with_its_traceback(tmp_path, cpu_server):
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    pop = population(db_url)
    pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    d = tmp_path / "crash"
    d.mkdir()
    (d / "solution.py").write_text(
        "def _check(T):\n"
        f"    raise ValueError({CRASH!r})\n\n\n"
        "def setup(data, B, T, H):\n    _check(T)\n")
    cid, _ = register_candidate(pop, d, workload="forward_cpu_small")
    proc = run_cli("evaluate", str(cid), "--remote", cpu_server.url, "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 1
    [gputest] = pop.evaluations(cid, "gputest")
    assert gputest.failure_kind == "runtime"
    assert gputest.message.splitlines()[0].startswith(f"ValueError: {CRASH}")
    assert f"ValueError: {CRASH}" in proc.stdout           # the evaluate summary line
    shown = run_cli("show", str(cid), "--db", db_url, "--logs", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "Traceback (most recent call last)" in shown.stdout
    assert "in _check" in shown.stdout and "regime=scored" in shown.stdout   # stderr and stdout


def test_logs_are_bounded_and_compressed(tmp_path):
    from evolve.db.logs import MAX_STREAM_CHARS, pack, unpack

    text = "".join(f"line {i}\n" for i in range(400_000))      # ~4.6 MB
    blob = pack(text)
    assert len(blob) < MAX_STREAM_CHARS // 4
    back = unpack(blob)
    assert len(back) <= MAX_STREAM_CHARS + 200
    assert back.startswith("line 0\n") and back.endswith("line 399999\n")
    assert "characters left out" in back
    assert unpack(pack("short")) == "short" and unpack(None) == ""
