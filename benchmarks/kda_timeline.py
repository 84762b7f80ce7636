"""Where a fused_tiles call's time goes between its two kernels, from one IKET trace.

Reads the `kda_fused_kernel` and `kda_side_prep_kernel` dumps in a folder (what a traced call
of a fused_tiles candidate writes to $IKET_OUT, or kda_kernels.py's --iket) and prints, per
role: the spans, the fused prep's period and its waits for a slot, the walk's waits for its
tiles (prep chunks and side chunks apart), the side teams' period, and, for every side chunk,
how late its flag came against the moment the walk asked for it (once the chunk before it is
in its slot, where the walk issues its copy): the hand-over between the kernels in numbers.

    python3 benchmarks/kda_timeline.py IKET_DIR [--heads 96] [--json]

The traced build runs about a third slower than the untraced one, so read the shares, not
the absolute times. The side kernel's records name a chunk but not its head: a team's n-th
chunk in time order is item team + 3 (cta + n * ctas) of kernel kda_side_prep.cu's order
(every head's first side chunk, then every head's second), which gives the head.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evolve" / "templates" / "kda" / "common"))
import iket_host

# stage ids (kda_fused_tiles.cu's prep 0-4 and 10, walk 5-9; the side teams' 0-4)
LOAD_GATE, W_U, WAIT_EMPTY, WAIT_FULL, CHUNK = 0, 4, 10, 5, 9
TEAM_WARPS = 8   # a side team's warps (a CTA's teams: its warps / 8)
PREP_STAGES = {0: "load_gate", 1: "elementwise", 2: "blocks", 3: "inverse", 4: "w_u"}
WALK_STAGES = {6: "u_o", 8: "update", CHUNK: "chunk"}


def _stats(x: numpy.ndarray) -> dict:
    x = numpy.asarray(x, dtype=numpy.float64)
    if x.size == 0:
        return {"n": 0}
    return {"n": int(x.size), "mean_us": float(x.mean()) / 1e3, "median_us": float(numpy.median(x)) / 1e3,
            "p90_us": float(numpy.percentile(x, 90)) / 1e3, "max_us": float(x.max()) / 1e3}


def side_teams(side: numpy.ndarray) -> int:
    """A side CTA's teams (fused_tiles' side_teams), from its warps' records."""
    return int(side["warp"].max()) // TEAM_WARPS + 1


