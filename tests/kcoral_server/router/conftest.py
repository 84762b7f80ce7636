"""Fixtures: the released router binary, extracted once per session (skips without it)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.kcoral.compat.upstream import UpstreamUnavailable
from tests.kcoral_server.router.routerproc import RELEASE, extract_router


@pytest.fixture(scope="session")
def router_binary(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
    except ImportError:
        pytest.skip("the router extra is not installed (pip install -e '.[router]'): no grpcio/protobuf")
    cache = getattr(request.config, "cache", None)
    root = Path(cache.mkdir("upstream-kcoral")) if cache is not None else tmp_path_factory.mktemp("upstream-kcoral")
    try:
        return extract_router(root, tmp_path_factory.mktemp("router-bin"))
    except UpstreamUnavailable as exc:
        pytest.skip(f"kcoral=={RELEASE.value} (the router binary) could not be downloaded: {str(exc)[:300]}")
