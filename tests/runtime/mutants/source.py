"""Kernel-source mutants, generated mechanically: a small set of mutation operators applied at
every site they match inside every ``@triton.jit`` function of the op modules
(`clef_runtime.ops`).  Nothing here names a kernel, a line or a check: the operators walk the AST,
so they survive refactors of the kernels, and nobody chose which bugs to plant.

A mutant is (module, function, operator, ordinal): the ordinal-th edit that operator can make in
that function, counting in one fixed traversal order (`_sites`).  `mutate` applies it to the
module's source and returns the new source; the AST is unparsed, so only the edited function
differs in meaning from the original module.

Operators (each a classic mutation operator, applied to kernel code only):

* ``compare``: a comparison's boundary moved or negated (``<`` ↔ ``<=``, ``>`` ↔ ``>=``,
  ``==`` ↔ ``!=``): off-by-one masks, loop and sequence bounds;
* ``arith``: an arithmetic operator replaced (``+`` ↔ ``-``, ``*`` ↔ ``/``);
* ``drop_term``: one operand of a sum or difference dropped (``a + b`` → ``a`` or ``b``,
  ``a - b`` → ``a``);
* ``constant``: a numeric literal changed (an integer n → n + 1, a float c → 2c, 0.0 → 1.0);
* ``swap_stride``: in a sum of products (``i * s_a + j * s_b``), the second factors of two adjacent
  products swapped: a swapped stride or index;
* ``negate``: a unary minus dropped (``-x`` → ``x``);
* ``swap_call``: ``minimum`` ↔ ``maximum``, and the branches of ``where(c, a, b)`` swapped.

Masks' conjunctions (``&``) are not dropped: under the interpreter an unmasked access past a
tensor reads or writes host memory outside it, which can crash the process rather than the kernel.
"""

from __future__ import annotations

import ast
import copy
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

_CMP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
}
_ARITH: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
}
_CALLS = {"minimum": "maximum", "maximum": "minimum"}


