"""The client's Program builder: ids, refs, blobs, and what it refuses before sending."""
from __future__ import annotations

import numpy as np
import pytest

from kcoral import Program
from kcoral.errors import WireError
from kcoral.protocol.program import parse_program


def test_program_builds_a_valid_wire_program() -> None:
    p = Program()
    mod = p.upload(kind="module", source="def main(*a):\n    return a\n")
    fn = p.get_function(module=mod, name="main", cpu_only=True)
    out = p.run(fn=fn, args=[b"raw", np.arange(3, dtype=np.int16), {"k": [1, 2.5, None, True]}])
    p.upload(kind="file", path="d/x.txt", value=b"x")
    p.return_(key="out", value=out)
    p.return_(key="folder", kind="folder", path=".")
    spec = parse_program(p.to_dict({"timeout_seconds": 10}))
    assert mod.id == "upload_0" and fn.id == "get_function_1"
    assert spec.options.timeout_seconds == 10
    run = p.instructions[4]
    assert run["args"][0] == {"$ref": "upload_2"} and run["args"][1] == {"$ref": "upload_3"}
    assert p.instructions[3]["shape"] == [3] and p.instructions[3]["dtype"] == "int16"
    assert len(p.blobs) == 3  # bytes, tensor, file (deduplicated by digest)


def test_program_refuses_what_the_server_would() -> None:
    p = Program()
    with pytest.raises(ValueError):
        p.run(fn="builtin.zeros", args=[float("nan")])
    with pytest.raises(TypeError):
        p.run(fn="builtin.zeros", args=[object()])
    with pytest.raises(ValueError):
        p.run(fn="builtin.zeros", args=[{"$ref": "x"}])
    with pytest.raises(WireError):
        p.upload(kind="file", path="../x", value=b"")
    with pytest.raises(TypeError):
        p.run(fn="os.system")
    p.return_(key="k", value=p.run(fn="builtin.zeros", args=[[1]]))
    with pytest.raises(ValueError):
        p.return_(key="k", value=p.run(fn="builtin.zeros", args=[[1]]))
