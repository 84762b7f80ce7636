"""Our extensions stay behind the `KCoral-Extensions` opt-in that our client sends."""
from __future__ import annotations

import json

import numpy as np

from kcoral import Client, Program
from kcoral.extensions import HEADER, OptIn, header_value, parse_header
from tests.kcoral_server.helpers import function_program, post_program, sha
from tests.serverproc import ServerProcess

UINT16 = "import numpy as np\ndef main():\n    return np.arange(3, dtype=np.uint16)\n"
ECHO = "def main(x):\n    return x\n"


def test_header_names_known_opt_ins_only() -> None:
    assert parse_header(" extra_dtypes ,unknown, nested_refs") == {OptIn.EXTRA_DTYPES, OptIn.NESTED_REFS}
    assert parse_header(None) == frozenset()
    assert parse_header(header_value(set(OptIn))) == set(OptIn)


def test_our_client_opts_into_extra_dtypes(compat_server: ServerProcess) -> None:
    with Client(compat_server.url) as c:
        out = c.execute(function_program(UINT16), timeout_seconds=60).raise_for_failure()
    assert out.results["out"].dtype == np.uint16 and out.results["out"].tolist() == [0, 1, 2]


def _nested_program() -> dict:
    p = Program()
    blob = p.upload(kind="bytes", value=b"xyz")
    mod = p.upload(kind="module", source=ECHO)
    p.return_(key="out", value=p.run(fn=p.get_function(module=mod, name="main"), args=[{"k": blob}]))
    return p.to_dict({"timeout_seconds": 60})


def test_nested_refs_resolve_only_with_the_opt_in(compat_server: ServerProcess) -> None:
    program = _nested_program()
    blobs = {sha(b"xyz"): b"xyz"}
    literal = post_program(compat_server.url, program, blobs)
    assert literal.status_code == 200
    body = json.loads(literal.content) if literal.headers["content-type"].startswith("application/json") else None
    assert body is not None and body["status"] == "COMPLETED"
    assert body["results"]["out"]["value"]["k"] == {"type": "object", "value": {
        "$ref": {"type": "string", "value": "upload_0"}}}
    resolved = post_program(compat_server.url, program, blobs, headers={HEADER: OptIn.NESTED_REFS.value})
    assert resolved.status_code == 200 and resolved.headers["content-type"].startswith("multipart/form-data")


def test_gpu_count_beyond_one_gpu_per_program_is_refused(compat_server: ServerProcess, cpu_server: ServerProcess) -> None:
    program = function_program("def main():\n    return 1\n").to_dict({"gpu_count": 2})
    r = post_program(compat_server.url, program)
    assert r.status_code == 400 and r.json()["error"]["kind"] == "parse" and "gpu_count" in r.json()["error"]["message"]
    on_cpu = post_program(cpu_server.url, function_program("def main():\n    return 1\n").to_dict({"gpu_count": 1}))
    assert on_cpu.status_code == 400 and on_cpu.json()["error"]["kind"] == "parse"


def test_an_idempotency_key_is_bound_to_the_opt_ins(compat_server: ServerProcess) -> None:
    program = function_program("def main():\n    return 1\n").to_dict({"timeout_seconds": 60})
    first = post_program(compat_server.url, program, headers={"Idempotency-Key": "compat-opt-ins"})
    assert first.status_code == 200
    other = post_program(compat_server.url, program,
                         headers={"Idempotency-Key": "compat-opt-ins", HEADER: OptIn.EXTRA_DTYPES.value})
    assert other.status_code == 400 and other.json()["error"]["kind"] == "parse"


def test_health_announces_every_opt_in(compat_server: ServerProcess) -> None:
    assert {o.value for o in OptIn} <= set(compat_server.health()["extensions"])
