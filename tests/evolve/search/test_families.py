from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import textwrap

import pytest

from evolve.expression import Expression, ExpressionError
from evolve.families import FamilyError, ParamsError, load_family
from tests.evolve.search.conftest import NUMPY_FAMILY, REPO


@pytest.mark.parametrize("source, env, expected", [
    ("1 + 2 * 3", {}, 7),
    ("a // 3 + a % 3", {"a": 10}, 4),
    ("2 ** 10", {}, 1024),
    ("min(a, 4, 9) + max(1, a)", {"a": 7}, 11),
    ("x if c else y", {"c": False, "x": 1, "y": 2}, 2),
    ("a < b <= 3 and not c", {"a": 1, "b": 3, "c": False}, True),
    ("m == 'fast' or n != 2", {"m": "slow", "n": 2}, False),
    ("-a + +a / 4", {"a": 8}, -6.0),
])
def test_expression_evaluates_allowed_operations(source, env, expected):
    assert Expression(source).evaluate(env) == expected


@pytest.mark.parametrize("source", [
    "__import__('os').system('true')", "open('x')", "a.b", "a[0]", "[1, 2]", "lambda: 1",
    "f(1)", "min(*a)", "max(a, key=b)", "a @ b", "a in b", "a is b", "a << 2", "(x := 1)", "min",
])
def test_expression_refuses_everything_else(source):
    with pytest.raises(ExpressionError):
        Expression(source)


def test_expression_guards_huge_powers_and_unknown_names():
    with pytest.raises(ExpressionError, match="too large"):
        Expression("10 ** 100000").evaluate({})
    with pytest.raises(ExpressionError, match="unknown name"):
        Expression("a + 1").evaluate({})
    with pytest.raises(ExpressionError, match="ZeroDivisionError"):
        Expression("1 / a").evaluate({"a": 0})


def test_toy_family_loads_with_derived_and_constraints(toy_family):
    fam = load_family(toy_family)
    assert fam.name == "toy"
    assert fam.output_names() == ["solution.py", "kernel.cu", "helper.cuh"]
    env = fam.environment(fam.defaults)
    assert env["smem"] == 64 * 2 * 4 and env["wide"] == 64
    points = list(fam.points())
    assert points[0] == fam.defaults
    # 36 combinations; smem > 1024 drops block=128,tile=4 (4 points), mode b with tile 4
    # drops 6, and 2 points are in both sets
    assert len(points) == 36 - 4 - 6 + 2
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)
    assert all(fam.admits(p) for p in points)


def test_parameters_behind_follow_derived_values(toy_family):
    fam = load_family(toy_family)
    assert fam.parameters_behind(["smem"]) == {"block", "tile"}
    assert fam.parameters_behind(["wide", "tile", "loop_var"]) == {"block", "mode", "tile"}
    assert fam.parameters_behind([]) == set()
    # two points agreeing on the parameters behind `smem` agree on `smem`
    for a in fam.points():
        for b in fam.points():
            if all(a[n] == b[n] for n in fam.parameters_behind(["smem"])):
                assert fam.environment(a)["smem"] == fam.environment(b)["smem"]


def _filtered_product(fam):
    """Every admitted point the slow way: each combination of the product, checked whole."""
    names = list(fam.parameters)
    points = [dict(zip(names, c)) for c in itertools.product(*fam.parameters.values())]
    admitted = [p for p in points if fam.admits(p)]
    return [fam.defaults] + [p for p in admitted if p != fam.defaults]


