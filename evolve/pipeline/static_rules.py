"""Static rules for every file of a candidate: no process, network or FFI escapes.

The official benchmark must be the only thing a candidate can influence through its
kernel; spawning processes, opening sockets or calling native code behind the judge's
back is refused before any GPU time is spent. Every file is read, not only `solution.py`:
a helper module beside it runs just as well. The rules are a cheap early filter; the
trust boundary is that candidate code only ever runs on the server.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

FORBIDDEN_MODULES = {"subprocess", "socket", "ctypes", "pty", "multiprocessing", "asyncio.subprocess",
                     "http", "urllib", "requests", "httpx", "ftplib", "telnetlib", "smtplib"}
FORBIDDEN_OS = {"system", "popen", "fork", "forkpty", "kill", "killpg", "execv", "execve", "execl",
                "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp",
                "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp"}
FORBIDDEN_BUILTINS = {"eval", "exec", "__import__"}


def _root(module: str) -> str:
    return module.split(".")[0]


def violations(source: str, filename: str = "solution.py") -> list[str]:
    """Every forbidden construct in `source`, as 'file:line: reason'; a syntax error is one."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        return [f"{filename}:{exc.lineno}: syntax error: {exc.msg}"]
    found: list[str] = []

    def add(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {what}")

    os_aliases = {"os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in FORBIDDEN_MODULES or _root(alias.name) in FORBIDDEN_MODULES:
                    add(node, f"import of {alias.name} is not allowed")
                if alias.name == "os" and alias.asname:
                    os_aliases.add(alias.asname)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module in FORBIDDEN_MODULES or _root(module) in FORBIDDEN_MODULES:
                add(node, f"import from {module} is not allowed")
            if module == "os":
                for alias in node.names:
                    if alias.name in FORBIDDEN_OS:
                        add(node, f"os.{alias.name} is not allowed")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in os_aliases and node.attr in FORBIDDEN_OS:
            add(node, f"os.{node.attr} is not allowed")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_BUILTINS:
            add(node, f"{node.id} is not allowed")
    return sorted(set(found), key=lambda s: (int(s.split(":")[1]) if s.split(":")[1].isdigit() else 0, s))


# Loadable native code is an FFI escape the Python rules cannot read; sourceless bytecode
# is importable Python they cannot read either.
NATIVE_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
BYTECODE_SUFFIXES = (".pyc", ".pyo")
# Never sent to the server (as the bench stages a candidate), so never imported.
UNSENT_DIRS = {"__pycache__"}


def directory_violations(root: Path) -> list[str]:
    """The rules over every file of a candidate: each Python file's constructs, and no
    native code, bytecode, symbolic links or special files; paths are relative to `root`."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in sorted(dirnames):
            if (here / name).is_symlink():
                found.append(f"{(here / name).relative_to(root).as_posix()}: symbolic links are not allowed")
        dirnames[:] = sorted(d for d in dirnames if d not in UNSENT_DIRS and not (here / d).is_symlink())
        for name in sorted(filenames):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found.append(f"{rel}: symbolic links are not allowed")
            elif not path.is_file():
                found.append(f"{rel}: not a regular file")
            elif name.endswith(NATIVE_SUFFIXES) or ".so." in name:
                found.append(f"{rel}: compiled native code is not allowed")
            elif name.endswith(BYTECODE_SUFFIXES):
                found.append(f"{rel}: compiled Python bytecode is not allowed (send the source)")
            elif name.endswith(".py"):
                found.extend(violations(path.read_text(encoding="utf-8", errors="replace"), rel))
    return found
