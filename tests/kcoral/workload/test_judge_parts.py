"""The judge's parts on their own: the channel and lent memory between two processes, the
clock rule, and the runner refusing a report the judge did not sign."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from judge import runner
from judge.__main__ import sign
from judge.backend import make_backend
from judge.calls import Batch
from judge.channel import Channel
from judge.memory import Arena
from judge.spec import Timing
from judge.timing import clock_figure, settle, summarise

from .conftest import KDA

CHILD = textwrap.dedent("""
    # A host's side of one buffer: made here, handed to the judge, read back after it wrote.
    import socket, sys
    sys.path.insert(0, sys.argv[2])
    from judge.backend import make_backend
    from judge.channel import Channel
    from judge.memory import export, place
    chan = Channel(socket.socket(fileno=int(sys.argv[1])))
    msg, _ = chan.recv()
    buf, info, fds = export(make_backend("cpu"), 1, msg["nbytes"])
    chan.send(info, fds)
    msg, _ = chan.recv()
    a = place(buf.base, msg["view"])
    total = float(a.sum())
    a[...] = 7.0
    chan.send({"sum": total})
    chan.recv()
""")


def test_a_hosts_own_memory_is_written_by_the_judge_and_read_back():
    arena = Arena(make_backend("cpu"))
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(theirs.fileno()), str(KDA)], pass_fds=(theirs.fileno(),))
    theirs.close()
    chan = Channel(ours)
    chan.send({"nbytes": 4096})
    info, fds = chan.recv(timeout=60)
    buf = arena.adopt(1, 4096, info, fds)
    arr, desc = buf.take((4, 8), np.float32)
    arr[...] = 1.0
    chan.send({"view": desc})
    reply, _ = chan.recv(timeout=60)
    assert reply == {"sum": 32.0}  # the host read what the judge wrote
    assert (arr == 7.0).all()       # and the judge sees what the host wrote
    chan.send({})
    assert proc.wait(timeout=60) == 0
    arena.free_all()


@pytest.mark.parametrize("how", ["unsealable", "too_small", "two_fds", "plain_file"])
def test_a_host_buffer_that_could_shrink_or_is_short_is_refused(tmp_path, how):
    # The judge writes into a host's memfd while the host lives: one the host could shrink
    # would kill the judge with SIGBUS mid-write, one shorter than asked would too.
    import os

    from judge.memory import HostMemoryError

    arena = Arena(make_backend("cpu"))
    if how == "plain_file":
        fds = [os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)]
        os.ftruncate(fds[0], 4096)
    else:
        flags = os.MFD_CLOEXEC | (0 if how == "unsealable" else os.MFD_ALLOW_SEALING)
        fds = [os.memfd_create("host", flags) for _ in range(2 if how == "two_fds" else 1)]
        for fd in fds:
            os.ftruncate(fd, 1024 if how == "too_small" else 4096)
    with pytest.raises(HostMemoryError):
        arena.adopt(1, 4096, {}, fds)
    assert not arena.live
    for fd in fds:  # the judge closed every descriptor it was handed
        with pytest.raises(OSError):
            os.fstat(fd)


def _batch(host_ms, wall_ms):
    return Batch(snapshots=[], host_ms=host_ms, wall_ms=wall_ms)


TIMING = Timing(trials=1, calls=4, warmup=1, flush_bytes=0, clock_slack_rel=0.05, clock_slack_ms=1.0)


def test_host_times_stand_when_the_judge_clock_agrees():
    null = _batch([0.0] * 5, wall_ms=5.0)
    f = clock_figure(_batch([10.0, 10.0, 11.0, 10.0, 12.0], wall_ms=5.0 + 53.5), null, TIMING)
    assert f.clock == "host" and f.ms == 10.5  # median of the 4 timed calls


def test_work_done_in_a_few_calls_counts_for_all_of_them():
    # Every input set of a batch is mapped in the host: a candidate can compute the whole
    # batch in its warm-up call and answer the timed calls from memory. The judge's clock
    # agrees with the host's total, but the median was of empty calls (0.1 ms, not 10).
    null = _batch([0.0] * 5, wall_ms=5.0)
    f = clock_figure(_batch([49.6, 0.1, 0.1, 0.1, 0.1], wall_ms=5.0 + 50.0), null, TIMING)
    assert f.clock == "host_mean" and f.ms == pytest.approx(10.0) and "uneven" in f.why


def test_judge_clock_wins_when_the_host_understates():
    null = _batch([0.0] * 5, wall_ms=5.0)
    f = clock_figure(_batch([0.1] * 5, wall_ms=5.0 + 50.0), null, TIMING)
    assert f.clock == "judge" and f.ms == pytest.approx(10.0)
    assert "the judge's figure 10.000000 ms/call used" in f.why


def test_a_refused_trial_is_replaced_only_by_a_remeasure_whose_host_times_pass():
    null = _batch([0.0] * 5, wall_ms=5.0)
    base = clock_figure(_batch([20.0] * 5, wall_ms=5.0 + 100.0), null, TIMING, trusted=True)
    refused = (base, clock_figure(_batch([0.1] * 5, wall_ms=5.0 + 50.0), null, TIMING))
    honest = (base, clock_figure(_batch([10.0] * 5, wall_ms=5.0 + 50.0), null, TIMING))
    liar = (base, clock_figure(_batch([0.1] * 5, wall_ms=5.0 + 40.0), null, TIMING))
    kept, note = settle(refused, honest, against=False)
    assert kept is honest and "re-measure's host times stand" in note
    # Refused again: the slower of the two measures stays, whichever came first (the judge's
    # clock is noisy: never the better of two draws for a host that understated).
    kept, note = settle(refused, liar, against=False)
    assert kept is refused and liar[1].ms < refused[1].ms and "slower measure (the first) kept" in note
    kept, note = settle(liar, refused, against=False)
    assert kept is refused and "slower measure (the re-measure) kept" in note
    # Against an incumbent both sides are untrusted: fewer refused sides wins, a tie keeps the first.
    both = (refused[1], refused[1])
    assert settle(both, (honest[1], refused[1]), against=True)[0][0] is honest[1]
    assert settle((honest[1], refused[1]), (refused[1], honest[1]), against=True)[0] == (honest[1], refused[1])
    # The measure not kept stays on record.
    out = summarise([honest, honest], {0: refused})
    assert out["trials"][0]["other_measure"]["kernel"]["clock"] == "judge"
    assert "why" in out["trials"][0]["other_measure"]["kernel"] and "other_measure" not in out["trials"][1]


def test_unusable_host_times_leave_the_judge_clock():
    null = _batch([0.0] * 5, wall_ms=5.0)
    f = clock_figure(_batch([float("nan")] * 5, wall_ms=25.0), null, TIMING)
    assert f.clock == "judge" and f.ms == pytest.approx(4.0)


def test_on_the_cpu_clock_the_judges_cpu_reading_weighs_the_host_and_wall_time_is_ignored():
    # A loaded machine: the batch took 500 ms of wall time for 50 ms of CPU; the host's CPU
    # times stand because the judge's CPU reading agrees with them.
    null = Batch([], [0.0] * 5, 5.0, cpu_clock=True, cpu_ms=4.0)
    f = clock_figure(Batch([], [10.0, 10.0, 11.0, 10.0, 12.0], 500.0, cpu_clock=True, cpu_ms=4.0 + 53.5),
                     null, TIMING)
    assert f.clock == "host" and f.ms == 10.5 and f.judge_clock == "cpu"
    # The host understates its CPU time: the judge's CPU figure stands.
    f = clock_figure(Batch([], [0.1] * 5, 500.0, cpu_clock=True, cpu_ms=4.0 + 50.0), null, TIMING)
    assert f.clock == "judge" and f.ms == pytest.approx(10.0)


def test_on_the_cpu_clock_a_batch_whose_reading_is_incomplete_gets_the_wall_figure():
    # Tasks came or went during the batch (a forked helper did the work and was reaped):
    # the host's CPU times cannot be weighed, so the judge's wall figure is used.
    null = Batch([], [0.0] * 5, 5.0, cpu_clock=True, cpu_ms=4.0)
    f = clock_figure(Batch([], [0.1] * 5, 5.0 + 50.0, cpu_clock=True, cpu_ms=None), null, TIMING)
    assert f.clock == "judge" and f.ms == pytest.approx(10.0) and "wall clock" in f.why


def test_the_cpu_reading_refuses_a_batch_in_which_a_task_was_created(monkeypatch):
    from judge import cpuclock

    monkeypatch.delenv("KCORAL_SANDBOX", raising=False)
    assert not cpuclock.available()  # outside the server's sandbox: the wall clock
    monkeypatch.setenv("KCORAL_SANDBOX", "none")
    assert not cpuclock.available()

    if not cpuclock.supported():
        pytest.skip("no per-process CPU clocks here (not Linux)")
    before = cpuclock.read()
    subprocess.run(["true"], check=True)  # a process that came and went
    assert cpuclock.between(before, cpuclock.read()) is None
    same = cpuclock.read()
    assert cpuclock.between(same, same) == 0.0


def test_runner_refuses_a_report_without_the_judges_signature():
    report = {"passed": True, "speedup": 100.0}
    good = json.dumps(sign(report, "k" * 64)).encode()
    assert runner._verified(good, "k" * 64) == (report, "")
    forged = json.dumps(sign(report, "guess")).encode()
    got, why = runner._verified(forged, "k" * 64)
    assert got is None and "forged" in why
    got, why = runner._verified(json.dumps(report).encode(), "k" * 64)  # the old, unsigned form
    assert got is None and "unreadable" in why


def test_judge_process_is_not_dumpable_and_reaps_orphans():
    code = textwrap.dedent("""
        import os, sys, time
        sys.path.insert(0, sys.argv[1])
        from judge.hostproc import protect_judge, sweep_orphans
        from judge.sandboxed import children_by_parent
        got = protect_judge()
        if os.fork() == 0:          # a double-forked daemon, as a host might leave
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        os.wait()
        time.sleep(0.2)
        before = len(children_by_parent().get(os.getpid(), []))
        sweep_orphans()
        after = len(children_by_parent().get(os.getpid(), []))
        print(got["non_dumpable"], got["subreaper"], before, after)
    """)
    out = subprocess.run([sys.executable, "-c", code, str(KDA)], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True", "1", "0"], out.stderr


def _raw_spec(**changes) -> dict:
    raw = json.loads((KDA / "forward_cpu_small" / "workload.json").read_text())
    raw.update(changes)
    return raw


def test_a_workload_names_its_baseline_and_gets_no_other():
    from judge.spec import SpecError, parse_spec

    assert parse_spec(_raw_spec()).baseline == "reference"
    unnamed = {k: v for k, v in _raw_spec(device="cuda").items() if k != "baseline"}
    assert parse_spec(unnamed).baseline == "fla"  # a CUDA workload's default
    gpu = json.loads((KDA / "forward_b1_t8192_h96" / "workload.json").read_text())
    assert parse_spec(gpu).baseline == "fla"
    for bad in ({"baseline": "fla"}, {"baseline": "torch"}):  # fla is a GPU baseline
        with pytest.raises(SpecError, match="baseline"):
            parse_spec(_raw_spec(**bad))


def test_a_missing_fla_stops_the_bench_instead_of_changing_the_baseline(monkeypatch):
    # Before: fla failing to load (an unnamed uid broke torch's cache lookup on the H200)
    # silently swapped in the fp32 reference, and the report said 7.9x instead of ~2.1x.
    from judge import baseline as bl
    from judge.harness import CandidateError
    from judge.spec import parse_spec

    gpu = parse_spec(json.loads((KDA / "forward_b1_t8192_h96" / "workload.json").read_text()))

    def broken(be, spec):
        raise KeyError("getpwuid(): uid not found: 2000000000")

    monkeypatch.setattr(bl, "FlaBaseline", broken)
    fake_gpu = make_backend("cpu")
    fake_gpu.device = "cuda"  # named as such: only the device label is faked, nothing runs on it
    with pytest.raises(CandidateError) as err:
        bl.make_baseline(fake_gpu, gpu)
    assert err.value.kind == "unavailable" and "getpwuid" in err.value.message


PROBE = textwrap.dedent("""
    # Tells through its output whether every array setup got lies in a memfd its own
    # process made (the host's), and none in memory the judge made.
    import numpy as np

    def _ranges(tag):
        out = []
        with open("/proc/self/maps") as f:
            for line in f:
                if tag in line:
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    out.append((lo, hi))
        return out

    def setup(data, B, T, H):
        own = _ranges("kda-host")
        arrays = [v for v in data.values() if isinstance(v, np.ndarray)]
        inside = all(any(lo <= a.__array_interface__["data"][0] < hi for lo, hi in own) for a in arrays)
        flag = 1.0 if inside and not _ranges("kda-judge") else 0.0
        out, state = data["output"], data["final_state"]

        def fn():
            out[...] = flag
            state[...] = flag
        return fn
