"""Trust II, auth details: short tokens on a public bind, the scheme's case, and the
`kcoral` token never on a command line. Each test is an attack the old code let through."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kcoral_server.cli import build_parser, config_from_args
from tests.serverproc import REPO_ROOT, ServerProcess

TOKEN = "case-and-length-token-0123"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("auth-details") / "token"
    token_file.write_text(TOKEN + "\n")
    with ServerProcess(["--cpu-workers", "1", "--token-file", str(token_file)], token=TOKEN) as srv:
        yield srv


def _server_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO_ROOT)}


def test_short_token_is_refused_for_a_non_loopback_bind(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("fifteen-chars15\n")  # 15 characters: guessable, refused off loopback
    try:
        r = subprocess.run([sys.executable, "-m", "kcoral_server", "--host", "0.0.0.0", "--port", "0",
                            "--cpu-workers", "1", "--token-file", str(short)],
                           capture_output=True, text=True, timeout=20, env=_server_env(), cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("the server started on 0.0.0.0 with a 15-character token")
    assert r.returncode != 0 and "at least 16 characters" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_token_length_rule_in_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCORAL_SERVER_TOKEN", "x" * 15)
    with pytest.raises(SystemExit, match="at least 16"):
        config_from_args(build_parser().parse_args(["--host", "10.1.2.3"]))
    # Loopback keeps working with any token, and 16 characters are enough anywhere.
    assert config_from_args(build_parser().parse_args(["--host", "127.0.0.1"])).token is not None
    monkeypatch.setenv("KCORAL_SERVER_TOKEN", "x" * 16)
    assert config_from_args(build_parser().parse_args(["--host", "10.1.2.3"])).token is not None


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
def test_bearer_scheme_is_case_insensitive(secured, scheme: str) -> None:
    r = httpx.get(f"{secured.url}/health", headers={"Authorization": f"{scheme} {TOKEN}"})
    assert r.status_code == 200 and "workers" in r.json()
    wrong = httpx.get(f"{secured.url}/other", headers={"Authorization": f"{scheme} {TOKEN}x"})
    assert wrong.status_code == 401


def _kcoral(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("KCORAL_TOKEN", "KCORAL_REMOTE")}
    base["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run([sys.executable, "-m", "kcoral", *args], capture_output=True, text=True,
                          timeout=60, env={**base, **(env or {})}, cwd=REPO_ROOT)


def test_kcoral_refuses_a_token_on_its_command_line(secured) -> None:
    # A token in argv is visible to every local user through ps and /proc/*/cmdline.
    for argv in (["--token", TOKEN], [f"--token={TOKEN}"]):
        r = _kcoral("status", "--remote", secured.url, *argv)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "KCORAL_TOKEN" in r.stderr and "--token-file" in r.stderr
        assert TOKEN not in r.stderr


def test_kcoral_takes_the_token_from_a_file_or_the_environment(secured, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    r = _kcoral("status", "--remote", secured.url, "--token-file", str(token_file))
    assert r.returncode == 0, r.stderr
    r = _kcoral("status", "--remote", secured.url, env={"KCORAL_TOKEN": TOKEN})
    assert r.returncode == 0, r.stderr
    r = _kcoral("status", "--remote", secured.url, "--token-file", str(tmp_path / "absent"))
    assert r.returncode == 2 and "absent" in r.stderr