def test_points_pruned_depth_first_are_the_filtered_product_in_its_order(toy_family):
    # derived values that fail (a zero divisor) or read other derived values, a constraint on
    # the first parameter alone, one on the last, and one that reads no parameter at all
    (toy_family / "family.toml").write_text(textwrap.dedent("""\
        name = "toy"
        workloads = ["forward_cpu_small"]
        render = ["solution.py.j2", "kernel.cu.j2"]
        copy = ["../common/helper.cuh"]
        cuda_sources = ["kernel.cu"]
        kernels = ["toy_kernel"]

        [parameters]
        a = [0, 1, 2, 3]
        b = [1, 2, 3]
        c = ["x", "y"]
        d = [4, 8]

        [defaults]
        a = 1
        b = 1
        c = "x"
        d = 4

        [derived]
        q = "b // a"
        r = "q + b"

        [[constraints]]
        expr = "r < 5"
        message = "r"

        [[constraints]]
        expr = "c == 'x' or b != 2"
        message = "c"

        [[constraints]]
        expr = "a != 3"
        message = "a"

        [[constraints]]
        expr = "d == 4 or a == 1"
        message = "d"

        [[constraints]]
        expr = "2 > 1"
        message = "always"
    """))
    fam = load_family(toy_family)
    points = list(fam.points())
    assert points == _filtered_product(fam)
    assert not any(p["a"] in (0, 3) for p in points)   # the zero divisor, the first constraint
    assert len(points) == 11
    # the KDA families: numpy_chunked whole, two_pass narrowed to a product small enough
    # to filter point by point (it keeps every constraint and derived value)
    numpy = load_family(NUMPY_FAMILY)
    assert list(numpy.points()) == _filtered_product(numpy)
    two_pass = load_family(NUMPY_FAMILY.parent / "two_pass").restrict(
        fixed={"chunk": 64, "segments": 1, "prep_order": "by_head", "flush_denormals": 1, "diag_inverse": "in_blocks",
               "row_norms": "tensor_cores", "walk_loads": "cp_async", "w_gamma": "tile", "t_bf16": "converted"})
    assert two_pass.size_upper_bound() < 20000
    assert list(two_pass.points()) == _filtered_product(two_pass)


def test_the_space_walk_benchmark_prints_both_ways_and_they_agree():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "family_space.py"), "--json", "--filtered",
                          "--family", str(NUMPY_FAMILY)], capture_output=True, text=True, check=True).stdout
    (row,) = json.loads(out)["rows"]
    assert row["family"] == "numpy_chunked" and row["admitted"] == len(list(load_family(NUMPY_FAMILY).points()))
    assert row["walk_s"] >= 0 and row["filtered_s"] >= 0


def test_constraint_failure_names_the_constraint_and_values(toy_family):
    fam = load_family(toy_family)
    bad = dict(fam.defaults, block=128, tile=4)
    errors = fam.check(bad)
    assert len(errors) == 1
    assert "too much shared memory" in errors[0] and "smem=2048" in errors[0]
    with pytest.raises(ParamsError) as info:
        fam.validate(dict(fam.defaults, mode="b", tile=4))
    assert "mode b cannot tile by 4" in str(info.value)
    assert "mode='b'" in str(info.value) and "tile=4" in str(info.value)


def test_param_errors_list_every_problem(toy_family):
    fam = load_family(toy_family)
    errors = fam.check({"block": 48, "mode": "a", "unused": True, "extra": 1})
    text = "; ".join(errors)
    assert "block=48 is not one of [32, 64, 128]" in text
    assert "missing parameter 'tile'" in text
    assert "unknown parameter 'extra'" in text
    assert "unused=True" in text  # a bool is not the int 1


def test_sampling_is_seeded_and_admitted(toy_family):
    fam = load_family(toy_family)
    a = [fam.sample(random.Random(5)) for _ in range(3)]
    b = [fam.sample(random.Random(5)) for _ in range(3)]
    assert a == b
    rng = random.Random(0)
    assert all(fam.admits(fam.sample(rng)) for _ in range(200))


def test_sampling_a_space_that_rejects_every_draw_walks_it_once(toy_family, monkeypatch):
    fam = load_family(toy_family)
    walks = []
    points = fam.points
    monkeypatch.setattr(fam, "points", lambda: walks.append(1) or points())
    rng = random.Random(3)
    drawn = [fam.sample(rng, attempts=0) for _ in range(50)]   # no draw: every call falls back
    assert all(fam.admits(p) for p in drawn) and len({tuple(sorted(p.items())) for p in drawn}) > 5
    assert len(walks) == 1


