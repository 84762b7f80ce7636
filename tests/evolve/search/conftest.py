from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from evolve.db import Database, open_database
from evolve.population import Population

REPO = Path(__file__).resolve().parents[3]
NUMPY_FAMILY = REPO / "evolve" / "templates" / "kda" / "numpy_chunked"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_database(f"sqlite:///{tmp_path / 'evolve.db'}")
    yield database
    database.close()


@pytest.fixture
def pop(db: Database) -> Population:
    return Population(db)


@pytest.fixture
def toy_family(tmp_path: Path) -> Path:
    """A small family with derived values, constraints, a copied file and a CUDA source."""
    d = tmp_path / "families" / "toy"
    (d.parent / "common").mkdir(parents=True)
    (d.parent / "common" / "helper.cuh").write_text("#define HELPER 1\n")
    d.mkdir()
    (d / "family.toml").write_text(textwrap.dedent("""
        name = "toy"
        workloads = ["forward_cpu_small"]
        description = "test family"
        render = ["solution.py.j2", "kernel.cu.j2"]
        copy = ["../common/helper.cuh"]
        cuda_sources = ["kernel.cu"]
        kernels = ["toy_kernel"]

        [parameters]
        block = [32, 64, 128]
        tile = [1, 2, 4]
        mode = ["a", "b"]
        unused = [0, 1]

        [defaults]
        block = 64
        tile = 2
        mode = "a"
        unused = 0

        [derived]
        smem = "block * tile * 4"
        wide = "max(block, 64) if mode == 'a' else min(block, 64)"

        [[constraints]]
        expr = "smem <= 1024"
        message = "too much shared memory"

        [[constraints]]
        expr = "not (mode == 'b' and tile == 4)"
        message = "mode b cannot tile by 4"
    """))
    (d / "solution.py.j2").write_text(
        "BLOCK = {{ block }}\nTILE = {{ tile }}\nMODE = {{ mode | tojson }}\nSMEM = {{ smem }}\n"
        "def setup(data, B, T, H):\n    return lambda: None\n")
    (d / "kernel.cu.j2").write_text(
        '#include "helper.cuh"\nextern "C" __global__ void toy_kernel(float* x) {\n'
        "  __shared__ float s[{{ block }} * {{ tile }}];\n  s[threadIdx.x] = x[threadIdx.x];\n"
        "  __syncthreads();\n  x[threadIdx.x] = s[({{ block }} - 1) - threadIdx.x % {{ block }}] * HELPER;\n}\n")
    return d


@pytest.fixture
def copy_family(tmp_path: Path):
    """Copy a family folder into tmp so a test may break it."""
    def copy(src: Path, name: str = "fam") -> Path:
        dst = tmp_path / name
        shutil.copytree(src, dst)
        return dst
    return copy
