"""The install lock keeps a second installer out until the first is done (pytest-xdist's
workers meet an empty cache together on a fresh machine)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.kcoral.compat.cachelock import install_lock

REPO = Path(__file__).resolve().parents[3]

HOLDER = """
import sys, time
from pathlib import Path
from tests.kcoral.compat.cachelock import install_lock
target, log = Path(sys.argv[1]), Path(sys.argv[2])
with install_lock(target):
    with log.open("a") as f: f.write("first-start ")
    print("held", flush=True)
    time.sleep(1.0)
    with log.open("a") as f: f.write("first-end ")
"""


def test_a_second_installer_waits_for_the_first(tmp_path: Path) -> None:
    target, log = tmp_path / "cache" / "kcoral-0.1.1", tmp_path / "log"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(target), str(log)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with install_lock(target):   # must block until the holder has written its end
            with log.open("a") as f:
                f.write("second ")
    finally:
        holder.wait(timeout=30)
    assert log.read_text().split() == ["first-start", "first-end", "second"]


def test_a_dead_holder_does_not_keep_the_lock(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "kcoral-0.1.1"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.replace("time.sleep(1.0)", "import os; os._exit(9)"),
                               str(target), str(tmp_path / "log")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    holder.wait(timeout=30)
    with install_lock(target):   # returns: the kernel released the dead process's lock
        pass
