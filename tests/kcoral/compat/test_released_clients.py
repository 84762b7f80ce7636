"""The released KCoral clients (0.1.0, 0.1.1) against our server: one check per known
difference, each seen by the released client's own parser (see scenarios.py)."""
from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.kcoral.compat.upstream import Release


def _failed(result: dict[str, Any], kind: str) -> dict[str, Any]:
    assert "raised" not in result, result
    assert result["status"] == "FAILED", result
    assert result["error"]["kind"] == kind, result["error"]
    return result["error"]


def _completed(result: dict[str, Any]) -> dict[str, Any]:
    assert "raised" not in result, result
    assert result["status"] == "COMPLETED", result
    return result


def test_the_release_itself_was_imported(seen: dict[str, Any], release: Release) -> None:
    assert f"kcoral-{release.value}" in seen["kcoral_file"]


def test_1_folder_and_file_uploads(seen: dict[str, Any], release: Release) -> None:
    r = _completed(seen["folder_upload"])
    assert r["files"] == ["a.txt", "sub/b.txt"] and r["d"] == "delta"
    assert all(r["ids"]) if release is Release.V0_1_1 else not any(r["ids"])


def test_1_named_file_uploads(seen: dict[str, Any], release: Release) -> None:
    if release is Release.V0_1_0:
        pytest.skip("0.1.0 sends file uploads without an id (upload_file has no id parameter)")
    r = _completed(seen["file_upload_ids"])
    assert r["c"] == "gamma" and r["named"] == "gamma"  # the register holds the file's path


def test_2_a_dead_worker_has_a_string_traceback(seen: dict[str, Any]) -> None:
    error = _failed(seen["worker_death"], "runtime")
    assert isinstance(error["traceback"], str) and "exited with status 3" in error["message"]


def test_3_cuda_faults_are_runtime_not_gpu_access(seen: dict[str, Any]) -> None:
    error = _failed(seen["cuda_error_kind"], "runtime")
    assert "cudaErrorIllegalAddress" in error["message"]


def test_4_dtypes_the_release_lacks_fail_as_serialization(seen: dict[str, Any]) -> None:
    error = _failed(seen["extra_dtype_return"], "serialization")
    assert "uint16" in error["message"]


def test_5_zero_d_arrays_keep_their_shape(seen: dict[str, Any]) -> None:
    r = _completed(seen["zero_d_array"])
    assert r["shape"] == [] and r["value"] == 2.5


def test_6_nested_refs_stay_literal(seen: dict[str, Any]) -> None:
    r = _completed(seen["nested_ref_literal"])
    assert r["direct"] == [{"k": {"$ref": "nowhere"}}, [{"$ref": "upload_0"}]]
    assert r["function"] == {"$ref": "module"}


def test_7_gpu_count_option(seen: dict[str, Any], release: Release) -> None:
    if release is Release.V0_1_0:
        pytest.skip("0.1.0's Client.execute has no gpu_count option")
    r = _completed(seen["gpu_count_option"])
    assert r["gpu_ids"] == [0]


def test_8a_program_exceptions_are_engine(seen: dict[str, Any]) -> None:
    assert "boom" in _failed(seen["program_exception_kind"], "engine")["message"]


def test_8b_module_and_missing_name_errors_are_parse(seen: dict[str, Any]) -> None:
    kinds = seen["module_error_kinds"]
    assert "raised" not in kinds, kinds
    assert _failed(kinds["syntax"], "parse")["instruction_op"] == "upload"
    assert "at import" in _failed(kinds["body"], "parse")["message"]
    assert "absent" in _failed(kinds["missing"], "parse")["message"]


def test_8c_file_return_errors_are_serialization(seen: dict[str, Any]) -> None:
    assert _failed(seen["file_return_error_kind"], "serialization")["instruction_op"] == "return"


def test_8d_get_function_of_a_non_callable_succeeds(seen: dict[str, Any]) -> None:
    assert _completed(seen["non_callable_get_function"])["out"] == 7


def test_8e_health_has_load(seen: dict[str, Any]) -> None:
    health = seen["health_load"]
    assert "raised" not in health, health
    load = health["health"]["load"]
    assert load["request_capacity"] == 2 and load["requests_in_progress"] >= 0 and load["requests_waiting"] >= 0


def test_8f_request_ids_are_uuids_and_adopted(seen: dict[str, Any]) -> None:
    ids = seen["request_ids"]
    assert "raised" not in ids, ids
    assert ids["adopted"] == ids["sent"]
    assert str(uuid.UUID(ids["fresh"])) == ids["fresh"]


def test_9_programs_import_kcoral_builtins(seen: dict[str, Any]) -> None:
    helpers = seen["stock_builtins"]
    assert "raised" not in helpers, helpers
    stats = _completed(helpers["timed"])["out"]
    assert 0 < stats["latency_ms_min"] <= stats["latency_ms_median"] <= stats["latency_ms_max"]
    assert stats["repeat"] >= 1 and stats["flush_l2"] is True
    _failed(helpers["tvm"], "unavailable")


def test_13_the_harness_tool_wrappers_programs_run(seen: dict[str, Any]) -> None:
    # kcoral_python.py's program: a named tar upload, a list and a dict as literal arguments,
    # a subprocess whose output is the request's own, its exit status returned as data.
    r = _completed(seen["harness_tool"])
    assert r["outcome"] == {"returncode": 3, "files": ["check.py", "data"]}, r
    assert "mode test tool_" in r["stdout"] and "to stderr" in r["stderr"], r
    assert r["truncated"] == [False, False]


def test_13_the_harness_cmd_wrappers_program_runs(seen: dict[str, Any]) -> None:
    # kcoral_remote.py --cmd with --send: bash in the unpacked directory.
    r = _completed(seen["harness_cmd"])
    assert r["cmd"] == {"returncode": 0}, r
    assert r["stdout"].split() == ["notes.txt", "sent", "along"] and "done" in r["stderr"], r
