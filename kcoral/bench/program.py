"""The KCoral program of one bench: upload the runner and the archive, draw the holdout
seeds on the server, run the judge (holding the GPU lease), return its result."""
from __future__ import annotations

from typing import Any

from kcoral.program import Program, Register


def bench_program(runner_source: str, archive: bytes, namespace: str, count: int,
                  options: dict[str, Any], client_seeds: list[int] | None = None
                  ) -> tuple[Program, Register | None]:
    """Returns the program and the register of the holdout-seeds step (None when the
    client supplies the seeds because the server lacks the builtin)."""
    p = Program()
    module = p.upload(kind="module", source=runner_source)
    assert module is not None  # only file uploads have no register
    fn = p.get_function(module=module, name="bench", cpu_only=False)
    blob = p.upload(kind="bytes", value=archive)
    seeds_reg: Register | None = None
    if client_seeds is None:
        # Seeds come out of the server's private salt and go straight into the runner:
        # the client never learns them.
        seeds_reg = p.run(fn="builtin.holdout_seeds", args=[namespace, count])
        seeds: Any = seeds_reg
    else:
        seeds = list(client_seeds)
    out = p.run(fn=fn, args=[blob, seeds, options])
    p.return_(key="bench", value=out)
    return p, seeds_reg
