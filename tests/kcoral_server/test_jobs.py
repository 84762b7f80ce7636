"""POST /jobs + GET /jobs/{id}: the polling alternative to one long /execute."""
from __future__ import annotations

import time

import httpx

from kcoral.protocol.multipart import encode_multipart
from kcoral.protocol.strict_json import dumps

from .helpers import function_program, sha


def _submit(url: str, program: dict, blobs: dict[str, bytes] | None = None) -> httpx.Response:
    parts = [("program", "application/json", dumps(program))]
    parts += [(f"blob:{d}", "application/octet-stream", b) for d, b in (blobs or {}).items()]
    ctype, chunks = encode_multipart(parts)
    return httpx.post(f"{url}/jobs", content=b"".join(bytes(c) for c in chunks), headers={"Content-Type": ctype})


def test_job_runs_in_background_and_is_polled(cpu_server) -> None:
    prog = function_program("import time\ndef main():\n    time.sleep(0.6)\n    return 'done'\n").to_dict()
    r = _submit(cpu_server.url, prog)
    assert r.status_code == 202
    job = r.json()["job_id"]
    assert r.headers["Location"] == f"/jobs/{job}"
    first = httpx.get(f"{cpu_server.url}/jobs/{job}")
    assert first.status_code == 202 and first.json()["status"] == "RUNNING"
    deadline = time.monotonic() + 30
    while (g := httpx.get(f"{cpu_server.url}/jobs/{job}")).status_code == 202 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert g.status_code == 200
    body = g.json()
    assert body["status"] == "COMPLETED" and body["results"]["out"] == {"type": "string", "value": "done"}
    assert httpx.get(f"{cpu_server.url}/jobs/{job}").json() == body  # stays readable


def test_job_cache_miss_is_answered_at_once_and_unknown_job_is_404(cpu_server) -> None:
    blob = b"job blob " * 100
    prog = {"instructions": [{"op": "upload", "kind": "bytes", "id": "b", "blob": sha(blob)}]}
    r = _submit(cpu_server.url, prog)
    assert r.status_code == 200 and r.json()["status"] == "CACHE_MISS"
    r = _submit(cpu_server.url, prog, {sha(blob): blob})
    assert r.status_code == 202
    missing = httpx.get(f"{cpu_server.url}/jobs/nope")
    assert missing.status_code == 404 and missing.json()["error"]["kind"] == "not_found"
    bad = httpx.post(f"{cpu_server.url}/jobs", content=b"{}", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["kind"] == "parse"
