"""The bench judge's failure kinds are members of `kcoral`'s one `ErrorKind`.

The judge cannot import `kcoral`: it runs as `python -m judge` in a subprocess, from the
bench archive unpacked in the request's workspace, on a stock KCoral server too, where
only the standard library and NumPy are certain. So it writes its kinds as strings, and
this test reads them out of its source and keeps them inside the enum.
"""
from __future__ import annotations

import ast

from kcoral.protocol.error_kind import ErrorKind
from kcoral.workloads import BUILTIN

JUDGE = BUILTIN / "kda" / "judge"
KIND_RAISERS = {"Stop", "CandidateError"}   # judge.Stop(kind, ...), harness.CandidateError(kind, ...)


def _kind_strings(node: ast.AST) -> set[str]:
    """The string constants an expression can evaluate to (a literal, either arm of an
    `x if c else y`, an `a or b`, or the default of `d.get(key, default)`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _kind_strings(node.body) | _kind_strings(node.orelse)
    if isinstance(node, ast.BoolOp):
        return set().union(*(_kind_strings(v) for v in node.values))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and len(node.args) == 2):
        return _kind_strings(node.args[1])
    return set()


def _is_kind_lookup(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind")


def judge_kinds() -> dict[str, set[str]]:
    """Every failure kind the judge writes, by file."""
    found: dict[str, set[str]] = {}
    for path in sorted(JUDGE.glob("*.py")):
        kinds: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in KIND_RAISERS and node.args:
                kinds |= _kind_strings(node.args[0])
            elif isinstance(node, ast.Dict):       # a host's reply: {"ok": False, "kind": "...", ...}
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "kind" and value is not None:
                        kinds |= _kind_strings(value)
            elif isinstance(node, ast.Assign):     # report["failure_kind"] = "..."
                for target in node.targets:
                    if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                            and target.slice.value == "failure_kind"):
                        kinds |= _kind_strings(node.value)
            elif isinstance(node, ast.Compare) and _is_kind_lookup(node.left):  # reply.get("kind") in (...)
                for comparator in node.comparators:
                    if isinstance(comparator, (ast.Tuple, ast.Set, ast.List)):
                        for elt in comparator.elts:
                            kinds |= _kind_strings(elt)
        if kinds:
            found[path.name] = kinds
    return found


def test_every_kind_the_judge_writes_is_an_error_kind() -> None:
    found = judge_kinds()
    everything = set().union(*found.values())
    # The reader still sees the judge's kinds (a rewrite of the judge would empty this).
    assert {"check", "import", "runtime", "unavailable", "holdout", "flaky", "correctness"} <= everything, found
    strays = {name: sorted(k for k in kinds if k not in set(ErrorKind)) for name, kinds in found.items()}
    assert not any(strays.values()), f"judge kinds that ErrorKind does not name: {strays}"
