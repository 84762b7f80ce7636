"""Static rules for a candidate's `solution.py`: no process, network or FFI escapes.

The official benchmark must be the only thing a candidate can influence through its
kernel; spawning processes, opening sockets or calling native code behind the judge's
back is refused before any GPU time is spent.
"""
from __future__ import annotations

import ast

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
