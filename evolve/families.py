"""Template families: load and validate `family.toml`, check constraints, walk the space.

A family is a folder of Jinja templates plus a search space (see docs/design.md,
"Template families"). Everything is checked when the family is loaded, so a bad family
fails before any candidate is rendered or any GPU time is spent.
"""
from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evolve.expression import Expression, ExpressionError, Scalar
from evolve.tomlfile import load_toml_model

FAMILY_FILE = "family.toml"

Value = Scalar    # a parameter's value: derived values and constraints compute with them


class FamilyError(ValueError):
    """A family file that cannot be used, with the reason."""


class ParamsError(ValueError):
    """A parameter point outside the family's space; `reasons` lists every problem."""

    def __init__(self, family: str, reasons: list[str]):
        self.family = family
        self.reasons = reasons
        super().__init__(f"family {family!r}: " + "; ".join(reasons))


class Constraint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    expr: str
    message: str = ""


class FamilySpec(BaseModel):
    """The contents of `family.toml`, as written."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    workloads: list[str] = Field(min_length=1)
    description: str = ""
    render: list[str] = Field(default_factory=list)
    copy_files: list[str] = Field(default_factory=list, alias="copy")
    # Folders (relative to the family's) where its templates' {% include %} also look, after
    # its own: a family built from another's parts includes them instead of copying them.
    include_dirs: list[str] = Field(default_factory=list)
    cuda_sources: list[str] = Field(default_factory=list)
    kernels: list[str] = Field(default_factory=list)
    # Extra nvcc flags for the check stage's compile (e.g. "-std=c++17"); optional.
    nvcc_flags: list[str] = Field(default_factory=list)
    parameters: dict[str, list[Value]] = Field(min_length=1)
    defaults: dict[str, Value]
    derived: dict[str, str] = Field(default_factory=dict)
    constraints: list[Constraint] = Field(default_factory=list)

    @field_validator("parameters")
    @classmethod
    def _values_nonempty_unique(cls, v: dict[str, list[Value]]) -> dict[str, list[Value]]:
        for name, values in v.items():
            if not name.isidentifier():
                raise ValueError(f"parameter name {name!r} is not an identifier")
            if not values:
                raise ValueError(f"parameter {name!r} has no values")
            if len({(type(x).__name__, x) for x in values}) != len(values):
                raise ValueError(f"parameter {name!r} lists a value twice")
        return v


class ConstraintFailure(BaseModel):
    expr: str
    message: str
    values: dict[str, Value]  # the names the expression read, with their values

    def explain(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(self.values.items()))
        text = self.message or "constraint not met"
        return f"{text} ({self.expr}; {shown})"


class Family:
    """A loaded, validated family. `directory` holds its templates."""

    def __init__(self, spec: FamilySpec, directory: Path):
        self.spec = spec
        self.directory = directory
        self.name = spec.name
        self.parameters = spec.parameters
        self._derived = self._compile_derived(spec)
        self._constraints = self._compile_constraints(spec)
        self._every_point: list[dict[str, Value]] | None = None   # sample()'s fallback, walked once
        self._check_files()
        failures = self.check(spec.defaults)
        if failures:
            raise FamilyError(f"family {self.name!r}: defaults are not admitted: " + "; ".join(failures))

    # ---- loading-time validation -------------------------------------------------------
    def _compile_derived(self, spec: FamilySpec) -> list[tuple[str, Expression]]:
        known = set(spec.parameters)
        out = []
        for name, source in spec.derived.items():  # TOML keeps order: each may use earlier ones
            if not name.isidentifier():
                raise FamilyError(f"family {spec.name!r}: derived name {name!r} is not an identifier")
            if name in spec.parameters:
                raise FamilyError(f"family {spec.name!r}: derived {name!r} shadows a parameter")
            try:
                expr = Expression(source)
            except ExpressionError as exc:
                raise FamilyError(f"family {spec.name!r}: derived {name!r}: {exc}") from None
            unknown = expr.names - known
            if unknown:
                raise FamilyError(f"family {spec.name!r}: derived {name!r} uses unknown names {sorted(unknown)}")
            known.add(name)
            out.append((name, expr))
        return out

    def _compile_constraints(self, spec: FamilySpec) -> list[tuple[Constraint, Expression]]:
        known = set(spec.parameters) | set(spec.derived)
        out = []
        for c in spec.constraints:
            try:
                expr = Expression(c.expr)
            except ExpressionError as exc:
                raise FamilyError(f"family {spec.name!r}: constraint: {exc}") from None
            unknown = expr.names - known
            if unknown:
                raise FamilyError(f"family {spec.name!r}: constraint {c.expr!r} uses unknown names {sorted(unknown)}")
            out.append((c, expr))
        return out

    def _check_files(self) -> None:
        for rel in self.spec.render:
            if not rel.endswith(".j2"):
                raise FamilyError(f"family {self.name!r}: render entry {rel!r} must end in .j2")
            if not (self.directory / rel).is_file():
                raise FamilyError(f"family {self.name!r}: template {rel!r} not found in {self.directory}")
        for rel in self.spec.copy_files:
            if not (self.directory / rel).is_file():
                raise FamilyError(f"family {self.name!r}: copied file {rel!r} not found")
        for rel in self.spec.include_dirs:
            if not (self.directory / rel).is_dir():
                raise FamilyError(f"family {self.name!r}: include folder {rel!r} not found")
        outputs = set(self.output_names())
        if len(outputs) != len(self.spec.render) + len(self.spec.copy_files):
            raise FamilyError(f"family {self.name!r}: two rendered or copied files share an output name")
        for src in self.spec.cuda_sources:
            if src not in outputs:
                raise FamilyError(f"family {self.name!r}: cuda source {src!r} is neither rendered nor copied")
        if "params.json" in outputs:
            raise FamilyError(f"family {self.name!r}: params.json is written by the renderer")

    # ---- queries ----------------------------------------------------------------------
    def output_names(self) -> list[str]:
        """File names in a rendered candidate (without params.json)."""
        return [Path(r).name[: -len(".j2")] for r in self.spec.render] + [Path(c).name for c in self.spec.copy_files]

    @property
    def defaults(self) -> dict[str, Value]:
        return dict(self.spec.defaults)

    def param_errors(self, params: Mapping[str, Any]) -> list[str]:
        """Problems with the names and values of `params` (not the constraints)."""
        errors = []
        for name in params:
            if name not in self.parameters:
                errors.append(f"unknown parameter {name!r}")
        for name, allowed in self.parameters.items():
            if name not in params:
                errors.append(f"missing parameter {name!r}")
            elif not _member(params[name], allowed):
                errors.append(f"{name}={params[name]!r} is not one of {allowed}")
        return errors

    def environment(self, params: Mapping[str, Any]) -> dict[str, Value]:
        """Parameters plus derived values (the names templates and constraints see)."""
        env: dict[str, Value] = dict(params)
        for name, expr in self._derived:
            try:
                env[name] = expr.evaluate(env)
            except ExpressionError as exc:
                raise ParamsError(self.name, [f"derived {name!r}: {exc}"]) from None
        return env

    def parameters_behind(self, names: Iterable[str]) -> set[str]:
        """The parameters that `names` (parameters or derived values) depend on, directly or
        through derived values: points that agree on them agree on every one of `names`. Other
        names (a template's own variables) depend on none."""
        reads: dict[str, set[str]] = {}
        for name, expr in self._derived:   # in order: a derived value reads only earlier ones
            reads[name] = set().union(*({n} if n in self.parameters else reads.get(n, set()) for n in expr.names))
        return set().union(*({n} if n in self.parameters else reads.get(n, set()) for n in names))

    def constraint_failures(self, params: Mapping[str, Any]) -> list[ConstraintFailure]:
        env = self.environment(params)
        failures = []
        for constraint, expr in self._constraints:
            try:
                ok = bool(expr.evaluate(env))
            except ExpressionError:
                ok = False
            if not ok:
                failures.append(ConstraintFailure(
                    expr=constraint.expr, message=constraint.message,
                    values={n: env[n] for n in sorted(expr.names) if n in env}))
        return failures

    def check(self, params: Mapping[str, Any]) -> list[str]:
        """Every reason `params` is not an admitted point; empty when it is."""
        errors = self.param_errors(params)
        if errors:
            return errors
        try:
            return [f.explain() for f in self.constraint_failures(params)]
        except ParamsError as exc:
            return exc.reasons

    def validate(self, params: Mapping[str, Any]) -> dict[str, Value]:
        """`params` if admitted, else ParamsError naming each failed check."""
        errors = self.check(params)
        if errors:
            raise ParamsError(self.name, errors)
        return {name: params[name] for name in self.parameters}

    def admits(self, params: Mapping[str, Any]) -> bool:
        return not self.check(params)

    def restrict(self, fixed: Mapping[str, Value] | None = None,
                 subspace: Mapping[str, list[Value]] | None = None) -> Family:
        """A family over a smaller space: `fixed` pins values, `subspace` narrows lists."""
        parameters = {k: list(v) for k, v in self.parameters.items()}
        for name, value in (fixed or {}).items():
            if name not in parameters:
                raise FamilyError(f"family {self.name!r}: cannot fix unknown parameter {name!r}")
            if not _member(value, parameters[name]):
                raise FamilyError(f"family {self.name!r}: fixed {name}={value!r} is not one of {parameters[name]}")
            parameters[name] = [value]
        for name, values in (subspace or {}).items():
            if name not in parameters:
                raise FamilyError(f"family {self.name!r}: subspace names unknown parameter {name!r}")
            bad = [v for v in values if not _member(v, parameters[name])]
            if bad or not values:
                raise FamilyError(f"family {self.name!r}: subspace {name}={values!r} is not within {parameters[name]}")
            parameters[name] = list(values)
        defaults = dict(self.spec.defaults)
        for name, values in parameters.items():
            if not _member(defaults[name], values):
                defaults[name] = values[0]
        spec = self.spec.model_copy(update={"parameters": parameters, "defaults": defaults})
        try:
            return Family(spec, self.directory)
        except FamilyError:
            # The narrowed defaults may break a constraint: take the first admitted point.
            point = next(self._admitted(parameters), None)
            if point is None:
                raise FamilyError(f"family {self.name!r}: the restricted space admits no point") from None
            return Family(spec.model_copy(update={"defaults": point}), self.directory)

    def _quick_check(self, params: Mapping[str, Any]) -> list[str]:
        try:
            return [f.explain() for f in self.constraint_failures(params)]
        except ParamsError as exc:
            return exc.reasons

    # ---- the space --------------------------------------------------------------------
    def size_upper_bound(self) -> int:
        n = 1
        for values in self.parameters.values():
            n *= len(values)
        return n

    def points(self) -> Iterator[dict[str, Value]]:
        """Every admitted point, defaults first, then in declaration order."""
        yield self.defaults
        for point in self._admitted(self.parameters):
            if point != self.spec.defaults:
                yield point

    def _admitted(self, parameters: Mapping[str, list[Value]]) -> Iterator[dict[str, Value]]:
        """The admitted points of `parameters` in the order of their product (the last name
        varies fastest), found depth first: a derived value is computed, and a constraint
        checked, as soon as every parameter it reads (itself or through derived values) is
        chosen, so no point below a broken constraint is ever built. Filtering the product
        point by point took 40 s over two_pass's 500,000 combinations."""
        names = list(parameters)
        if not names:
            yield from _points(parameters, lambda p: not self._quick_check(p))
            return
        depth = {n: i for i, n in enumerate(names)}
        reads: dict[str, set[str]] = {}        # the parameters behind each derived value

        def params_of(expr: Expression) -> set[str]:   # itself or through derived values
            out: set[str] = set()
            for n in expr.names:
                out |= {n} if n in depth else reads.get(n, set(names))
            return out

        def level(expr: Expression) -> int:   # the depth at which every name it reads is known
            return max((depth[n] for n in params_of(expr)), default=0)

        derived_at: list[list[tuple[str, Expression]]] = [[] for _ in names]
        for name, expr in self._derived:
            reads[name] = params_of(expr)
            derived_at[level(expr)].append((name, expr))
        constraints_at: list[list[Expression]] = [[] for _ in names]
        for _, expr in self._constraints:
            constraints_at[level(expr)].append(expr)

        env: dict[str, Value] = {}

        def holds(d: int) -> bool:
            try:
                for name, expr in derived_at[d]:
                    env[name] = expr.evaluate(env)
                return all(bool(expr.evaluate(env)) for expr in constraints_at[d])
            except ExpressionError:   # as environment() and constraint_failures() treat it
                return False

        def walk(d: int) -> Iterator[dict[str, Value]]:
            for value in parameters[names[d]]:
                env[names[d]] = value
                if not holds(d):
                    continue
                if d + 1 == len(names):
                    yield {n: env[n] for n in names}
                else:
                    yield from walk(d + 1)

        yield from walk(0)

    def sample(self, rng: random.Random, attempts: int = 200) -> dict[str, Value]:
        """A uniformly drawn admitted point (rejection sampling, then enumeration)."""
        for _ in range(attempts):
            point = {k: rng.choice(v) for k, v in self.parameters.items()}
            if not self._quick_check(point):
                return point
        if self._every_point is None:   # a space that admits few of its combinations misses often
            self._every_point = list(self.points())
        return dict(rng.choice(self._every_point))


def _member(value: Any, allowed: list[Value]) -> bool:
    # bool is an int in Python; keep True distinct from 1 so a typo is caught.
    return any(type(value) is type(a) and value == a for a in allowed) or (
        isinstance(value, int) and not isinstance(value, bool)
        and any(isinstance(a, float) and value == a for a in allowed))


def _points(parameters: Mapping[str, list[Value]],
            admitted: Callable[[dict[str, Value]], bool]) -> Iterator[dict[str, Value]]:
    names = list(parameters)
    for combo in itertools.product(*(parameters[n] for n in names)):
        point = dict(zip(names, combo))
        if admitted(point):
            yield point


def load_family(directory: str | Path) -> Family:
    """Load and validate `directory/family.toml`."""
    directory = Path(directory)
    path = directory / FAMILY_FILE
    if not path.is_file():
        raise FamilyError(f"no {FAMILY_FILE} in {directory}")
    return Family(load_toml_model(path, FamilySpec, FamilyError), directory.resolve())


def value_key(value: Any) -> tuple[str, Any]:
    """A parameter value as a key that tells 1 from True and 1.0."""
    return (type(value).__name__, value)


def canonical_params(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A hashable, order-free key of a parameter point."""
    return tuple(sorted((k, value_key(v)) for k, v in params.items()))
