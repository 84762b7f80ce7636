"""What a candidate can write, and what trusted code reads from disk after it ran.

A candidate's host runs under the judge's uid (in a server's sandbox the judge is not
root), so file permissions do not keep it from the judge's files. The judge holds by three
layers, each tested here: candidates' hosts confine their own writes where the kernel has
Landlock; every host gets the judge's package (and the candidate's and incumbent's
sources) from a snapshot the judge took before any candidate ran; the judge imports its
whole package before the first host starts. The trusted baseline host compiles into fresh
caches, seeded only from a server's read-only --trusted-cache."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from judge.backend import make_backend
from judge.confine import landlock_abi
from judge.hostproc import HostProcess, Snapshot
from judge.memory import Arena

from .conftest import CPU_WORKLOAD, KDA, REFERENCE

# Writes into every folder it is told of, and says where it got through (into its own
# working folder, which it may write).
WRITER = textwrap.dedent("""
    import json, os, signal
    TARGETS = {targets!r}
    got = {{}}
    for path in TARGETS:
        try:
            with open(path, "w") as f:
                f.write("planted by a candidate")
            got[path] = "written"
        except OSError as exc:
            got[path] = f"refused ({{exc.errno}})"
    try:
        os.kill({pid}, 0)
        got["signal"] = "delivered"
    except PermissionError:
        got["signal"] = "refused"
    with open(os.path.join(os.getcwd(), "result.json"), "w") as f:
        json.dump(got, f)

    def setup(data, B, T, H):
        return lambda: None
""")


def _host(tmp_path: Path, source: str, judge_files: Snapshot | None = None) -> tuple[HostProcess, Arena]:
    cand = tmp_path / "cand"
    cand.mkdir()
    (cand / "solution.py").write_text(source)
    arena = Arena(make_backend("cpu"))
    host = HostProcess(arena, judge_files or Snapshot(KDA / "judge"), "candidate", "cpu", tmp_path, "probe",
                       candidate=Snapshot(cand))
    host.request({"op": "load", "dir": host.candidate_dir})
    return host, arena


@pytest.mark.skipif(landlock_abi() == 0, reason="this kernel has no Landlock: candidates' writes cannot be confined")
def test_a_candidates_host_writes_only_its_own_folders(tmp_path):
    judges = tmp_path / "judges"
    judges.mkdir()
    targets = [str(judges / "planted.py"), str(tmp_path / "cache-of-another-host")]
    # the files behind CUDA's interprocess handles (the judge's pre-roll event among them)
    shm = Path("/dev/shm") / f"kda-probe-{tmp_path.name}"
    if shm.parent.is_dir():
        targets.append(str(shm))
    host, arena = _host(tmp_path, WRITER.format(targets=targets, pid=subprocess.os.getpid()))
    try:
        got = json.loads((host.workdir / "result.json").read_text())  # its own folder: written
    finally:
        host.close()
        arena.free_all()
    written = [t for t in targets if Path(t).exists()]
    for t in written:
        Path(t).unlink()
    assert all(got[t].startswith("refused") for t in targets), got
    assert not written
    if landlock_abi() >= 6:
        assert got["signal"] == "refused", got


def test_hosts_get_the_judges_files_as_they_were_before_any_candidate_ran(tmp_path, monkeypatch):
    """Without confinement (an older kernel) the candidate edits the judge's package on disk;
    a trusted host started afterwards still runs the files the judge started with."""
    import judge.hostproc as hostproc

    monkeypatch.setattr(hostproc, "confines_candidates", lambda: False)
    package = tmp_path / "judge-package"
    shutil.copytree(KDA / "judge", package, ignore=shutil.ignore_patterns("__pycache__"))
    files = Snapshot(package)
    host, arena = _host(tmp_path, WRITER.format(targets=[str(package / "baseline.py")], pid=subprocess.os.getpid()),
                        judge_files=files)
    host.close()
    arena.free_all()
    assert (package / "baseline.py").read_text() == "planted by a candidate"  # the edit got through
    later = tmp_path / "later"
    files.write(later)
    assert (later / "baseline.py").read_bytes() == (KDA / "judge" / "baseline.py").read_bytes()


def test_the_judge_imports_its_whole_package_before_any_candidate_runs(tmp_path):
    """A module imported after a candidate ran would come from files it could have edited,
    and the bench folder on sys.path would let it shadow the standard library."""
    shutil.copytree(KDA / "judge", tmp_path / "judge", ignore=shutil.ignore_patterns("__pycache__"))
    probe = textwrap.dedent("""
        import json, os, pkgutil, sys
        from pathlib import Path
        from judge.__main__ import NOT_THE_JUDGES, _import_whole_package
        import judge
        _import_whole_package(Path(os.getcwd()))
        names = [m.name for m in pkgutil.iter_modules(judge.__path__) if m.name not in NOT_THE_JUDGES]
        print(json.dumps({"missing": [n for n in names if f"judge.{n}" not in sys.modules],
                          "count": len(names),
                          "on_path": [p for p in sys.path if os.path.realpath(p or ".") == os.getcwd()]}))
    """)
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["missing"] == [] and got["count"] > 10, got
    assert got["on_path"] == [], got


@pytest.mark.slow
@pytest.mark.parametrize("name", ["edit_judge_files", "edit_incumbent_files"])
def test_without_confinement_the_snapshots_alone_defeat_the_file_attacks(tmp_path, salt_file, name):
    """The server's operator turned Landlock off (as a kernel without it would): the
    candidate's edits land on disk, and no host runs them."""
    from kcoral.bench import run_bench
    from kcoral.client import Client
    from tests.serverproc import ServerProcess

    from .test_attacks import INFLATED, stage, verdict

    against = REFERENCE if name == "edit_incumbent_files" else None
    with ServerProcess(["--cpu-workers", "1", "--holdout-salt-file", str(salt_file)],
                       env={"KCORAL_JUDGE_LANDLOCK": "0"}) as srv, Client(srv.url) as client:
        rep = run_bench(client, CPU_WORKLOAD, stage(name, tmp_path), timeout=180, against=against)
    assert "candidate writes not confined (turned off" in rep.isolation or landlock_abi() == 0, rep.isolation
    assert not rep.passed or rep.speedup < INFLATED, verdict(rep)


