"""The safe expression evaluator of family files (derived values and constraints).

Only numbers, strings, booleans, names, `+ - * / // % **`, unary `- + not`, comparisons,
`and`/`or`, `min`/`max` and conditional expressions are evaluated; anything else is
refused at parse time, so a family file can never run code.
"""
from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any

Scalar = int | float | str | bool   # what an expression reads and computes

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCS = {"min": min, "max": max}
# Large integer powers would let a family file stall the process.
_MAX_EXPONENT = 256


class ExpressionError(ValueError):
    """An expression that is malformed, uses a forbidden construct, or fails to evaluate."""


class Expression:
    """A parsed, validated expression; `names` are the free variables it reads."""

    def __init__(self, source: str):
        if not source.strip():
            raise ExpressionError("expression must be a non-empty string")
        self.source = source
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"cannot parse {source!r}: {exc.msg}") from None
        self._tree = tree.body
        self.names: set[str] = set()
        self._validate(self._tree)

    def _validate(self, node: ast.AST) -> None:
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool)):
                raise ExpressionError(f"{self.source!r}: constant {node.value!r} is not allowed")
        elif isinstance(node, ast.Name):
            if node.id in _FUNCS:
                raise ExpressionError(f"{self.source!r}: {node.id} may only be called")
            self.names.add(node.id)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise ExpressionError(f"{self.source!r}: operator {type(node.op).__name__} is not allowed")
            self._validate(node.left)
            self._validate(node.right)
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
                raise ExpressionError(f"{self.source!r}: operator {type(node.op).__name__} is not allowed")
            self._validate(node.operand)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self._validate(value)
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _CMPOPS:
                    raise ExpressionError(f"{self.source!r}: comparison {type(op).__name__} is not allowed")
            self._validate(node.left)
            for comparator in node.comparators:
                self._validate(comparator)
        elif isinstance(node, ast.IfExp):
            self._validate(node.test)
            self._validate(node.body)
            self._validate(node.orelse)
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
                raise ExpressionError(f"{self.source!r}: only min() and max() may be called")
            if node.keywords or not node.args or any(isinstance(a, ast.Starred) for a in node.args):
                raise ExpressionError(f"{self.source!r}: {node.func.id}() takes positional arguments only")
            for arg in node.args:
                self._validate(arg)
        else:
            raise ExpressionError(f"{self.source!r}: {type(node).__name__} is not allowed")

    def evaluate(self, env: Mapping[str, Any]) -> Scalar:
        try:
            return self._eval(self._tree, env)
        except ExpressionError:
            raise
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise ExpressionError(f"{self.source!r}: {type(exc).__name__}: {exc}") from None

    def _eval(self, node: ast.AST, env: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise ExpressionError(f"{self.source!r}: unknown name {node.id!r}")
            return env[node.id]
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, env), self._eval(node.right, env)
            if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > _MAX_EXPONENT:
                raise ExpressionError(f"{self.source!r}: exponent {right} is too large")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            operand = self._eval(node.operand, env)
            if isinstance(node.op, ast.Not):
                return not operand
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BoolOp):
            is_and = isinstance(node.op, ast.And)
            result: Any = is_and
            for value in node.values:  # short-circuits like Python
                result = self._eval(value, env)
                if bool(result) != is_and:
                    return result
            return result
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comparator in zip(node.ops, node.comparators):
                right = self._eval(comparator, env)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self._eval(node.body if self._eval(node.test, env) else node.orelse, env)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):  # _validate admits no other call
            return _FUNCS[node.func.id](*(self._eval(a, env) for a in node.args))
        raise ExpressionError(f"{self.source!r}: {type(node).__name__} is not allowed")  # pragma: no cover
