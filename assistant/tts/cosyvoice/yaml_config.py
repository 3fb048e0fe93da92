"""Read the official ``cosyvoice2.yaml`` (HyperPyYAML syntax) as plain data, executing nothing.

The official loader builds the model while parsing (``!new:`` constructs, ``!apply:`` calls functions).
We only want the hyper-parameters, so every tag becomes data:

- ``!new:pkg.Cls {args}`` / ``!apply:pkg.fn [args]`` → ``{"__class__": "pkg.Cls", **args}``
  (a positional argument list is kept under ``"__args__"``);
- ``!name:pkg.fn {args}`` → ``{"__class__": "pkg.fn", "__partial__": True, **args}``;
- ``!ref <key>`` → the referenced value; ``!ref <a> * <b>`` (simple arithmetic) is evaluated safely;
- ``__set_seed*`` entries (seeding side effects) are dropped;
- ``!new:omegaconf.DictConfig {content: {...}}`` is flattened to its ``content`` dict.
"""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlConfigError", "read_model_yaml", "read_model_yaml_text"]

_REF = re.compile(r"<([^<>]+)>")
_DICTCONFIG = "omegaconf.DictConfig"


class YamlConfigError(ValueError):
    """The yaml cannot be read as a CosyVoice hyper-parameter file."""


class _Tagged:
    """A tagged node kept unresolved until the whole document is parsed."""

    def __init__(self, kind: str, target: str, value: object) -> None:
        self.kind, self.target, self.value = kind, target, value


class _Ref:
    def __init__(self, expr: str) -> None:
        self.expr = expr


class _Loader(yaml.SafeLoader):
    """A SafeLoader that turns HyperPyYAML tags into inert markers."""


# PyYAML follows YAML 1.1, where ``1e-06`` (no dot) is a string; HyperPyYAML (ruamel, YAML 1.2) reads a float.
_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _construct_tagged(loader: _Loader, suffix: str, node: yaml.Node, kind: str) -> _Tagged:
    if isinstance(node, yaml.MappingNode):
        value: object = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    return _Tagged(kind, suffix, value)


for _kind in ("new", "apply", "name"):
    _Loader.add_multi_constructor(
        f"!{_kind}:", lambda loader, suffix, node, _k=_kind: _construct_tagged(loader, suffix, node, _k)
    )
_Loader.add_constructor("!ref", lambda loader, node: _Ref(str(loader.construct_scalar(node))))


# --- safe arithmetic for !ref expressions -------------------------------------------------------------------

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _eval_arith(node: ast.AST) -> int | float:
    """Evaluate numbers and + - * / // % ** only; anything else is refused."""
    if isinstance(node, ast.Expression):
        return _eval_arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_arith(node.left), _eval_arith(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _eval_arith(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    raise YamlConfigError(f"unsupported expression in !ref: {ast.dump(node)}")


class _Resolver:
    """Resolve references against the top-level document, lazily and with cycle detection."""

    def __init__(self, doc: dict[str, object]) -> None:
        self.doc = doc
        self.done: dict[str, object] = {}
        self.active: set[str] = set()

    def lookup(self, key: str) -> object:
        if key in self.done:
            return self.done[key]
        parts = key.split(".")
        if parts[0] not in self.doc:
            raise YamlConfigError(f"!ref <{key}>: no such key")
        if parts[0] in self.active:
            raise YamlConfigError(f"!ref <{key}>: circular reference")
        self.active.add(parts[0])
        value = self.resolve(self.doc[parts[0]])
        self.active.discard(parts[0])
        self.done[parts[0]] = value
        for p in parts[1:]:  # dotted refs into a mapping
            if not isinstance(value, dict) or p not in value:
                raise YamlConfigError(f"!ref <{key}>: no such key")
            value = value[p]
        return value

    def ref(self, expr: str) -> object:
        expr = expr.strip()
        whole = _REF.fullmatch(expr)
        if whole:  # a plain reference keeps the value's own type (list, dict, str, ...)
            return self.lookup(whole.group(1))
        values: list[object] = []

        def sub(m: re.Match[str]) -> str:
            values.append(self.lookup(m.group(1)))
            return f"__v{len(values) - 1}"

        text = _REF.sub(sub, expr)
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            for i, v in enumerate(values):
                text = text.replace(f"__v{i}", repr(v))
            try:
                return _eval_arith(ast.parse(text, mode="eval"))
            except SyntaxError as exc:
                raise YamlConfigError(f"!ref {expr!r}: not a simple arithmetic expression") from exc
        # string interpolation, e.g. "!ref <dir>/file.txt"
        for i, v in enumerate(values):
            text = text.replace(f"__v{i}", str(v))
        return text

    def resolve(self, value: object) -> object:
        if isinstance(value, _Ref):
            return self.ref(value.expr)
        if isinstance(value, _Tagged):
            args = self.resolve(value.value)
            if value.kind == "new" and value.target == _DICTCONFIG:
                if isinstance(args, dict):
                    return dict(args.get("content", args))
                return {}
            out: dict[str, object] = {"__class__": value.target}
            if value.kind == "name":
                out["__partial__"] = True
            if isinstance(args, dict):
                out.update(args)
            elif isinstance(args, list):
                out["__args__"] = args
            elif args not in (None, ""):
                out["__args__"] = [args]
            return out
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items() if not str(k).startswith("__set_seed")}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value


def read_model_yaml_text(text: str, overrides: dict[str, object] | None = None) -> dict[str, Any]:
    """Parse yaml text; ``overrides`` replace top-level keys before references are resolved. The result is plain
    yaml data (dicts, lists, scalars): untyped, read field by field by the model configs."""
    try:
        doc = yaml.load(text, Loader=_Loader)  # our loader only builds inert markers
    except yaml.YAMLError as exc:
        raise YamlConfigError(f"not valid yaml: {exc}") from exc
    if not isinstance(doc, dict):
        raise YamlConfigError("the top level of the yaml is not a mapping")
    doc = {k: v for k, v in doc.items() if not str(k).startswith("__set_seed")}
    doc.update(overrides or {})
    resolver = _Resolver(doc)
    return {k: resolver.lookup(k) for k in doc}


def read_model_yaml(path: str | Path, overrides: dict[str, object] | None = None) -> dict[str, Any]:
    """Read ``cosyvoice2.yaml`` into plain dicts/lists/scalars (see the module docstring)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise YamlConfigError(f"{path}: cannot read ({exc})") from exc
    try:
        return read_model_yaml_text(text, overrides)
    except YamlConfigError as exc:
        raise YamlConfigError(f"{path}: {exc}") from exc