""")


@contextlib.contextmanager
def _loaded_host(tmp_path, source: str):
    """A CPU candidate host of `source` (its solution.py), loaded, closed afterwards."""
    from judge.hostproc import HostProcess, Snapshot

    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "solution.py").write_text(source)
    be = make_backend("cpu")
    arena = Arena(be)
    host = HostProcess(arena, Snapshot(KDA / "judge"), "candidate", "cpu", tmp_path, "probe", candidate=Snapshot(probe))
    try:
        host.request({"op": "load", "dir": host.candidate_dir})
        yield be, arena, host
    finally:
        host.close()
        arena.free_all()


def test_the_candidate_works_on_memory_its_own_host_made(tmp_path):
    # On the H200 a kernel reading the judge's CUDA IPC buffers ran 18x slower than on the
    # same data in its own memory: the host makes the memory, the judge maps it and writes.
    from judge.calls import Session
    from judge.inputs import regime_inputs
    from judge.spec import load_spec

    spec = load_spec(KDA / "forward_cpu_small" / "workload.json")
    with _loaded_host(tmp_path, PROBE) as (be, arena, host):
        one = regime_inputs(be, spec, spec.T, 1)
        batch = Session(be, spec, arena, host, spec.T, one).batch([lambda: one] * 2)
    for snap in batch.snapshots:
        assert float(np.asarray(snap["final_state"]).min()) == 1.0, host.log_tail(2000)
    assert len(batch.snapshots) == 2



def test_closing_a_host_outside_the_judge_kills_none_of_its_drivers_children(tmp_path):
    # A process that drives hosts without being the judge (these tests, a script) is no
    # subreaper: closing a host once swept every other child of it too (the suite's
    # session server, its PostgreSQL), which only the judge's own process may do.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with _loaded_host(tmp_path, PROBE):
            pass
        assert bystander.poll() is None, "closing a host killed a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()

CPU_FOOTING = textwrap.dedent("""
    # Tells through its final state how many BLAS threads it was given and by how many KiB
    # its host's resident memory grew between the end of setup and its first call (the
    # judge flushes the cache in between, with memory of its own).
    import os

    def rss_kib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    def setup(data, B, T, H):
        out, state = data["output"], data["final_state"]
        threads = float(os.environ.get("OPENBLAS_NUM_THREADS", "0"))
        seen = []
        before = rss_kib()

        def fn():
            if not seen:
                seen.append(rss_kib() - before)
            out[...] = 0.0
            state[...] = threads
            state.reshape(-1)[0] = float(seen[0])
        return fn
