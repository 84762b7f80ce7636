"""Two candidates in one judge process (--against) each import their own helper modules."""
from __future__ import annotations

import sys

from judge.harness import ScopedCandidate

SOLUTION = '''
import helper

def setup(data, B, T, H):
    import lazy_helper  # imported at setup time, from this candidate's directory
    data["seen"].append(("setup", helper.VALUE, lazy_helper.VALUE))
    return lambda: data["seen"].append(("call", helper.VALUE, lazy_helper.VALUE))
'''


def make(tmp_path, name: str, value: str):
    d = tmp_path / name
    d.mkdir()
    (d / "solution.py").write_text(SOLUTION)
    (d / "helper.py").write_text(f"VALUE = {value!r}\n")
    (d / "lazy_helper.py").write_text(f"VALUE = {value + '-lazy'!r}\n")
    return d


def test_scoped_candidates_keep_their_own_helpers(tmp_path):
    a = ScopedCandidate(make(tmp_path, "a", "A"), "cand_a")
    b = ScopedCandidate(make(tmp_path, "b", "B"), "cand_b")
    seen: list = []
    fa = a.setup({"seen": seen}, 1, 1, 1)
    fb = b.setup({"seen": seen}, 1, 1, 1)
    for _ in range(2):
        fb()
        fa()
    assert seen == [("setup", "A", "A-lazy"), ("setup", "B", "B-lazy")] + [
        ("call", "B", "B-lazy"), ("call", "A", "A-lazy")] * 2
    # nothing of either candidate is left behind in the judge's import state
    assert "helper" not in sys.modules and "lazy_helper" not in sys.modules
    assert str(tmp_path / "a") not in sys.path and str(tmp_path / "b") not in sys.path
