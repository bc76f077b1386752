"""Kernel specs: YAML files parsed into frozen records, with errors that name file:line:field.

The YAML is composed into nodes first so that every value keeps its line; pydantic checks the
shape (types, unknown keys) and this module checks the meaning (dtypes, expressions, names).
Any problem becomes a :class:`SpecError` listing every fault found, never a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from b12x_aot.loader import (
    DTYPES,
    Arg,
    ArgError,
    Expr,
    ExpressionError,
    Geometry,
    canonical_hash,
    check_family,
)

from ._arch import ARCHS
from .errors import SpecError, SpecFault

__all__ = ["ARCH_NAME", "ArgTemplate", "Limits", "Spec", "load_spec", "load_specs"]

# Constraints may also read the target arch (e.g. "sm_90a"): a tile that only one arch's
# instructions make worth building is kept off the others' builds.
ARCH_NAME = "arch"

_TEMPLATE = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

Scalar = StrictInt | StrictStr | StrictBool
ExprSource = StrictInt | StrictStr


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ArgModel(_Strict):
    name: StrictStr
    kind: Literal["ptr", "i32", "u32", "i64", "u64", "f32", "f64"]
    dtype: StrictStr | None = None
    align: StrictInt | None = None
    intent: Literal["in", "out", "inout"] = "in"
    shape: list[ExprSource] | None = Field(default=None, min_length=1)


class _LaunchModel(_Strict):
    grid: list[ExprSource] = Field(min_length=3, max_length=3)
    block: list[ExprSource] = Field(min_length=3, max_length=3)
    smem: ExprSource = 0
    cluster: list[ExprSource] | None = Field(default=None, min_length=3, max_length=3)
    requires: list[StrictStr] = []


class _LimitsModel(_Strict):
    max_registers: StrictInt | None = Field(default=None, ge=1, le=255)
    max_spill_bytes: StrictInt | None = Field(default=None, ge=0)
    max_stack_bytes: StrictInt | None = Field(default=None, ge=0)
    async_wgmma: StrictBool = False


class _SpecModel(_Strict):
    family: StrictStr
    abi: StrictInt = Field(ge=1)
    kernel: StrictStr
    doc: StrictStr = ""
    archs: list[StrictStr] = Field(min_length=1)
    params: dict[StrictStr, list[Scalar]] = Field(min_length=1)
    constraints: list[StrictStr] = []
    args: list[_ArgModel] = Field(min_length=1)
    launch: _LaunchModel
    limits: _LimitsModel = _LimitsModel()


@dataclass(frozen=True, slots=True)
class ArgTemplate:
    """A spec argument; ``dtype`` may be a ``{param}`` template resolved per variant."""

    name: str
    kind: str
    dtype: str | None
    align: int | None
    intent: str
    shape: tuple[str, ...] | None = None

    @property
    def template_param(self) -> str | None:
        """The param a ``{param}`` dtype names, or None for a literal dtype."""
        m = _TEMPLATE.match(self.dtype) if self.dtype is not None else None
        return m.group(1) if m else None

    def resolve(self, params: Mapping[str, Any]) -> Arg:
        param = self.template_param
        dtype = str(params[param]) if param is not None else self.dtype
        return Arg(self.name, self.kind, dtype, self.align, self.intent, self.shape)


@dataclass(frozen=True, slots=True)
class Limits:
    """Post-compile bounds; a variant over any of them is recorded as rejected."""

    max_registers: int | None = None
    max_spill_bytes: int | None = None
    max_stack_bytes: int | None = None
    # wgmmas must stay asynchronous: ptxas waits after every wgmma when it cannot prove that
    # no register a wgmma in flight reads is rewritten (remark C7513), a silent slowdown
    async_wgmma: bool = False

    # Bounds added after contracts were first hashed: they enter a contract only when set, so
    # the specs that leave them off keep their hashes (and their variants stay current).
    _LATER = ("async_wgmma",)

    @property
    def needs_sass(self) -> bool:
        """Whether a bound may need nvdisasm's SASS histogram to be decided: async_wgmma always,
        max_spill_bytes whenever a kernel's stack frame exceeds it."""
        return self.async_wgmma or self.max_spill_bytes is not None

    def to_contract(self) -> dict[str, Any]:
        """The bounds as :meth:`Spec.contract` hashes them."""
        return {k: v for k, v in asdict(self).items() if v or k not in self._LATER}


@dataclass(frozen=True, slots=True)
class Spec:
    path: Path
    family: str
    abi: int
    kernel: str
    doc: str
    archs: tuple[str, ...]
    params: tuple[tuple[str, tuple[int | str | bool, ...]], ...]
    constraints: tuple[Expr, ...]
    args: tuple[ArgTemplate, ...]
    geometry: Geometry
    limits: Limits

    @property
    def module(self) -> str:
        return self.kernel.partition(":")[0]

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)

    @property
    def scalar_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.kind != "ptr")

    def contract(self) -> dict[str, Any]:
        """What a compiled variant depends on besides its params and its source closure."""
        return {
            "family": self.family,
            "abi": self.abi,
            "kernel": self.kernel,
            "args": [asdict(a) for a in self.args],
            "launch": self.geometry.to_json(),
            "limits": self.limits.to_contract(),
        }

    def contract_hash(self) -> str:
        """sha256 of :meth:`contract`: a change here makes this family's variants stale."""
        return canonical_hash(self.contract())


