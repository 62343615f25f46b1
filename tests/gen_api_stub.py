"""Write ``hpccoll/_api.pyi``, the typing stub of ``hpccoll/_api.py``, from ``_api.py``'s own signatures.

``python tests/gen_api_stub.py`` writes it; ``tests/test_api_stub.py`` regenerates it in memory and fails when
the file on disk differs. Run it after changing a signature, a type alias or an export of ``_api.py``.

The stub exists for what one Python signature cannot say: the result's type depends on an argument's value.
``_api.py`` declares each public function once, with a plain signature (``async_op: bool = False`` ->
``Union[R, Request[R]]``); the stub gives mypy and IDEs an ``@overload`` for each form:

- ``async_op: Literal[False] = False`` -> ``R``, and ``async_op: Literal[True]`` -> ``Request[R]``;
- the forms of :data:`NONE_FORMS`: a parameter set to ``None`` changes the other parameters and the result
  (``all_gather(x, axis=None)`` gives a list of per-rank arrays); in the other form that parameter is not
  ``None``.

Everything else ``_api.py`` defines is copied as its signature: type aliases whole, annotated names as their
annotation, classes with their fields and method signatures; private functions are left out. Defaults that are
literals stay (an IDE shows them); others become ``...``. The output is what ``ruff format`` makes of it, so
``make lint`` passes on the generated file too.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "hpccoll" / "_api.py"
STUB = ROOT / "hpccoll" / "_api.pyi"
COMMAND = "python tests/gen_api_stub.py"
HEADER = f"# Generated from _api.py by `{COMMAND}`: do not edit (tests/test_api_stub.py fails on drift).\n"
LINE = 120  # ruff's line-length (pyproject.toml)

#: function -> (the parameter that is ``None`` in the extra form, that form's other parameters as written in
#: a signature, its result). The extra form comes first; in the other form the parameter's ``Optional`` goes.
NONE_FORMS: Dict[str, Tuple[str, Sequence[str], str]] = {
    "all_gather": ("axis", ["x: Array", "sizes: None = None", "out: Optional[Sequence[Array]] = None"], "List[Array]"),
    "all_gather_adjoint": (
        "axis",
        ["y: Sequence[Array]", "sizes: None = None", "out: Optional[Array] = None"],
        "Array",
    ),
}

#: Where the names the stub adds (the overloads, the forms of NONE_FORMS) come from, when _api.py does not import them.
ADDED_IMPORTS = {name: "typing" for name in ("List", "Literal", "Optional", "Sequence", "Union", "overload")}
ADDED_IMPORTS["Array"] = "._arrays"
ADDED_IMPORTS["Request"] = "._request"


class StubError(Exception):
    """``_api.py`` holds something the generator cannot turn into a stub; the message says what to change."""


def text(node: ast.AST) -> str:
    """Source text of an expression, on one line, strings in double quotes (as ruff format writes them)."""
    return re.sub(r"'([^'\"\\]*)'", r'"\1"', ast.unparse(node))


def default(node: ast.expr) -> str:
    """A default as a stub writes it: a literal as is, anything else ``...``."""
    literal = isinstance(node, ast.Constant) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)
    )
    return text(node) if literal else "..."


class Param:
    """One parameter: its kind (``""``, ``"*"`` or ``"**"``), name, annotation and default, as stub text."""

    def __init__(self, kind: str, name: str, annotation: Optional[str], value: Optional[str]) -> None:
        self.kind, self.name, self.annotation, self.value = kind, name, annotation, value

    @classmethod
    def parse(cls, written: str) -> Param:
        """A parameter written as in a signature (``"out: Optional[Array] = None"``)."""
        fn = ast.parse(f"def f(*, {written}): ...").body[0]
        assert isinstance(fn, ast.FunctionDef)
        arg, value = fn.args.kwonlyargs[0], fn.args.kw_defaults[0]
        return cls("", arg.arg, text(arg.annotation) if arg.annotation else None, default(value) if value else None)

    def __str__(self) -> str:
        out = self.kind + self.name + (f": {self.annotation}" if self.annotation else "")
        if self.value is not None:
            out += f" = {self.value}" if self.annotation else f"={self.value}"
        return out


def params_of(args: ast.arguments) -> List[Param]:
    """The parameters of a ``def``, with its ``/`` and ``*`` markers as parameters of no annotation."""

    def one(arg: ast.arg, value: Optional[ast.expr], kind: str = "") -> Param:
        annotation = text(arg.annotation) if arg.annotation else None
        return Param(kind, arg.arg, annotation, default(value) if value is not None else None)

    positional = args.posonlyargs + args.args
    values: List[Optional[ast.expr]] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = [one(a, v) for a, v in zip(positional, values)]
    if args.posonlyargs:
        out.insert(len(args.posonlyargs), Param("", "/", None, None))
    if args.vararg:
        out.append(one(args.vararg, None, "*"))
    elif args.kwonlyargs:
        out.append(Param("", "*", None, None))
    out += [one(a, v) for a, v in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        out.append(one(args.kwarg, None, "**"))
    return out


def signature(name: str, params: Sequence[Param], result: Optional[str], indent: str = "") -> str:
    """``def name(params) -> result: ...`` laid out as ruff format lays it out."""
    head, tail = f"{indent}def {name}(", f") -> {result}: ..." if result else "): ..."
    joined = ", ".join(map(str, params))
    if len(head + joined + tail) <= LINE:
        return head + joined + tail
    if len(indent + "    " + joined) <= LINE:
        return f"{head}\n{indent}    {joined}\n{indent}{tail}"
    return head + "".join(f"\n{indent}    {p}," for p in params) + f"\n{indent}{tail}"


def optional_dropped(annotation: Optional[str]) -> str:
    """``Optional[T]`` -> ``T`` (the form of :data:`NONE_FORMS` where the parameter is not None)."""
    match = re.fullmatch(r"Optional\[(.*)\]", annotation or "")
    if not match:
        raise StubError(f"NONE_FORMS: expected an Optional[...] parameter; got {annotation!r}")
    return match.group(1)


def forms(fn: ast.FunctionDef) -> Iterator[str]:
    """The stub of a public function: its overloads, or its plain signature."""
    params, result = params_of(fn.args), text(fn.returns) if fn.returns else None
    names = [p.name for p in params]
    variants: List[Tuple[List[Param], Optional[str]]] = [(params, result)]
    if fn.name in NONE_FORMS:
        key, written, none_result = NONE_FORMS[fn.name]
        replaced = {p.name: p for p in map(Param.parse, [f"{key}: None", *written])}
        if set(replaced) - set(names):
            raise StubError(f"NONE_FORMS[{fn.name!r}]: {fn.name} has no {sorted(set(replaced) - set(names))}")
        kept = [Param(p.kind, p.name, optional_dropped(p.annotation), p.value) if p.name == key else p for p in params]
        wrapped = f"Union[{none_result}, Request[{none_result}]]"
        variants = [([replaced.get(p.name, p) for p in params], wrapped), (kept, result)]
    if "async_op" not in names:
        if len(variants) > 1:
            raise StubError(f"NONE_FORMS[{fn.name!r}]: expected a function with async_op")
        yield signature(fn.name, params, result)
        return
    for form, both in variants:
        match = re.fullmatch(r"Union\[(.*), Request\[(.*)\]\]", both or "")
        if not match or match.group(1) != match.group(2):
            raise StubError(f"{fn.name}: with async_op, expected a result Union[R, Request[R]]; got {both!r}")
        for literal, value, out in (("False", "False", match.group(1)), ("True", None, f"Request[{match.group(1)}]")):
            changed = [Param("", "async_op", f"Literal[{literal}]", value) if p.name == "async_op" else p for p in form]
            yield "@overload\n" + signature(fn.name, changed, out)


def function(fn: ast.FunctionDef, indent: str = "") -> str:
    """A function's stub lines, its decorators kept."""
    if any(isinstance(d, ast.Name) and d.id == "overload" for d in fn.decorator_list):
        raise StubError(f"{fn.name}: write one plain signature in _api.py; the generator writes the overloads")
    decorators = "".join(f"{indent}@{text(d)}\n" for d in fn.decorator_list)
    if indent:
        return decorators + signature(fn.name, params_of(fn.args), text(fn.returns) if fn.returns else None, indent)
    return decorators + "\n".join(forms(fn))


