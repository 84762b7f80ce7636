"""The released KCoral clients, installed from PyPI into directories of their own.

Both the releases and our client distribution are import packages named `kcoral`, so a
release is never installed into the project's environment: `pip install --no-deps
--target DIR` puts it in DIR, and the scenarios run in a subprocess whose only path to
it is PYTHONPATH=DIR (its light dependencies, httpx/numpy/ml_dtypes, come from ours).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any

from tests.kcoral.compat.cachelock import install_lock

SCENARIOS = Path(__file__).with_name("scenarios.py")


class Release(str, Enum):
    V0_1_0 = "0.1.0"
    V0_1_1 = "0.1.1"


class UpstreamUnavailable(RuntimeError):
    """The release could not be installed (no network to PyPI?): a failure, never a skip."""


def install(release: Release, cache_root: Path) -> Path:
    """DIR holding kcoral==release, installed once and reused while its marker exists."""
    target = (cache_root / f"kcoral-{release.value}").resolve()
    marker = target / ".installed"
    if marker.exists():
        return target
    with install_lock(target):
        if marker.exists():   # another worker installed it while this one waited
            return target
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--upgrade", "--target", str(target), f"kcoral=={release.value}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not (target / "kcoral" / "__init__.py").exists():
            raise UpstreamUnavailable(f"could not install kcoral=={release.value} from the package index "
                                      f"(exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
        marker.write_text(release.value)
    return target


def run_scenarios(target: Path, url: str, workdir: Path) -> dict[str, Any]:
    """Every scenario's result as the released client in `target` saw it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KCORAL_TOKEN")}
    env["PYTHONPATH"] = str(target)
    # -P and a cwd outside the repository: our own `kcoral` can never shadow the release.
    proc = subprocess.run([sys.executable, "-P", str(SCENARIOS), str(target), url],
                          capture_output=True, text=True, cwd=workdir, env=env, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"scenarios failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