def side_flags(side: numpy.ndarray, heads: int) -> dict[tuple[int, int], int]:
    """(head, chunk) -> the time its team finished it (the last w_u record of the team's warps)."""
    ctas = int(side["cta"].max()) + 1
    teams = side_teams(side)
    done: dict[tuple[int, int], int] = {}
    for cta in range(ctas):
        for team in range(teams):
            sel = (side["cta"] == cta) & (side["warp"] // TEAM_WARPS == team)
            gates = side[sel & (side["stage"] == LOAD_GATE) & (side["warp"] % TEAM_WARPS == 0)]
            ends = side[sel & (side["stage"] == W_U)]
            for n, rec in enumerate(numpy.sort(gates, order="start_ns")):
                item = cta * teams + team + n * ctas * teams
                head, chunk = item % heads, int(rec["seq"])
                mine = ends[(ends["seq"] == chunk) & (ends["start_ns"] >= rec["start_ns"])]
                if len(mine):
                    done[(head, chunk)] = int(numpy.sort(mine["end_ns"])[:TEAM_WARPS].max())
    return done


def analyse(folder: Path, heads: int) -> dict:
    fused = iket_host.read_records(folder / "kda_fused_kernel.iket.bin")
    side_path = folder / "kda_side_prep_kernel.iket.bin"
    side = iket_host.read_records(side_path) if side_path.exists() else None
    t0 = int(fused["start_ns"].min()) if side is None else int(min(fused["start_ns"].min(), side["start_ns"].min()))
    out: dict = {"fused_span_us": float(fused["end_ns"].max() - fused["start_ns"].min()) / 1e3}
    side_chunks: set[int] = set()
    if side is not None:
        side_chunks = {int(s) for s in numpy.unique(side["seq"])}
        out["side_span_us"] = float(side["end_ns"].max() - side["start_ns"].min()) / 1e3
        out["side_end_after_fused_start_us"] = float(side["end_ns"].max() - fused["start_ns"].min()) / 1e3
        team_items = side[(side["stage"] == LOAD_GATE) & (side["warp"] % TEAM_WARPS == 0)]
        per_team = []
        for cta in numpy.unique(team_items["cta"]):
            for team in range(side_teams(side)):
                s = numpy.sort(team_items[(team_items["cta"] == cta) & (team_items["warp"] // TEAM_WARPS == team)]["start_ns"])
                per_team.append(numpy.diff(s.astype(numpy.int64)))
        out["side_team_period"] = _stats(numpy.concatenate(per_team) if per_team else numpy.array([]))
        lead = side[side["warp"] % TEAM_WARPS == 0]
        for stage, name in PREP_STAGES.items():
            sel = lead[lead["stage"] == stage]
            out[f"side_{name}"] = _stats((sel["end_ns"] - sel["start_ns"]).astype(numpy.int64))
    prep0 = fused[(fused["warp"] == 0)]
    gates = prep0[prep0["stage"] == LOAD_GATE]
    periods, spans, wait_empty = [], [], []
    for cta in numpy.unique(fused["cta"]):
        g = numpy.sort(gates[gates["cta"] == cta]["start_ns"]).astype(numpy.int64)
        periods.append(numpy.diff(g))
        mine = fused[fused["cta"] == cta]
        spans.append(int(mine["end_ns"].max()) - int(mine["start_ns"].min()))
        we = prep0[(prep0["cta"] == cta) & (prep0["stage"] == WAIT_EMPTY)]
        wait_empty.append(int((we["end_ns"] - we["start_ns"]).astype(numpy.int64).sum()))
    out["fused_cta_span"] = _stats(numpy.array(spans))
    out["prep_period"] = _stats(numpy.concatenate(periods))
    out["prep_wait_empty_per_cta"] = _stats(numpy.array(wait_empty))
    # each stage of the fused prep (warp 0) and of the walk (warp 8), per chunk
    for stage, name in PREP_STAGES.items():
        sel = prep0[prep0["stage"] == stage]
        out[f"prep_{name}"] = _stats((sel["end_ns"] - sel["start_ns"]).astype(numpy.int64))
    walk8 = fused[fused["warp"] == 8]
    for stage, name in WALK_STAGES.items():
        sel = walk8[walk8["stage"] == stage]
        out[f"walk_{name}"] = _stats((sel["end_ns"] - sel["start_ns"]).astype(numpy.int64))
    walk = fused[(fused["warp"] == 8) & (fused["stage"] == WAIT_FULL)]
    dur = (walk["end_ns"] - walk["start_ns"]).astype(numpy.int64)
    is_side = numpy.isin(walk["seq"], list(side_chunks))
    out["walk_wait_prep_chunks"] = _stats(dur[~is_side])
    out["walk_wait_side_chunks"] = _stats(dur[is_side])
    per_cta_wait = [int(dur[walk["cta"] == cta].sum()) for cta in numpy.unique(walk["cta"])]
    out["walk_wait_per_cta"] = _stats(numpy.array(per_cta_wait))
    if side is not None:
        done = side_flags(side, heads)
        # the walk asks for side chunk c once chunk c - 1's tiles are in its slot: the later of
        # its wait for them beginning and the prep's last w_u record of that chunk
        wu = fused[(fused["warp"] < 8) & (fused["stage"] == W_U)]
        filled: dict[tuple[int, int], int] = {}
        for r in wu:
            key = (int(r["cta"]), int(r["seq"]))
            filled[key] = max(filled.get(key, 0), int(r["end_ns"]))
        asked = {(int(r["cta"]), int(r["seq"]) + 1): max(int(r["start_ns"]), filled.get((int(r["cta"]), int(r["seq"])), 0))
                 for r in walk}
        late = numpy.array([done[k] - asked[k] for k in done if k in asked], dtype=numpy.int64)
        out["side_flag_minus_ask"] = _stats(late)
        out["side_chunks_late"] = {"late": int((late > 0).sum()), "of": int(late.size),
                                   "late_total_per_cta_us": float(late[late > 0].sum()) / 1e3 / max(1, heads)}
        first = sorted(done.items(), key=lambda kv: kv[1])[:1]
        if first:
            out["first_side_flag_us"] = float(first[0][1] - t0) / 1e3
    return out


def print_report(r: dict) -> None:
    print(f"fused kernel span {r['fused_span_us']:.1f} us" +
          (f"; side kernel span {r['side_span_us']:.1f} us, ends {r['side_end_after_fused_start_us']:.1f} us after the fused kernel starts"
           if "side_span_us" in r else ""))
    rows = [(k, v) for k, v in r.items() if isinstance(v, dict) and "n" in v]
    print(f"{'measure':<28} {'n':>7} {'mean us':>9} {'median':>9} {'p90':>9} {'max':>9}")
    for k, v in rows:
        if v["n"]:
            print(f"{k:<28} {v['n']:>7} {v['mean_us']:>9.2f} {v['median_us']:>9.2f} {v['p90_us']:>9.2f} {v['max_us']:>9.2f}")
    if "side_chunks_late" in r:
        s = r["side_chunks_late"]
        print(f"side chunks whose flag came after the walk asked: {s['late']} of {s['of']}, "
              f"{s['late_total_per_cta_us']:.1f} us late in all per head; first flag at {r.get('first_side_flag_us', 0):.1f} us")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--heads", type=int, default=96, help="B x H of the traced call")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = analyse(args.folder, args.heads)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print_report(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
