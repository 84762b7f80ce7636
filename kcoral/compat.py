"""Fitting a program to the server that will run it (see `kcoral.capabilities`).

What can be rewritten is (a file upload's `id`; a CUDA-source upload compiled by
`builtin.compile_cuda` becomes a Python module that compiles it with the worker's own
compiler, `kcoral/runners/cuda_compile.py`); what a server lacks is refused here,
before anything is sent, with a message that says what to do instead: a stock server
answers such a program with a bare 400 `parse`.
"""
from __future__ import annotations

import copy
from typing import Any

from .capabilities import BUILTINS, CUDA_SOURCE, EXTRA_DTYPES, FOLDER_RETURN_DOT, ServerCapabilities
from .errors import UnsupportedByServer
from .protocol.dtypes import RELEASED_DTYPES


def adapt_program(program: dict[str, Any], caps: ServerCapabilities) -> dict[str, Any]:
    """A copy of `program` (its JSON form) that `caps`'s server accepts; raises
    UnsupportedByServer for what no rewrite can carry."""
    out = copy.deepcopy(program)
    who = caps.describe()
    if not (caps.has(CUDA_SOURCE) and caps.has(BUILTINS)):
        out["instructions"] = _compile_cuda_in_module(out["instructions"])
    for index, ins in enumerate(out["instructions"]):
        op, kind = ins.get("op"), ins.get("kind")
        if op == "upload" and kind == "file":
            if caps.file_upload_ids:
                ins.setdefault("id", f"file_{index}")
            else:
                ins.pop("id", None)
        elif op == "upload" and kind == "module" and ins.get("language", "python") != "python":
            if not caps.has(CUDA_SOURCE):
                raise UnsupportedByServer(
                    f"{who} takes no language={ins['language']!r} module uploads; compile the "
                    "source inside an uploaded Python module with the worker's own compiler "
                    "(e.g. torch.utils.cpp_extension.load_inline on a stock GPU worker)")
        elif op == "upload" and kind == "tensor" and ins.get("dtype") not in RELEASED_DTYPES:
            if not caps.has(EXTRA_DTYPES):
                raise UnsupportedByServer(f"{who} has no tensor dtype {ins.get('dtype')!r} "
                                          f"(it carries {', '.join(sorted(RELEASED_DTYPES))})")
        elif op == "run":
            _check_run(ins, caps, who)
        elif op == "return" and kind == "folder" and isinstance(ins.get("path"), str):
            if _is_root(ins["path"]) and not caps.has(FOLDER_RETURN_DOT):
                raise UnsupportedByServer(f"{who} cannot return the whole workspace ('.'); "
                                          "return a named folder")
    return out


def _compile_cuda_in_module(instructions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each CUDA upload that `builtin.compile_cuda` compiles becomes the compiling module;
    each such run calls that module's `compile_cuda(options)` instead (same ids, so later
    runs of the kernel are unchanged)."""
    cuda = {i["id"]: i for i in instructions
            if i.get("op") == "upload" and i.get("kind") == "module" and i.get("language") == "cuda"}
    taken = {i["id"] for i in instructions if "id" in i}
    out: list[dict[str, Any]] = []
    for ins in instructions:
        args = ins.get("args") or []
        target = args[0].get("$ref") if args and _is_ref(args[0]) else None
        if ins.get("op") != "run" or ins.get("fn") != "builtin.compile_cuda" or target not in cuda:
            out.append(ins)
            continue
        upload = cuda[target]
        if upload.get("language") == "cuda":
            upload.pop("language")
            upload["source"] = cuda_module_source(upload["source"])
        getter = _fresh_id(f"{target}_compile", taken)
        out.append({"op": "get_function", "id": getter, "module": {"$ref": target}, "name": "compile_cuda"})
        out.append({"op": "run", "id": ins["id"], "fn": {"$ref": getter}, "args": args[1:2]})
    return out


def cuda_module_source(cuda_source: str) -> str:
    from importlib import resources

    text = resources.files("kcoral.runners").joinpath("cuda_compile.py").read_text(encoding="utf-8")
    marker = 'CUDA_SOURCE = ""  # set by the client'
    if marker not in text:
        raise RuntimeError("kcoral/runners/cuda_compile.py lost its CUDA_SOURCE line")
    return text.replace(marker, f"CUDA_SOURCE = {cuda_source!r}", 1)


def _fresh_id(base: str, taken: set[str]) -> str:
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _check_run(ins: dict[str, Any], caps: ServerCapabilities, who: str) -> None:
    fn = ins.get("fn")
    if isinstance(fn, str) and not caps.has(BUILTINS):
        raise UnsupportedByServer(
            f"{who} has no {fn} (no builtin.* functions): call helpers from an uploaded "
            "module instead (a stock worker offers kcoral.builtins)")
    if not caps.ours:
        for arg in ins.get("args") or []:
            if not _is_ref(arg) and _holds_ref(arg):
                # A stock server resolves only top-level references; a nested one would
                # reach the function as a literal {"$ref": ...} dict.
                raise UnsupportedByServer(f"{who} resolves references only as whole arguments, "
                                          f"not inside lists or objects (run {ins.get('id')!r})")


def _is_root(path: str) -> bool:
    return path != "" and path.strip("/.") == ""


def _is_ref(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"$ref"}


def _holds_ref(value: Any) -> bool:
    if _is_ref(value):
        return True
    if isinstance(value, list):
        return any(_holds_ref(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_ref(v) for v in value.values())
    return False