def _compare(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        return [ast.Compare(left=node.left, ops=[_CMP[type(node.ops[0])]()], comparators=node.comparators)]
    return []


def _arith(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        return [ast.BinOp(left=node.left, op=_ARITH[type(node.op)](), right=node.right)]
    return []


def _drop_term(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [node.left, node.right]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        return [node.left]
    return []


def _constant(node: ast.AST) -> list[ast.AST]:
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
        return []
    if isinstance(node.value, int):
        return [ast.Constant(node.value + 1)]
    if isinstance(node.value, float):
        return [ast.Constant(2 * node.value if node.value else 1.0)]
    return []


def _terms(node: ast.AST) -> list[ast.AST]:
    """The operands of a chain of additions, left to right."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    return [node]


def _swap_stride(node: ast.AST) -> list[ast.AST]:
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
        return []
    products = [t for t in _terms(node) if isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mult)]
    out: list[ast.AST] = []
    for a, b in itertools.pairwise(products):
        if ast.dump(a.right) == ast.dump(b.right):  # type: ignore[attr-defined]
            continue
        new = copy.deepcopy(node)
        new_products = [t for t in _terms(new) if isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mult)]
        i = products.index(a)
        x, y = new_products[i], new_products[i + 1]
        assert isinstance(x, ast.BinOp) and isinstance(y, ast.BinOp)
        x.right, y.right = y.right, x.right
        out.append(new)
    return out


def _negate(node: ast.AST) -> list[ast.AST]:
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and not isinstance(node.operand, ast.Constant)
    ):
        return [node.operand]
    return []


def _swap_call(node: ast.AST) -> list[ast.AST]:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return []
    name = node.func.attr
    if name in _CALLS:
        new = copy.deepcopy(node)
        assert isinstance(new.func, ast.Attribute)
        new.func.attr = _CALLS[name]
        return [new]
    if name == "where" and len(node.args) == 3 and not node.keywords:
        return [ast.Call(func=node.func, args=[node.args[0], node.args[2], node.args[1]], keywords=[])]
    return []


OPERATORS: dict[str, Callable[[ast.AST], list[ast.AST]]] = {
    "compare": _compare,
    "arith": _arith,
    "drop_term": _drop_term,
    "constant": _constant,
    "swap_stride": _swap_stride,
    "negate": _negate,
    "swap_call": _swap_call,
}


@dataclass(frozen=True)
class Mutant:
    module: str  # e.g. "clef_runtime.ops.conv"
    function: str  # the @triton.jit function edited
    operator: str
    ordinal: int  # the ordinal-th edit of `operator` in `function`
    line: int  # the edited node's line in the original file
    before: str
    after: str

    @property
    def id(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.function}:{self.line}:{self.operator}:{self.ordinal}"


def is_jit(fn: ast.FunctionDef) -> bool:
    """Decorated ``@triton.jit`` / ``@triton.jit(...)`` (or a bare ``@jit``)."""
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "jit":
            return True
    return False


def jit_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and is_jit(n)]


Slot = tuple[ast.AST, str, int | None]  # (parent, field, index in a list field or None)


def _sites(fn: ast.FunctionDef) -> Iterator[tuple[Slot, ast.AST]]:
    """Every expression node in the function's body, depth first, with where it hangs.  Only the
    body: decorators, annotations and defaults (constexpr declarations) are not kernel code."""

    def walk(parent: ast.AST) -> Iterator[tuple[Slot, ast.AST]]:
        for field, value in ast.iter_fields(parent):
            if isinstance(parent, ast.FunctionDef) and field != "body":
                continue
            items = value if isinstance(value, list) else [value]
            for i, child in enumerate(items):
                if not isinstance(child, ast.AST):
                    continue
                if isinstance(child, ast.expr):
                    yield (parent, field, i if isinstance(value, list) else None), child
                yield from walk(child)

    yield from walk(fn)


def _edits(fn: ast.FunctionDef, operator: str) -> Iterator[tuple[Slot, ast.AST, ast.AST]]:
    for slot, node in _sites(fn):
        for replacement in OPERATORS[operator](node):
            yield slot, node, replacement


def generate(module: str, source: str) -> list[Mutant]:
    """Every mutant of every operator over the module's @triton.jit functions."""
    tree = ast.parse(source)
    out = []
    for fn in jit_functions(tree):
        for operator in OPERATORS:
            for k, (_, node, replacement) in enumerate(_edits(fn, operator)):
                before = ast.unparse(node)
                after = ast.unparse(replacement)
                if before != after:
                    out.append(Mutant(module, fn.name, operator, k, node.lineno, before, after))
    return out


def mutate(source: str, mutant: Mutant) -> str:
    """The module's source with the mutant's one edit applied (unparsed from the AST)."""
    tree = ast.parse(source)
    fn = next(f for f in jit_functions(tree) if f.name == mutant.function)
    for k, ((parent, field, index), node, replacement) in enumerate(_edits(fn, mutant.operator)):
        if k != mutant.ordinal:
            continue
        if ast.unparse(node) != mutant.before or node.lineno != mutant.line:
            raise ValueError(f"mutant {mutant.id}: the source changed since it was generated")
        ast.copy_location(replacement, node)
        if index is None:
            setattr(parent, field, replacement)
        else:
            getattr(parent, field)[index] = replacement
        return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    raise ValueError(f"mutant {mutant.id}: no such edit")


def op_modules(root: Path) -> dict[str, Path]:
    """The op modules that hold @triton.jit functions: module name → file."""
    out = {}
    for path in sorted(root.glob("*.py")):
        if jit_functions(ast.parse(path.read_text())):
            out[f"clef_runtime.ops.{path.stem}"] = path
    return out


def generate_all(root: Path) -> list[Mutant]:
    return [m for name, path in op_modules(root).items() for m in generate(name, path.read_text())]