# --- YAML with line numbers -------------------------------------------------------------


def _compose(text: str, path: Path) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """Parse YAML into plain objects plus a map from each value's path to its line."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise SpecError(
            path, [SpecFault(line, "", f"invalid YAML: {getattr(exc, 'problem', exc)}")]
        ) from None
    if root is None:
        raise SpecError(path, [SpecFault(1, "", "the file is empty")])
    lines: dict[tuple[Any, ...], int] = {}
    constructor = yaml.constructor.SafeConstructor()

    def build(node: yaml.Node, where: tuple[Any, ...]) -> Any:
        lines[where] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = constructor.construct_object(key_node, deep=True)
                if key in out:
                    raise SpecError(
                        path,
                        [SpecFault(key_node.start_mark.line + 1, _dotted((*where, key)), "duplicate key")],
                    )
                out[key] = build(value_node, (*where, key))
                lines[(*where, key)] = key_node.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            return [build(item, (*where, i)) for i, item in enumerate(node.value)]
        return constructor.construct_object(node, deep=True)

    return build(root, ()), lines


def _dotted(where: Iterable[Any]) -> str:
    text = ""
    for part in where:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _line(lines: Mapping[tuple[Any, ...], int], where: tuple[Any, ...]) -> int:
    while where and where not in lines:
        where = where[:-1]
    return lines.get(where, 1)


# --- validation ---------------------------------------------------------------------------


class _Faults:
    def __init__(self, lines: Mapping[tuple[Any, ...], int]) -> None:
        self.lines = lines
        self.items: list[SpecFault] = []

    def add(self, where: tuple[Any, ...], message: str) -> None:
        self.items.append(SpecFault(_line(self.lines, where), _dotted(where), message))

    def expr(self, where: tuple[Any, ...], source: str | int, allowed: Iterable[str]) -> Expr | None:
        try:
            expr = Expr.parse(source)
        except ExpressionError as exc:
            self.add(where, f"bad expression {source!r}: {exc.reason}")
            return None
        unknown = expr.names - set(allowed)
        if unknown:
            self.add(
                where,
                f"expression {source!r} reads {', '.join(sorted(unknown))}, which is not "
                f"among: {', '.join(sorted(allowed)) or '(nothing)'}",
            )
            return None
        return expr


def _pydantic_faults(exc: ValidationError, faults: _Faults) -> None:
    for err in exc.errors():
        where = tuple(
            p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "constrained-")))
        )
        # Unions report each branch's type name in loc; keep the path a user would write.
        where = tuple(p for p in where if p not in ("int", "str", "bool", "list[...]", "none"))
        got = err.get("input")
        suffix = "" if err["type"] == "missing" else f" (got {got!r})"
        faults.add(where, err["msg"] + suffix)


def _validate(
    model: _SpecModel, faults: _Faults
) -> tuple[tuple[ArgTemplate, ...], Geometry | None, list[Expr]]:
    try:
        check_family(model.family)
    except ValueError as exc:
        faults.add(("family",), str(exc).removeprefix("family "))
    if not _ENTRY.match(model.kernel):
        faults.add(("kernel",), f"must be 'package.module:Class' (got {model.kernel!r})")
    for i, arch in enumerate(model.archs):
        if arch not in ARCHS:
            faults.add(("archs", i), f"unknown arch {arch!r}; known: {', '.join(ARCHS)}")
    if len(set(model.archs)) != len(model.archs):
        faults.add(("archs",), "lists an arch twice")

    for name, values in model.params.items():
        if not name.isidentifier():
            faults.add(("params", name), "param names must be identifiers")
        if not values:
            faults.add(("params", name), "needs at least one value")
        if len(set(map(repr, values))) != len(values):
            faults.add(("params", name), f"lists a value twice: {values}")

    arg_names = [a.name for a in model.args]
    templates: list[ArgTemplate] = []
    for i, arg in enumerate(model.args):
        where = ("args", i)
        if not arg.name.isidentifier():
            faults.add((*where, "name"), f"must be an identifier (got {arg.name!r})")
        if arg_names.count(arg.name) > 1:
            faults.add((*where, "name"), f"argument {arg.name!r} is declared twice")
        if arg.name in model.params:
            faults.add((*where, "name"), f"argument {arg.name!r} has the name of a param")
        shape = tuple(str(d) for d in arg.shape) if arg.shape is not None else None
        template = ArgTemplate(arg.name, arg.kind, arg.dtype, arg.align, arg.intent, shape)
        _check_arg(template, where, model.params, faults)
        templates.append(template)

    params = list(model.params)
    scalars = [a.name for a in model.args if a.kind != "ptr"]
    for i, arg in enumerate(model.args):
        for d, dim in enumerate(arg.shape or ()):
            faults.expr(("args", i, "shape", d), dim, params + scalars)
    if ARCH_NAME in model.params:
        faults.add(
            ("params", ARCH_NAME), f"{ARCH_NAME!r} is the target arch constraints read; rename the param"
        )
    constraints = [
        e
        for i, c in enumerate(model.constraints)
        if (e := faults.expr(("constraints", i), c, [*params, ARCH_NAME]))
    ]
    launch = model.launch
    grid = [faults.expr(("launch", "grid", i), g, params + scalars) for i, g in enumerate(launch.grid)]
    block = [faults.expr(("launch", "block", i), b, params) for i, b in enumerate(launch.block)]
    smem = faults.expr(("launch", "smem"), launch.smem, params)
    cluster = (
        [faults.expr(("launch", "cluster", i), c, params) for i, c in enumerate(launch.cluster)]
        if launch.cluster is not None
        else None
    )
    requires = [
        faults.expr(("launch", "requires", i), r, params + scalars) for i, r in enumerate(launch.requires)
    ]
    geometry = None
    if all(grid) and all(block) and smem and (cluster is None or all(cluster)) and all(requires):
        geometry = Geometry(
            tuple(grid),  # type: ignore[arg-type]
            tuple(block),  # type: ignore[arg-type]
            smem,
            tuple(cluster) if cluster else None,  # type: ignore[arg-type]
            tuple(requires),  # type: ignore[arg-type]
        )
    return tuple(templates), geometry, constraints


def _check_arg(
    arg: ArgTemplate, where: tuple[Any, ...], params: Mapping[str, list[Any]], faults: _Faults
) -> None:
    """Resolve the argument for every dtype its template can take and let :class:`Arg` judge."""
    param = arg.template_param
    if param is not None and param not in params:
        faults.add((*where, "dtype"), f"template {arg.dtype!r} names no param")
        return
    candidates = [{param: v} for v in params[param]] if param is not None else [{}]
    found: dict[tuple[str, str], list[Any]] = {}
    for values in candidates:
        try:
            arg.resolve(values)
        except ArgError as exc:
            found.setdefault((exc.field, exc.reason), []).append(values.get(param))  # type: ignore[arg-type]
    bad_dtypes = [v for (field, _), vs in found.items() if field == "dtype" for v in vs]
    if param is not None and bad_dtypes:
        faults.add(
            (*where, "dtype"),
            f"param {param!r} has values that are not dtypes: {bad_dtypes}; valid: {', '.join(DTYPES)}",
        )
    for field, reason in found:
        if not (param is not None and field == "dtype"):
            faults.add((*where, field) if field else where, reason)


def load_spec(path: str | Path) -> Spec:
    """Load and validate one spec file. Raises :class:`SpecError` listing every fault."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(path, [SpecFault(0, "", f"cannot read the file: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise SpecError(
            path, [SpecFault(line, "", f"not UTF-8 text (byte {exc.start}: {exc.reason})")]
        ) from None
    data, lines = _compose(text, path)
    faults = _Faults(lines)
    if not isinstance(data, dict):
        raise SpecError(path, [SpecFault(1, "", "a spec must be a YAML mapping")])
    try:
        model = _SpecModel.model_validate(data)
    except ValidationError as exc:
        _pydantic_faults(exc, faults)
        raise SpecError(path, faults.items) from None
    args, geometry, constraints = _validate(model, faults)
    if faults.items or geometry is None:
        raise SpecError(path, faults.items)
    return Spec(
        path=path,
        family=model.family,
        abi=model.abi,
        kernel=model.kernel,
        doc=model.doc.strip(),
        archs=tuple(model.archs),
        params=tuple((k, tuple(v)) for k, v in model.params.items()),
        constraints=tuple(constraints),
        args=args,
        geometry=geometry,
        limits=Limits(**model.limits.model_dump()),
    )


def load_specs(paths: Iterable[str | Path]) -> list[Spec]:
    """Load every spec named, expanding directories to their ``*.yaml`` files, sorted.

    Raises :class:`SpecError` for the first bad file, and for two specs of one family and ABI.
    """
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files.extend(sorted([*p.glob("*.yaml"), *p.glob("*.yml")]))
        elif p.exists():
            files.append(p)
        else:
            raise SpecError(p, [SpecFault(0, "", "no such file or directory")])
    if not files:
        raise SpecError(
            Path(*map(str, paths)) if paths else Path("."), [SpecFault(0, "", "no *.yaml specs found")]
        )
    files = list({f.resolve(): f for f in reversed(files)}.values())[::-1]  # a file named twice loads once
    specs = [load_spec(f) for f in files]
    seen: dict[tuple[str, int], Path] = {}
    for spec in specs:
        other = seen.setdefault((spec.family, spec.abi), spec.path)
        if other != spec.path:
            raise SpecError(
                spec.path,
                [SpecFault(1, "family", f"{spec.family} abi {spec.abi} is also defined in {other}")],
            )
    return specs
