"""The embedded server's baseline compile cache: made once per machine for a GPU workload
timed against fla, and served read-only to every bench (evolve.embedded). CI has no GPU:
what runs here is the choice of when to make one, the failure path, and the server serving
a cache the embedded server was given."""
from __future__ import annotations

import httpx
import pytest

from evolve.embedded import EmbeddedServer, baseline_cache_dir, has_gpu, trusted_baseline_cache
from tests.evolve.search.conftest import REPO

KDA = REPO / "kcoral" / "workloads" / "kda"


def test_the_cache_lives_in_the_users_cache_folder(tmp_path):
    assert baseline_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "kcoral-evolve" / "baseline"


def test_a_cpu_workload_gets_no_cache_and_compiles_nothing(tmp_path, capsys):
    assert trusted_baseline_cache(KDA / "forward_cpu_small", tmp_path / "c") is None
    assert not (tmp_path / "c").exists()
    assert capsys.readouterr().err == ""


def test_a_failed_compile_is_said_and_the_run_goes_on_without_a_cache(tmp_path, capsys):
    if has_gpu():
        pytest.skip("on a GPU machine with fla the compile succeeds (measured on the H200: docs/benchmarks.md)")
    assert trusted_baseline_cache(KDA / "forward_b1_t8192_h96", tmp_path / "c") is None
    assert "each bench compiles fla itself" in capsys.readouterr().err


def test_the_embedded_server_serves_the_cache_it_is_given(tmp_path):
    (tmp_path / "triton").mkdir()
    with EmbeddedServer(cpu_workers=1, extra_args=["--trusted-cache", str(tmp_path)]) as url:
        health = httpx.get(f"{url}/health", timeout=10).json()
    assert health["sandbox"]["trusted_cache"] is True
