"""How the server shares its CPUs among worker slots."""
from __future__ import annotations

import pytest

from kcoral_server.cpusets import partition


def test_slots_get_disjoint_contiguous_shares_covering_every_cpu() -> None:
    cpus = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]  # a cpuset with a gap
    for slots in range(1, len(cpus) + 1):
        shares = partition(cpus, slots)
        assert len(shares) == slots and all(shares)
        assert [c for share in shares for c in share] == cpus
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_more_slots_than_cpus_share_each_cpu_among_as_few_as_can_be() -> None:
    shares = partition([4, 5], 5)
    assert shares == [(4,), (5,), (4,), (5,), (4,)]
    assert partition([4, 5], 0) == []
    with pytest.raises(ValueError):
        partition([], 2)
