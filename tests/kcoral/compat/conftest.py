"""Fixtures: the released clients and one virtual-GPU server they all talk to."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.kcoral.compat.upstream import Release, install, run_scenarios
from tests.serverproc import ServerProcess


@pytest.fixture(scope="session")
def compat_server() -> Iterator[ServerProcess]:
    # A virtual GPU so that gpu_count=1 is servable; programs run on NumPy workers.
    with ServerProcess(["--virtual-gpus", "1", "--workers-per-gpu", "2"]) as srv:
        yield srv


@pytest.fixture(scope="session")
def upstream_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    return Path(cache.mkdir("upstream-kcoral")) if cache is not None else tmp_path_factory.mktemp("upstream-kcoral")


@pytest.fixture(scope="session", params=list(Release), ids=lambda r: r.value)
def release(request: pytest.FixtureRequest) -> Release:
    return request.param


_results: dict[Release, dict[str, Any]] = {}


@pytest.fixture()
def seen(release: Release, upstream_cache: Path, compat_server: ServerProcess,
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the released client saw in each scenario (all run once per release)."""
    if release not in _results:
        target = install(release, upstream_cache)
        _results[release] = run_scenarios(target, compat_server.url, tmp_path_factory.mktemp("upstream-run"))
    return _results[release]