def klass(cls: ast.ClassDef) -> str:
    """A class's stub: its bases, annotated fields and method signatures."""
    bases = ", ".join([*map(text, cls.bases), *map(text, cls.keywords)])
    lines = [f"class {cls.name}({bases}):" if bases else f"class {cls.name}:"]
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            value = f" = {default(node.value)}" if node.value else ""
            lines.append(f"    {node.target.id}: {text(node.annotation)}{value}")
        elif isinstance(node, ast.FunctionDef):
            lines.append(function(node, "    "))
    return "\n".join(lines) if len(lines) > 1 else lines[0] + " ..."


def is_alias(value: ast.expr) -> bool:
    """A module-level value that is a type (``Union[...]``, ``Optional[...]``, a name)."""
    return isinstance(value, (ast.Subscript, ast.Name, ast.Attribute, ast.BinOp))


def used_names(tree: ast.AST) -> Set[str]:
    """Every name the stub's code refers to, those inside string annotations too (but not in ``Literal``)."""
    found: Set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            found.add("Literal")
            continue
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                stack.append(ast.parse(node.value, mode="eval"))
            except SyntaxError:
                pass
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_key(name: str) -> Tuple[int, str]:
    """isort's order of the names in one import (ruff's ``order-by-type``: CONSTANTS, Classes, functions)."""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name.lower() if kind == 2 else name


