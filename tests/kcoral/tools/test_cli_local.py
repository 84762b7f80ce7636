"""CLI pieces that need no server: option parsing, sends, env, refusals before sending."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from kcoral import cli
from kcoral.commands.status import status_line
from kcoral.errors import ToolInputError
from kcoral.remote import SendSpec, inner_timeout, pack_sends, parse_env

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing answers there


def test_parse_env_values_local_values_and_refusals() -> None:
    local = {"HOME_VAL": "/h"}
    assert parse_env(["A=1", "B=", "C=x=y", "HOME_VAL"], local) == {
        "A": "1", "B": "", "C": "x=y", "HOME_VAL": "/h"}
    with pytest.raises(ToolInputError, match="not set in the local environment"):
        parse_env(["MISSING"], local)
    with pytest.raises(ToolInputError, match="valid environment variable name"):
        parse_env(["1BAD=x"], local)
    with pytest.raises(ToolInputError, match="CUDA_VISIBLE_DEVICES cannot be set"):
        parse_env(["CUDA_VISIBLE_DEVICES=0"], local)


def test_send_spec_parsing(tmp_path: Path) -> None:
    assert SendSpec.parse("cand") == SendSpec(Path("cand"), "")
    assert SendSpec.parse("cand:lib/x") == SendSpec(Path("cand"), "lib/x")
    odd = tmp_path / "with:colon"
    odd.mkdir()
    assert SendSpec.parse(str(odd)) == SendSpec(odd, "")
    with pytest.raises(ToolInputError, match="'..'"):
        SendSpec.parse("cand:../up")


def test_pack_sends_checks_directories(tmp_path: Path) -> None:
    with pytest.raises(ToolInputError, match="not a directory"):
        pack_sends([SendSpec(tmp_path / "nope")])
    assert pack_sends([]) == b""


def test_inner_timeout_leaves_a_margin() -> None:
    assert inner_timeout(600) == 570
    assert inner_timeout(10) == 8
    assert inner_timeout(1) == 1
    with pytest.raises(ToolInputError):
        inner_timeout(0)


def test_symlink_in_send_is_refused_before_contacting_the_server(tmp_path: Path, capsys) -> None:
    (tmp_path / "real.py").write_text("print(1)\n")
    (tmp_path / "link.py").symlink_to(tmp_path / "real.py")
    code = cli.main(["python", "--remote", UNREACHABLE, "--send", str(tmp_path), "--", "real.py"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE
    assert "symbolic link" in err and "link.py" in err


def test_colliding_sends_are_refused_before_sending(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "t.py").write_text("")
    (b / "t.py").write_text("")
    code = cli.main(["python", "--remote", UNREACHABLE, "--send", str(a), "--send", str(b),
                     "--", "t.py"])
    assert code == cli.EXIT_USAGE and "collide at 't.py'" in capsys.readouterr().err


def test_missing_remote_and_missing_script(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.delenv("KCORAL_REMOTE", raising=False)
    assert cli.main(["python", "--send", str(tmp_path), "--", "t.py"]) == cli.EXIT_USAGE
    assert "--remote URL or set KCORAL_REMOTE" in capsys.readouterr().err
    assert cli.main(["python", "--remote", UNREACHABLE, "--send", str(tmp_path)]) == cli.EXIT_USAGE
    assert "no script given" in capsys.readouterr().err


def test_remote_defaults_to_environment(monkeypatch) -> None:
    monkeypatch.setenv("KCORAL_REMOTE", "http://example.invalid:8901")
    args, _ = cli.build_parser().parse_known_args(["status"])
    assert args.remote == "http://example.invalid:8901"


def test_unreachable_server_is_a_tool_failure(monkeypatch, capsys) -> None:
    import kcoral.client

    class OneTry(kcoral.client.Client):  # the real client, without its retry back-off
        def __init__(self, url: str, token: str | None = None) -> None:
            super().__init__(url, token, retries=1)

    monkeypatch.setattr(kcoral.client, "Client", OneTry)
    code = cli.main(["status", "--remote", UNREACHABLE])
    assert code == cli.EXIT_TOOL_FAILURE
    assert "remote failure [transport]" in capsys.readouterr().err


def test_ncu_refuses_managed_options(tmp_path: Path, capsys) -> None:
    code = cli.main(["ncu", "--remote", UNREACHABLE, "--send", str(tmp_path), "-o", "r",
                     "--export", "x", "--", "app"])
    assert code == cli.EXIT_USAGE and "managed by the tool" in capsys.readouterr().err


def test_unknown_options_only_pass_for_ncu(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["python", "--remote", UNREACHABLE, "--set", "full", "--", "x.py"])
    assert "unrecognized arguments: --set full" in capsys.readouterr().err


def test_status_line() -> None:
    line = status_line({"active_requests": 3, "queue_length": 1, "instance_id": "abcdef123456",
                        "uptime_seconds": 12.4, "target": {"arch": "sm_90a"},
                        "gpus": [{"gpu_id": 0, "lease_depth": 2}, {"gpu_id": 1, "lease_depth": 0}],
                        "workers": [{"status": "busy"}, {"status": "idle"}]})
    assert line == ("load=3 queue=1 leases=0:2,1:0 workers=1/2 busy arch=sm_90a "
                    "instance=abcdef12 uptime=12s")


def test_parser_skips_a_missing_command_module(monkeypatch) -> None:
    monkeypatch.setitem(cli.COMMANDS, "ghost", "ghost_command_that_does_not_exist")
    names = cli.build_parser()._subparsers._group_actions[0].choices
    assert "python" in names and "ghost" not in names


def test_parser_does_not_hide_a_broken_command_module(monkeypatch) -> None:
    # A module that exists but imports something missing is a real error.
    broken = types.ModuleType("kcoral.commands.broken_probe")
    monkeypatch.setitem(cli.COMMANDS, "broken", "broken_probe")

    def fail_import(name, *a, **kw):
        if name == "kcoral.commands.broken_probe":
            raise ModuleNotFoundError("No module named 'not_installed'", name="not_installed")
        return real_import(name, *a, **kw)

    real_import = cli.importlib.import_module
    monkeypatch.setattr(cli.importlib, "import_module", fail_import)
    with pytest.raises(ModuleNotFoundError, match="not_installed"):
        cli.build_parser()
    assert broken.__name__ not in sys.modules