def test_restrict_fixes_and_narrows(toy_family):
    fam = load_family(toy_family).restrict(fixed={"mode": "b"}, subspace={"block": [32, 64]})
    points = list(fam.points())
    assert {p["mode"] for p in points} == {"b"}
    assert {p["block"] for p in points} <= {32, 64}
    assert fam.admits(fam.defaults) and fam.defaults["mode"] == "b"
    with pytest.raises(FamilyError, match="not one of"):
        load_family(toy_family).restrict(fixed={"mode": "c"})
    with pytest.raises(FamilyError, match="unknown parameter"):
        load_family(toy_family).restrict(subspace={"nope": [1]})


def _rewrite(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("old, new, message", [
    ('block = 64\ntile = 2', 'block = 128\ntile = 4', "defaults are not admitted"),
    ('expr = "smem <= 1024"', 'expr = "smem <= nope"', "unknown names"),
    ('expr = "smem <= 1024"', 'expr = "__import__(1)"', "only min"),
    ('smem = "block * tile * 4"', 'smem = "block.x"', "Attribute is not allowed"),
    ('render = ["solution.py.j2", "kernel.cu.j2"]', 'render = ["solution.py.j2", "missing.cu.j2"]', "not found"),
    ('cuda_sources = ["kernel.cu"]', 'cuda_sources = ["other.cu"]', "neither rendered nor copied"),
    ('block = [32, 64, 128]', 'block = [32, 32, 128]', "lists a value twice"),
    ('description = "test family"', 'descripton = "typo"', "Extra inputs are not permitted"),
    ('workloads = ["forward_cpu_small"]', 'workloads = []', "workloads"),
    ('copy = ["../common/helper.cuh"]', 'copy = ["../common/helper.cuh"]\ninclude_dirs = ["../nowhere"]',
     "include folder '../nowhere' not found"),
])
def test_bad_family_files_are_refused_with_the_reason(toy_family, old, new, message):
    _rewrite(toy_family / "family.toml", old, new)
    with pytest.raises(FamilyError, match=message):
        load_family(toy_family)


def test_malformed_toml_and_missing_file(tmp_path):
    with pytest.raises(FamilyError, match="no family.toml"):
        load_family(tmp_path)
    (tmp_path / "family.toml").write_text("name = \n")
    with pytest.raises(FamilyError, match="family.toml"):
        load_family(tmp_path)


def test_numpy_family_space():
    fam = load_family(NUMPY_FAMILY)
    points = list(fam.points())
    assert fam.defaults == points[0]
    # factored decay in float32 only up to chunk 16 (exp(80) fits, exp(160) does not)
    assert not fam.admits(dict(fam.defaults, decay_form="factored", dtype="float32", chunk=32))
    assert fam.admits(dict(fam.defaults, decay_form="factored", dtype="float32", chunk=16))
    assert fam.admits(dict(fam.defaults, decay_form="factored", dtype="float64", chunk=128))
    assert len(points) > 100


def test_a_template_includes_from_the_family_first_then_its_include_dirs(toy_family):
    """`include_dirs` (a family built from another's templates): `{% include %}` looks in the
    family's own folder, then in each named folder, in order."""
    from evolve.render import render_sources

    shared = toy_family.parent / "shared"
    shared.mkdir()
    (shared / "part.inc.j2").write_text("// shared part, block {{ block }}\n")
    (shared / "both.inc.j2").write_text("// the shared copy\n")
    (toy_family / "both.inc.j2").write_text("// the family's own copy\n")
    _rewrite(toy_family / "family.toml", 'copy = ["../common/helper.cuh"]',
             'copy = ["../common/helper.cuh"]\ninclude_dirs = ["../shared"]')
    kernel = toy_family / "kernel.cu.j2"
    kernel.write_text(kernel.read_text() + '{% include "part.inc.j2" %}{% include "both.inc.j2" %}')
    cu = render_sources(load_family(toy_family), {"block": 32, "tile": 1, "mode": "a", "unused": 0})["kernel.cu"]
    assert b"// shared part, block 32\n" in cu and b"// the family's own copy\n" in cu and b"shared copy" not in cu
