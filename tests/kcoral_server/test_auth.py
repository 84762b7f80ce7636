"""Bearer-token authentication and what workers must never see."""
from __future__ import annotations

import argparse
import subprocess
import sys

import httpx
import pytest

from kcoral import Client, RemoteError
from kcoral_server.cli import build_parser, config_from_args
from tests.serverproc import REPO_ROOT, ServerProcess

from .helpers import function_program, post_program

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    token_file = d / "token"
    token_file.write_text(TOKEN + "\n")
    with ServerProcess(["--cpu-workers", "1", "--token-file", str(token_file)],
                       env={"KCORAL_TOKEN": TOKEN}, token=TOKEN) as srv:
        yield srv


def test_health_without_token_is_minimal(secured) -> None:
    body = httpx.get(f"{secured.url}/health").json()
    assert set(body) == {"status", "instance_id"}
    full = httpx.get(f"{secured.url}/health", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert "workers" in full and "queue_length" in full


@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x"])
def test_execute_without_the_right_token_is_401(secured, header) -> None:
    headers = {"Authorization": header} if header else {}
    r = post_program(secured.url, {"instructions": []}, headers=headers)
    assert r.status_code == 401 and r.json()["error"]["kind"] == "unauthorized"
    assert httpx.get(f"{secured.url}/other", headers=headers).status_code == 401


def test_client_with_token_runs_and_workers_do_not_see_it(secured) -> None:
    with Client(secured.url, token=TOKEN) as c:
        out = c.execute(function_program(
            "import os\ndef main():\n    return {k: v for k, v in os.environ.items() if 'TOKEN' in k or 's3cret' in v}\n"),
            timeout_seconds=30).raise_for_failure()
    assert out.results["out"] == {}
    with Client(secured.url, token="nope") as bad, pytest.raises(RemoteError) as info:
        bad.execute(function_program("def main():\n    return 1\n"), timeout_seconds=30)
    assert info.value.status_code == 401 and info.value.kind == "unauthorized"


def test_non_loopback_bind_without_token_is_refused() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    r = subprocess.run([sys.executable, "-m", "kcoral_server", "--host", "0.0.0.0", "--cpu-workers", "1"],
                       capture_output=True, text=True, timeout=60, env=env, cwd=REPO_ROOT)
    assert r.returncode != 0 and "without a token" in r.stderr


def test_token_from_environment(monkeypatch) -> None:
    monkeypatch.setenv("KCORAL_SERVER_TOKEN", "from-env-0123456789")
    cfg = config_from_args(build_parser().parse_args(["--host", "0.0.0.0"]))
    assert cfg.token is not None and cfg.token.get_secret_value() == "from-env-0123456789"
    assert "from-env" not in repr(cfg)
    monkeypatch.delenv("KCORAL_SERVER_TOKEN")
    with pytest.raises(SystemExit):
        config_from_args(build_parser().parse_args(["--host", "10.1.2.3"]))
    assert isinstance(build_parser().parse_args([]), argparse.Namespace)
