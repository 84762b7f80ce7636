"""IKET's sharded device buffer, gathered on dump into the file the orchestrator reads: the
same layout as one shared counter's buffer, and every lost record counted as dropped. Runs
on the CPU (the gathering is host code); the GPU tests dump real traces through it."""
from __future__ import annotations

import importlib.util

import numpy as np

from kcoral.iket import parse_buffer

from .conftest import TEMPLATES

spec = importlib.util.spec_from_file_location("_iket_host_shares", TEMPLATES / "common" / "iket_host.py")
iket_host = importlib.util.module_from_spec(spec)
spec.loader.exec_module(iket_host)

SHARE = 4


def _device_buffer(filled: list[int], share: int = SHARE) -> bytes:
    """A device buffer whose share s holds filled[s] records (record i of share s: cta s,
    seq i), the header as the device leaves it."""
    recs = np.zeros(share * len(filled), dtype=[("cta", "<u4"), ("warp", "<u4"), ("stage", "<u4"), ("seq", "<u4"),
                                                ("start_ns", "<u8"), ("end_ns", "<u8")])
    for s, n in enumerate(filled):
        for i in range(min(n, share)):
            recs[s * share + i] = (s, 1, 2, i, 100 * s + i, 100 * s + i + 7)
    return np.array([share * len(filled), 0], dtype="<u8").tobytes() + recs.tobytes()


def test_no_loss_is_the_old_layout(tmp_path):
    counts = np.array([2, 0, 4, 1], dtype=np.uint64)
    data = iket_host.gather_shares(_device_buffer([2, 0, 4, 1]), counts, SHARE, capacity=10)
    assert len(data) == 16 + 32 * 10          # the whole buffer, as one counter wrote it
    buf = parse_buffer(data)
    assert (buf.capacity, buf.count, buf.dropped) == (10, 7, 0)
    assert [(r.cta, r.seq) for r in buf.records] == [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2), (2, 3), (3, 0)]
    assert all(r.end_ns - r.start_ns == 7 for r in buf.records)
    (tmp_path / "k.iket.bin").write_bytes(data)
    assert list(iket_host.read_records(tmp_path / "k.iket.bin")["seq"]) == [0, 1, 0, 1, 2, 3, 0]


def test_a_full_share_counts_its_lost_records_as_dropped():
    # share 1 was asked for 9 records and kept 4: 5 lost, though the file has room for them
    counts = np.array([1, 9, 0, 2], dtype=np.uint64)
    buf = parse_buffer(iket_host.gather_shares(_device_buffer([1, 9, 0, 2]), counts, SHARE, capacity=100))
    assert len(buf.records) == 7
    assert buf.dropped == 5
    assert buf.count == 12


def test_more_than_the_capacity_keeps_the_first_shares():
    counts = np.array([4, 4, 4, 4], dtype=np.uint64)
    buf = parse_buffer(iket_host.gather_shares(_device_buffer([4, 4, 4, 4]), counts, SHARE, capacity=10))
    assert (buf.capacity, buf.count, buf.dropped) == (10, 16, 6)
    assert [r.cta for r in buf.records] == [0] * 4 + [1] * 4 + [2] * 2
