"""Speed of the remote tools' local parts (archives, IKET conversion and analysis, NCU CSV)
and, with --remote, the round trip of `run_python` on a server. With --gpu-app (a GPU
server), also the CLI tools end to end on the CuPy toy kernel of tests/kcoral/tools/gpu_app.
Prints a table.

    python benchmarks/tools_bench.py [--remote URL] [--repeat N] [--gpu-app tests/kcoral/tools/gpu_app]
"""
from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kcoral.archive import pack_directory, safe_unpack
from kcoral.iket import IketRecord, analyze_trace, pack_buffer, to_chrome_trace
from kcoral.ncu import parse_raw_csv
from kcoral.runners import bundle_source


def _timed(fn, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def _tree(root: Path, files: int, size: int) -> int:
    rng = random.Random(0)
    for i in range(files):
        p = root / f"d{i % 7}" / f"f{i}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        # Half random (incompressible), half text-like, as a candidate dir with inputs is.
        p.write_bytes(rng.randbytes(size // 2) + b"x = 1\n" * (size // 12))
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _iket(records: int) -> tuple[bytes, dict]:
    recs = []
    per_warp = records // (8 * 16)
    for cta in range(16):
        for warp in range(8):
            t = cta * 300
            for i in range(per_warp):
                recs.append(IketRecord(cta, warp, i % 4, i, t, t + 700 + (i % 5) * 10))
                t += 1000
    meta = {"kernel": "bench", "stages": {str(s): f"s{s}" for s in range(4)},
            "warp_roles": {str(w): "prep" for w in range(8)}, "chunk_stage": "s0"}
    return pack_buffer(recs), meta


def _csv(rows: int) -> str:
    head = '"ID","Kernel Name","gpu__time_duration.sum","memory_l2_theoretical_sectors_global"\n'
    units = '"","","ns","sector"\n'
    body = "".join(f'"{i}","k{i % 3}","{1000 + i:,}","{1837824 + i:,}"\n' for i in range(rows))
    return head + units + body


def _cli_rows(remote: str, app: str, repeat: int) -> list[tuple[str, str, str]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in (
            ("kcoral python -- toy_iket.py", ["python", "--", "toy_iket.py"]),
            ("kcoral iket -- python toy_iket.py",
             ["iket", "--output-dir", f"{tmp}/iket", "--", "python", "toy_iket.py"]),
            ("kcoral ncu -k toy_chunks -c 1",
             ["ncu", "-o", f"{tmp}/toy", "-k", "toy_chunks", "-c", "1", "--", "python",
              "toy_iket.py"]),
            ("kcoral ncu --set full -k toy_chunks -c 1",
             ["ncu", "-o", f"{tmp}/full", "--set", "full", "-k", "toy_chunks", "-c", "1", "--",
              "python", "toy_iket.py"]),
        ):
            runs = []
            for _ in range(repeat):
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "kcoral.cli", cmd[0], "--remote",
                                       remote, "--send", app] + cmd[1:],
                                      capture_output=True, text=True)
                runs.append(time.perf_counter() - t)
                if proc.returncode != 0:
                    raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr}")
            rows.append((name, f"{statistics.median(runs):.2f} s",
                         "runs " + ", ".join(f"{r:.2f}" for r in runs)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--remote", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gpu-app", default=None, help="directory of toy_iket.py (needs --remote)")
    args = ap.parse_args()
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for files, size in ((50, 100_000), (20, 5_000_000)):
            src = Path(tmp) / f"src{files}"
            total = _tree(src, files, size)
            data = pack_directory(src)
            t_pack = _timed(functools.partial(pack_directory, src), args.repeat)

            def unpack(data: bytes = data) -> None:
                dest = tempfile.mkdtemp(dir=tmp)
                safe_unpack(data, dest)

            t_unpack = _timed(unpack, args.repeat)
            mb = total / 1e6
            rows.append((f"pack {files} files, {mb:.0f} MB", f"{t_pack * 1e3:.1f} ms",
                         f"{mb / t_pack:.0f} MB/s, archive {len(data) / 1e6:.1f} MB"))
            rows.append((f"safe_unpack {files} files, {mb:.0f} MB", f"{t_unpack * 1e3:.1f} ms",
                         f"{mb / t_unpack:.0f} MB/s"))
    for n in (10_240, 204_800):
        buf, meta = _iket(n)
        t_conv = _timed(functools.partial(to_chrome_trace, buf, meta), args.repeat)
        trace = to_chrome_trace(buf, meta)
        t_an = _timed(functools.partial(analyze_trace, trace), args.repeat)
        rows.append((f"IKET to Chrome trace, {n} records", f"{t_conv * 1e3:.1f} ms",
                     f"{n / t_conv / 1e6:.2f} M records/s"))
        rows.append((f"IKET analyze, {n} records", f"{t_an * 1e3:.1f} ms",
                     f"{n / t_an / 1e6:.2f} M records/s"))
    text = _csv(10_000)
    t_csv = _timed(lambda: parse_raw_csv(text), args.repeat)
    rows.append(("NCU raw CSV, 10000 launches", f"{t_csv * 1e3:.1f} ms", ""))
    rows.append(("runner bundle source", f"{len(bundle_source()) / 1e3:.1f} kB", "sent per call"))
    if args.remote:
        from kcoral import Client
        from kcoral.remote import SendSpec, run_python

        with tempfile.TemporaryDirectory() as tmp, Client(args.remote) as client:
            (Path(tmp) / "t.py").write_text("print('ok')\n")
            send = [SendSpec(Path(tmp))]
            run_python(client, send, "t.py", timeout=60)  # warm the worker and blob cache
            lat = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                r = run_python(client, send, "t.py", timeout=60)
                lat.append(time.perf_counter() - t)
                assert r.exit_code == 0
            rows.append(("run_python round trip (trivial script)",
                         f"{statistics.median(lat) * 1e3:.0f} ms",
                         f"median of {args.repeat}; min {min(lat) * 1e3:.0f} ms"))
    if args.remote and args.gpu_app:
        rows += _cli_rows(args.remote, args.gpu_app, args.repeat)
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'median':>10}  rate / note")
    for what, t, note in rows:
        print(f"{what:<{width}}  {t:>10}  {note}")
    print(f"(cpus: {os.cpu_count()}, repeat {args.repeat})")


if __name__ == "__main__":
    main()
