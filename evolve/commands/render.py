"""`evolve render FAMILY [NAME=VALUE ...]`: one point of a family (its defaults, with the
values given) rendered into a folder named by its digest, the candidate a search would make
of it: to read the sources a point compiles, or to bench it by hand
(`kcoral bench WORKLOAD FOLDER`). Nothing is added to a database."""
from __future__ import annotations

import argparse
import sys
from collections import Counter

from evolve import builtin
from evolve.commands.jsonout import add_json_flag, emit
from evolve.families import Family, FamilyError, Value, load_family
from evolve.render import RenderError, render_candidate


class _Refused(ValueError):
    pass


def _family(name_or_path: str) -> Family:
    directory = builtin.family_path(name_or_path)
    if directory is None:
        raise _Refused(f"no family {name_or_path!r}: neither a folder with a family.toml nor a built-in "
                       f"family ({', '.join(builtin.families())})")
    return load_family(directory)


def _value(family: Family, item: str) -> tuple[str, Value]:
    """NAME=VALUE as the family's own value: the listed value whose text it is (so 2 is the
    number where the family lists numbers, bulk the word where it lists words)."""
    name, sep, text = item.partition("=")
    if not sep or not name:
        raise _Refused(f"{item!r}: give parameters as NAME=VALUE")
    allowed = family.parameters.get(name)
    if allowed is None:
        raise _Refused(f"family {family.name!r} has no parameter {name!r} (it has {', '.join(family.parameters)})")
    for value in allowed:
        if str(value) == text:
            return name, value
    raise _Refused(f"{name}={text} is not one of {', '.join(map(str, allowed))}")


def _run(args: argparse.Namespace) -> int:
    try:
        family = _family(args.family)
        pairs = [_value(family, item) for item in args.values]
        twice = sorted(n for n, count in Counter(n for n, _ in pairs).items() if count > 1)
        if twice:
            raise _Refused(f"{', '.join(twice)} given more than once: give each parameter one value")
        given = dict(pairs)
        params = {**family.defaults, **given}
        problems = family.check(params)
        if problems:
            raise _Refused(f"family {family.name!r} does not admit this point:\n  " + "\n  ".join(problems))
        folder = render_candidate(family, params, args.out)
    except (_Refused, FamilyError, RenderError) as exc:
        print(f"evolve render: {exc}", file=sys.stderr)
        return 2
    if args.json:
        emit({"family": family.name, "params": params, "given": given, "folder": str(folder), "digest": folder.name})
    else:
        print(folder)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("render", help="render one point of a family into a folder (to read or bench by hand)",
                              description="Render one point of a family (its defaults, with the values given) into "
                                          "OUT/<digest>/, the folder a search would make of it. Nothing enters a database.")
    p.add_argument("family", help="a built-in family's name (two_pass, fused_tiles, fused, numpy_chunked) or a family's folder")
    p.add_argument("values", nargs="*", metavar="NAME=VALUE", help="parameters that differ from the family's defaults")
    p.add_argument("--out", default="gen/render", help="folder to render into, as <out>/<digest>/ (default gen/render)")
    add_json_flag(p)
    p.set_defaults(func=_run)