""")


def test_cpu_hosts_run_one_blas_thread_and_grow_no_memory_in_a_call_window(tmp_path):
    # On a loaded 2-core machine the default BLAS pool (one thread per core) swung the
    # baseline between 6.5 and 9.9 ms from trial to trial, and a fresh host's first batch
    # paid the 8 MiB flush buffer's page faults inside the judge's clock (docs/benchmarks.md).
    from judge.calls import Session
    from judge.inputs import regime_inputs
    from judge.spec import load_spec

    spec = load_spec(KDA / "forward_cpu_small" / "workload.json")
    with _loaded_host(tmp_path, CPU_FOOTING) as (be, arena, host):
        one = regime_inputs(be, spec, spec.T, 1)
        batch = Session(be, spec, arena, host, spec.T, one).batch([lambda: one] * 2, spec.timing.flush_bytes)
    state = np.asarray(batch.snapshots[0]["final_state"]).reshape(-1)
    assert state[1] == 1.0, host.log_tail(2000)                     # OPENBLAS_NUM_THREADS=1
    flush_kib = spec.timing.flush_bytes // 1024
    assert state[0] < flush_kib / 4, (state[0], flush_kib)          # no flush buffer made in the window


# ---- GPU: per-call weighing by medians (each call's window less the no-op's) ----------
def _calls(host_ms, windows_ms):
    return Batch(snapshots=[], host_ms=host_ms, wall_ms=sum(windows_ms), windows_ms=windows_ms)


NULL_6MS = _calls([0.0] * 5, [6.0, 6.1, 5.9, 6.0, 6.05])  # the protocol's own cost, about 6 ms a call


def test_a_few_slow_windows_do_not_refuse_honest_host_times():
    # The warm-up call paid a fresh host's first-call costs (40 ms) and one timed call met a
    # 9 ms hiccup: 49 ms beyond the no-op batch against 4.4 ms of host time. A sum over the
    # batch refuses the host's times; the medians of the timed calls accept them.
    host = [1.1, 1.1, 1.12, 1.1, 1.11]
    windows = [6.0 + 1.1 + 40.0, 6.0 + 1.1 + 9.0, 6.05 + 1.12, 5.95 + 1.1, 6.0 + 1.11]
    f = clock_figure(_calls(host, windows), NULL_6MS, TIMING)
    assert f.clock == "host" and f.ms == pytest.approx(1.105)
    assert f.per_call["unexplained_ms"] <= f.per_call["allowed_ms"]


def test_a_host_that_understates_most_calls_gets_the_judges_median():
    # The calls took 1.1 ms of GPU time each; the host reports 0.05 ms for three of the four
    # timed ones (enough to move its median) and 1.1 for the other.
    host = [1.1, 0.05, 0.05, 1.1, 0.05]
    windows = [6.0 + 1.1, 6.0 + 1.1, 6.02 + 1.1, 5.98 + 1.1, 6.0 + 1.1]
    f = clock_figure(_calls(host, windows), NULL_6MS, TIMING)
    assert f.clock == "judge" and f.ms == pytest.approx(1.1, abs=0.05)
    assert "unexplained" in f.why and f.as_dict()["per_call"]["host_ms"] == [0.05, 0.05, 1.1, 0.05]


def test_understating_fewer_than_half_of_the_calls_does_not_move_the_figure():
    # The host's median is of honest calls; the understated one cannot lower it.
    host = [1.1, 1.1, 0.05, 1.1, 1.1]
    windows = [6.0 + 1.1] * 5
    f = clock_figure(_calls(host, windows), NULL_6MS, TIMING)
    assert f.clock == "host" and f.ms == pytest.approx(1.1)


def test_the_trusted_baselines_extra_per_call_calibrates_the_candidates_weighing():
    # On the H200 a call doing real GPU work cost the protocol 0.1-0.5 ms more than a no-op
    # call, for fla in the judge's own host as for an honest candidate. The trusted
    # baseline keeps its times and its extra widens the candidate's allowance by as much.
    base = clock_figure(_calls([2.63] * 5, [6.0 + 2.63 + 0.4] * 5), NULL_6MS, TIMING, trusted=True)
    assert base.clock == "host" and base.ms == pytest.approx(2.63)
    cal = base.per_call["unexplained_ms"]
    assert cal == pytest.approx(0.375, abs=0.01)
    honest = _calls([1.1] * 5, [6.0 + 1.1 + 0.42] * 5)
    assert clock_figure(honest, NULL_6MS, TIMING).clock == "judge"   # uncalibrated: refused
    f = clock_figure(honest, NULL_6MS, TIMING, calibration_ms=cal)
    assert f.clock == "host" and f.ms == pytest.approx(1.1)
    # The calibration does not cover a host that understates: 1.1 ms of work reported as 0.3.
    lying = _calls([0.3] * 5, [6.0 + 1.1 + 0.4] * 5)
    f = clock_figure(lying, NULL_6MS, TIMING, calibration_ms=cal)
    # The judge's figure keeps the protocol's extra: a refused host never comes out ahead of
    # its honest figure (1.1 ms here).
    assert f.clock == "judge" and f.ms == pytest.approx(1.5, abs=0.05)



# A judge without privileges (as inside a server's sandbox) starts the baseline's host, and
# a process of the same uid (a candidate's host where Landlock does not confine it) tries to
# open that host's memory for writing.
ATTACH = textwrap.dedent("""
    import json, subprocess, sys, tempfile
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from judge.backend import make_backend
    from judge.hostproc import HostProcess, Snapshot
    from judge.memory import Arena
    kda = Path(sys.argv[1])
    arena = Arena(make_backend("cpu"))
    host = HostProcess(arena, Snapshot(kda / "judge"), "trusted", "cpu", Path(tempfile.mkdtemp()), "trusted")
    try:
        host.request({"op": "load", "spec": json.loads((kda / "forward_cpu_small" / "workload.json").read_text())},
                     timeout=120)
        probe = "import sys\\ntry:\\n open(f'/proc/{sys.argv[1]}/mem', 'r+b').close(); print('opened')\\nexcept PermissionError:\\n print('refused')"
        print(subprocess.run([sys.executable, "-c", probe, str(host.proc.pid)], capture_output=True, text=True,
                             timeout=60).stdout.strip())
    finally:
        host.close()
        arena.free_all()
""")


def test_no_process_of_its_uid_may_write_the_baseline_hosts_memory():
    """The baseline's host lives beside every candidate's host of the timing trials; where
    Landlock does not confine a candidate (and Yama allows it), only the host's own
    non-dumpable flag keeps a process of the same uid from patching the baseline's memory
    through /proc (or ptrace), to slow every later baseline batch."""
    import shutil

    prefix: list[str] = []
    if os.geteuid() == 0:   # the same uid without any capability, as a sandboxed judge and its hosts run
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv to run the judge without privileges")
        prefix = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
    out = subprocess.run([*prefix, sys.executable, "-c", ATTACH, str(KDA)], capture_output=True, text=True,
                         timeout=180, cwd="/")
    assert out.stdout.strip().splitlines()[-1:] == ["refused"], (out.stdout, out.stderr[-2000:])