def imports(tree: ast.Module, keep: Set[str]) -> str:
    """The imports of ``_api.py`` (its TYPE_CHECKING ones included) that the stub uses, grouped as isort does."""
    found: Dict[Tuple[int, str], Set[str]] = {}
    nodes: List[ast.stmt] = []
    for node in tree.body:
        nodes += node.body if isinstance(node, ast.If) and text(node.test) == "TYPE_CHECKING" else [node]
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                if (alias.asname or alias.name) in keep:
                    written = f"{alias.name} as {alias.asname}" if alias.asname else alias.name
                    found.setdefault((node.level > 0, module), set()).add(written)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name).split(".")[0] in keep:
                    raise StubError(f"import {alias.name}: use `from ... import` in _api.py")
    blocks: List[List[str]] = [[], []]
    for (local, module), names in sorted(found.items()):
        joined = ", ".join(sorted(names, key=import_key))
        line = f"from {module} import {joined}"
        if len(line) > LINE:
            line = f"from {module} import (\n" + "".join(f"    {n},\n" for n in sorted(names, key=import_key)) + ")"
        blocks[local].append(line)
    return "\n\n".join("\n".join(block) for block in blocks if block)


def stub(source: str) -> str:
    """The text of ``_api.pyi`` for the text of ``_api.py``."""
    tree = ast.parse(source)
    for name in NONE_FORMS:
        if not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
            raise StubError(f"NONE_FORMS names {name}, which _api.py does not define")
    exported: Set[str] = set()
    parts: List[Tuple[str, str]] = []  # (kind, text): ruff format's blank lines depend on the kinds met
    for node in tree.body:
        if isinstance(node, ast.Assign) and [text(t) for t in node.targets] == ["__all__"]:
            exported = set(ast.literal_eval(node.value))
            parts.append(("name", ast.get_source_segment(source, node) or text(node)))
        elif isinstance(node, ast.Assign):
            names = ", ".join(text(t) for t in node.targets)
            if not is_alias(node.value):
                raise StubError(f"{names}: annotate it in _api.py (a stub needs its type)")
            parts.append(("name", f"{names} = {text(node.value)}"))
        elif isinstance(node, ast.AnnAssign):
            parts.append(("name", f"{text(node.target)}: {text(node.annotation)}"))
        elif isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            parts.append(("def", function(node)))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            parts.append(("class", klass(node)))
        elif isinstance(node, ast.If) and text(node.test) == "TYPE_CHECKING":
            continue  # its imports are read by imports()
        elif not isinstance(node, (ast.Expr, ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
            raise StubError(f"line {node.lineno}: the generator does not know what a stub makes of {text(node)!r}")
    body = parts[0][1]
    for (before, _), (kind, written) in zip(parts, parts[1:]):
        # a stub's blank lines: around a class, and where defs and names meet; none in a run of either
        body += ("\n\n" if "class" in (before, kind) or before != kind else "\n") + written
    keep = (used_names(ast.parse(body)) | exported) - {"TYPE_CHECKING"}
    imported = {
        a.asname or a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
    }
    for name in sorted(keep - imported):
        if name not in ADDED_IMPORTS:
            continue  # defined in _api.py itself, or a builtin
        tree.body.insert(0, ast.parse(f"from {ADDED_IMPORTS[name]} import {name}").body[0])
    return HEADER + "\n" + imports(tree, keep) + "\n\n" + body + "\n"


def main(argv: Sequence[str]) -> int:
    """Write the stub (or, with ``--check``, say whether the file on disk is current)."""
    new = stub(SOURCE.read_text())
    if "--check" in argv:
        current = STUB.is_file() and STUB.read_text() == new
        print(f"{STUB.relative_to(ROOT)} is {'current' if current else 'stale: run ' + COMMAND}")
        return 0 if current else 1
    STUB.write_text(new)
    print(f"wrote {STUB.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