@pytest.mark.slow
def test_a_bench_seeds_the_baseline_host_from_the_servers_trusted_cache(tmp_path, salt_file):
    from kcoral.bench import run_bench
    from kcoral.client import Client
    from tests.serverproc import ServerProcess

    cache = tmp_path / "trusted"
    (cache / "triton" / "k").mkdir(parents=True)
    (cache / "triton" / "k" / "kernel.json").write_text("{}")
    with ServerProcess(["--cpu-workers", "1", "--holdout-salt-file", str(salt_file),
                        "--trusted-cache", str(cache)]) as srv, Client(srv.url) as client:
        rep = run_bench(client, CPU_WORKLOAD, REFERENCE, timeout=180)
    assert rep.passed, rep.message
    assert rep.trusted_cache == "the server's baseline compile cache"
    assert (cache / "triton" / "k" / "kernel.json").read_text() == "{}"


def test_the_trusted_cache_copy_takes_regular_files_only_and_is_bounded(tmp_path):
    from judge.judge import _copy_files

    src = tmp_path / "src"
    (src / "k").mkdir(parents=True)
    (src / "k" / "kernel.cubin").write_bytes(b"x" * 100)
    secret = tmp_path / "secret"
    secret.write_text("not a kernel")
    (src / "k" / "link.cubin").symlink_to(secret)
    (src / "dirlink").symlink_to(tmp_path)
    _copy_files(src, tmp_path / "dest", limit=1000)
    copied = sorted(p.relative_to(tmp_path / "dest").as_posix() for p in (tmp_path / "dest").rglob("*"))
    assert copied == ["k", "k/kernel.cubin"]
    with pytest.raises(OSError):
        _copy_files(src, tmp_path / "dest2", limit=99)
