"""Trust II: nothing evolve or kcoral hands a server for a candidate holds their secrets:
not the environment a tool sends, not the environment of the embedded server's workers.
Each test is an attack that got through before (real server processes on loopback)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evolve.embedded import EmbeddedServer
from kcoral import Client
from kcoral.errors import ToolInputError
from kcoral.remote import SendSpec, run_python
from tests.evolve.search.conftest import REPO
from tests.evolve.search.helpers import cli_env

EVOLVE_SECRET = "orchestrator-token-never-leaves-0123"


def test_secrets_are_refused_as_a_remote_environment(tmp_path, cpu_server, monkeypatch):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "env.py").write_text("import os\nprint(sorted(os.environ))\n")
    with Client(cpu_server.url, token=EVOLVE_SECRET) as c:
        for env in ({"KCORAL_TOKEN": "x"}, {"KCORAL_SERVER_TOKEN": "x"}, {"EVOLVE_DB": "sqlite:///e.db"},
                    {"HARMLESS": EVOLVE_SECRET}):
            with pytest.raises(ToolInputError):
                run_python(c, [SendSpec(tmp_path / "app")], "env.py", env=env, timeout=30)
    # the CLI's `-e NAME` takes the local value: refused before anything is sent
    base = {**cli_env(), "KCORAL_TOKEN": EVOLVE_SECRET, "EVOLVE_DB": "sqlite:///e.db"}
    for name in ("KCORAL_TOKEN", "EVOLVE_DB"):
        r = subprocess.run([sys.executable, "-m", "kcoral", "python", "--remote", cpu_server.url,
                            "--send", str(tmp_path / "app"), "-e", name, "--", "env.py"],
                           env=base, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert r.returncode == 2 and name in r.stderr, r.stdout + r.stderr


def test_the_embedded_server_gives_candidates_none_of_evolves_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KCORAL_TOKEN", EVOLVE_SECRET)
    monkeypatch.setenv("KCORAL_SERVER_TOKEN", EVOLVE_SECRET)
    monkeypatch.setenv("EVOLVE_DB", f"sqlite:///{tmp_path / 'evolve.db'}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "env.py").write_text(
        "import json, os\nprint(json.dumps({k: v for k, v in os.environ.items()"
        " if k.startswith(('EVOLVE', 'KCORAL_TOKEN', 'KCORAL_SERVER')) or 'orchestrator-token' in v}))\n")
    with EmbeddedServer(cpu_workers=1) as url, Client(url) as c:
        res = run_python(c, [SendSpec(tmp_path / "app")], "env.py", timeout=60)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == "{}", res.stdout


def test_a_server_started_beside_evolve_hands_workers_none_of_its_settings(tmp_path):
    # The README's quick tour starts kcoral-server from the shell that runs evolve.
    from tests.serverproc import ServerProcess

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "env.py").write_text(
        "import json, os\nprint(json.dumps(sorted(k for k in os.environ if k.startswith(('EVOLVE', 'KCORAL_TOKEN')))))\n")
    env = {"EVOLVE_DB": f"sqlite:///{tmp_path / 'evolve.db'}", "EVOLVE_ANYTHING": "x", "KCORAL_TOKEN": EVOLVE_SECRET}
    with ServerProcess(["--cpu-workers", "1"], env=env) as srv, Client(srv.url, token="") as c:
        res = run_python(c, [SendSpec(tmp_path / "app")], "env.py", timeout=60)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout
