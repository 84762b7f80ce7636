"""What the sandbox's bwrap command line binds (no sandbox is started here)."""
from __future__ import annotations


import pytest

from kcoral_server import sandbox
from kcoral_server.sandbox import SandboxLimits, SandboxMode, SandboxPolicy


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_server_state_inside_a_bound_directory_is_hidden(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sandbox, "python_paths", lambda: [str(tmp_path)])
    state = tmp_path / "state"
    state.mkdir()
    salt = tmp_path / "salt.txt"
    salt.write_text("x")
    argv = SandboxPolicy(SandboxMode.BWRAP, SandboxLimits(), hidden=[str(state), str(salt)]).bwrap_argv(False)
    assert (str(tmp_path), str(tmp_path)) in _pairs(argv, "--ro-bind")
    i = argv.index(str(state))
    assert argv[i - 1] == "--tmpfs" and argv[i + 1:i + 3] == ["--remount-ro", str(state)]
    assert ("/dev/null", str(salt)) in _pairs(argv, "--ro-bind")
    # hidden after the directory that holds them is bound
    assert argv.index(str(state)) > argv.index(str(tmp_path))


def test_the_servers_working_directory_is_not_bound(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = SandboxPolicy(SandboxMode.BWRAP, SandboxLimits()).bwrap_argv(False)
    assert str(tmp_path) not in argv


def test_gpu_requests_get_every_nvidia_device(monkeypatch) -> None:
    fake = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    monkeypatch.setattr(sandbox.glob, "glob", lambda pattern: fake if pattern == "/dev/nvidia*" else [])
    policy = SandboxPolicy(SandboxMode.BWRAP, SandboxLimits())
    gpu = _pairs(policy.bwrap_argv(True), "--dev-bind")
    cpu = _pairs(policy.bwrap_argv(False), "--dev-bind")
    assert all((d, d) in gpu for d in fake)
    assert not any(d.startswith("/dev/nvidia") for d, _ in cpu)


def test_limits_and_layout() -> None:
    argv = SandboxPolicy(SandboxMode.BWRAP, SandboxLimits(workspace_bytes=123 << 20)).bwrap_argv(False)
    i = argv.index(sandbox.ROOT)
    assert argv[i - 1] == "--tmpfs" and argv[i - 3:i - 1] == ["--size", str(123 << 20)]
    assert ("/kcoral/shm", "/dev/shm") in _pairs(argv, "--symlink")
    # /tmp is a tmpfs of its own, as large as the workspace (an installation under /tmp is
    # bound into it)
    j = len(argv) - 1 - argv[::-1].index("/tmp")
    assert argv[j - 1] == "--tmpfs" and argv[j - 3:j - 1] == ["--size", str(123 << 20)]
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent"):
        assert flag in argv


@pytest.mark.parametrize("root", [True, False])
def test_identity(root: bool) -> None:
    policy = SandboxPolicy(SandboxMode.BWRAP, SandboxLimits(), uid_base=5000, privileged=root)
    assert policy.uid_for(3) == (5003 if root else None)
    assert ("--unshare-user" in policy.bwrap_argv(False)) is (not root)
    assert SandboxPolicy(SandboxMode.NONE, SandboxLimits(), privileged=root).uid_for(3) is None


def test_parents_of_an_installation_under_tmp_are_traversable(tmp_path, monkeypatch) -> None:
    # A wheel installed into a venv under /tmp binds the venv but not the clone holding it:
    # bwrap made /tmp/<clone> 0700 root inside the sandbox's /tmp, and programs running as
    # a slot's uid could not start Python ("Permission denied").
    venv = tmp_path / "clone" / ".venv"
    venv.mkdir(parents=True)
    monkeypatch.setattr(sandbox, "python_paths", lambda: [str(venv)])
    argv = SandboxPolicy(SandboxMode.BWRAP, SandboxLimits()).bwrap_argv(False)
    tmpfs = len(argv) - 1 - argv[::-1].index("/tmp")
    bind = next(i for i, a in enumerate(argv) if a == "--ro-bind" and argv[i + 1] == str(venv))
    for parent in (venv.parent, tmp_path):
        made = [i for i, a in enumerate(argv) if a == "--dir" and argv[i + 1] == str(parent)]
        assert any(tmpfs < i < bind and argv[i - 2:i] == ["--perms", "0755"] for i in made), (parent, argv)
