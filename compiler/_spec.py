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

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from b12x_aot.contract import ArgError, Expr, Geometry, canonical_hash, check_family

from ._arch import ARCHS
from ._spec_args import ArgTemplate, check_arg, spec_symbols, tensor_template
from ._spec_check import check_expressions
from ._spec_tables import read_tables, table_constraint
from ._spec_yaml import Faults, compose, pydantic_faults, read_text
from .errors import SpecError, SpecFault

__all__ = [
    "ARCH_NAME",
    "ArgTemplate",
    "EntryValue",
    "Limits",
    "Spec",
    "entry_value",
    "load_spec",
    "load_specs",
]

# Constraints may also read the target arch (e.g. "sm_90a"): a tile that only one arch's
# instructions make worth building is kept off the others' builds.
ARCH_NAME = "arch"

_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

Scalar = StrictInt | StrictStr | StrictBool
ExprSource = StrictInt | StrictStr


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ArgModel(_Strict):
    name: StrictStr
    kind: Literal["ptr", "tensor", "i32", "u32", "i64", "u64", "f32", "f64"]
    dtype: StrictStr | None = None
    align: StrictInt | None = None
    intent: Literal["in", "out", "inout"] = "in"
    shape: list[ExprSource] | None = Field(default=None, min_length=1)
    # tensors only
    stride: Literal["row_major", "column_major", "dynamic"] | list[ExprSource] | None = None
    dynamic: list[StrictInt] | None = None
    divisibility: dict[StrictStr, StrictInt] | None = None
    shape_bits: Literal[32, 64] | None = None
    stride_bits: Literal[32, 64] | None = None


class _LaunchModel(_Strict):
    # grid, block and smem may be left to the kernel's host function (read from its launch)
    grid: list[ExprSource] | None = Field(default=None, min_length=3, max_length=3)
    block: list[ExprSource] | None = Field(default=None, min_length=3, max_length=3)
    smem: ExprSource | None = None
    cluster: list[ExprSource] | None = Field(default=None, min_length=3, max_length=3)
    requires: list[StrictStr] = []
    let: dict[StrictStr, ExprSource] = {}


class _LimitsModel(_Strict):
    max_registers: StrictInt | None = Field(default=None, ge=1, le=255)
    max_spill_bytes: StrictInt | None = Field(default=None, ge=0)
    max_stack_bytes: StrictInt | None = Field(default=None, ge=0)
    async_wgmma: StrictBool = False


class _TableModel(_Strict):
    file: StrictStr  # relative to the spec
    columns: list[StrictStr] = Field(min_length=1)


class _SpecModel(_Strict):
    family: StrictStr
    abi: StrictInt = Field(ge=1)
    kernel: StrictStr
    doc: StrictStr = ""
    archs: list[StrictStr] = Field(min_length=1)
    params: dict[StrictStr, list[Scalar]] = Field(min_length=1)
    constraints: list[StrictStr] = []
    tables: dict[StrictStr, _TableModel] = {}  # named param tuples the constraints read (_spec_tables)
    args: list[_ArgModel] = Field(min_length=1)
    launch: _LaunchModel = _LaunchModel()
    limits: _LimitsModel = _LimitsModel()
    # the kernel entry's own arguments, from params: a class's constructor keywords, and the
    # jit function's Constexpr keywords (ints, strings, tuples, DSL numeric types)
    init: dict[StrictStr, Any] | None = None
    constexpr: dict[StrictStr, Any] = {}


# A value of ``init``/``constexpr``: a literal int or bool, an expression over the params (a
# YAML string: "tile_m", "(tile_m, tile_n, 64)", "dtype(element)", "'row'"), or a tuple of values.
EntryValue = int | bool | Expr | tuple[Any, ...]


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
    init: tuple[tuple[str, EntryValue], ...] | None = None  # None: a registry kernel class
    constexpr: tuple[tuple[str, EntryValue], ...] = ()

    @property
    def module(self) -> str:
        return self.kernel.partition(":")[0]

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)

    @property
    def scalar_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.kind not in ("ptr", "tensor"))

    @property
    def symbols(self) -> tuple[str, ...]:
        """The names tensor arguments bind (see ``_spec_args``)."""
        return tuple(spec_symbols(self.args, self.param_names))

    def contract(self) -> dict[str, Any]:
        """What a compiled variant depends on besides its params and its source closure."""
        out = {
            "family": self.family,
            "abi": self.abi,
            "kernel": self.kernel,
            "args": [a.to_contract() for a in self.args],
            "launch": self.geometry.to_json(),
            "limits": self.limits.to_contract(),
        }
        # added after contracts were first hashed: present only when a spec uses them
        if self.init is not None:
            out["init"] = {k: _value_json(v) for k, v in self.init}
        if self.constexpr:
            out["constexpr"] = {k: _value_json(v) for k, v in self.constexpr}
        return out

    def contract_hash(self) -> str:
        """sha256 of :meth:`contract`: a change here makes this family's variants stale."""
        return canonical_hash(self.contract())


def _value_json(value: EntryValue) -> Any:
    if isinstance(value, Expr):
        return value.source
    if isinstance(value, tuple):
        return [_value_json(v) for v in value]
    return value


def entry_value(value: EntryValue, params: Mapping[str, Any], functions: Mapping[str, Any]) -> Any:
    """An ``init``/``constexpr`` value for one variant: expressions evaluated over its params
    (``functions`` gives ``dtype`` its meaning, the DSL's numeric type), lists as tuples."""
    if isinstance(value, Expr):
        return value.evaluate(params, functions)
    if isinstance(value, tuple):
        return tuple(entry_value(v, params, functions) for v in value)
    return value


def _validate(
    model: _SpecModel, faults: Faults, tables: Mapping[str, Expr]
) -> tuple[tuple[ArgTemplate, ...], Geometry | None, list[Expr]]:
    try:
        check_family(model.family)
    except ValueError as exc:
        faults.add(("family",), str(exc).removeprefix("family "))
    if not _ENTRY.match(model.kernel):
        faults.add(
            ("kernel",), f"must be 'package.module:Class' or 'package.module:function' (got {model.kernel!r})"
        )
    for i, arch in enumerate(model.archs):
        if arch not in ARCHS:
            faults.add(("archs", i), f"unknown arch {arch!r}; known: {', '.join(ARCHS)}")
    if len(set(model.archs)) != len(model.archs):
        faults.add(("archs",), "lists an arch twice")
    for name, values in model.params.items():
        if not name.isidentifier() or "__" in name:
            faults.add(("params", name), "param names must be identifiers without '__'")
        if not values:
            faults.add(("params", name), "needs at least one value")
        if len(set(map(repr, values))) != len(values):
            faults.add(("params", name), f"lists a value twice: {values}")
    if ARCH_NAME in model.params:
        faults.add(
            ("params", ARCH_NAME), f"{ARCH_NAME!r} is the target arch constraints read; rename the param"
        )
    params = list(model.params)
    templates = _validate_args(model, faults)
    constraints = [
        e
        for i, c in enumerate(model.constraints)
        # a table that could not be read is a fault already: naming it is none of its own
        if (e := table_constraint(faults, ("constraints", i), c, [*params, ARCH_NAME, *model.tables], tables))
    ]
    runtime = [a.name for a in templates if a.kind not in ("ptr", "tensor")] + list(
        spec_symbols(templates, params)
    )
    return tuple(templates), _validate_launch(model.launch, params, runtime, faults), constraints


def _validate_args(model: _SpecModel, faults: Faults) -> list[ArgTemplate]:
    """Every argument as a template; a tensor's strides resolved and its dynamic modes decided."""
    params = list(model.params)
    arg_names = [a.name for a in model.args]
    templates: list[ArgTemplate] = []
    for i, arg in enumerate(model.args):
        where = ("args", i)
        if not arg.name.isidentifier() or "__" in arg.name:
            faults.add((*where, "name"), f"must be an identifier without '__' (got {arg.name!r})")
        if arg_names.count(arg.name) > 1:
            faults.add((*where, "name"), f"argument {arg.name!r} is declared twice")
        if arg.name in model.params:
            faults.add((*where, "name"), f"argument {arg.name!r} has the name of a param")
        shape = tuple(str(d) for d in arg.shape) if arg.shape is not None else None
        if arg.kind == "tensor":
            if shape is None:
                faults.add(where, "a tensor needs a shape (one entry per mode)")
                continue
            try:
                template = tensor_template(
                    arg.name,
                    arg.dtype,
                    arg.align,
                    arg.intent,
                    shape,
                    arg.stride if arg.stride is not None else "row_major",
                    arg.dynamic or (),
                    arg.divisibility or {},
                    (arg.shape_bits or 32, arg.stride_bits or 64),
                    params,
                )
            except ArgError as exc:
                faults.add((*where, exc.field), exc.reason)
                continue
        else:
            extra = [
                f
                for f in ("stride", "dynamic", "divisibility", "shape_bits", "stride_bits")
                if getattr(arg, f) is not None
            ]
            if extra:
                faults.add(
                    (*where, extra[0]),
                    f"only a tensor argument takes {', '.join(extra)} (this one is {arg.kind})",
                )
            template = ArgTemplate(arg.name, arg.kind, arg.dtype, arg.align, arg.intent, shape)
        check_arg(template, where, model.params, faults)
        templates.append(template)
    symbols = spec_symbols(templates, params)
    memory = {a.name for a in templates if a.kind in ("ptr", "tensor")}
    for arg in templates:
        for part in ("shape", "stride"):
            for d, entry in enumerate(getattr(arg, part) or ()):
                if entry.strip() in memory:
                    where = ("args", arg_names.index(arg.name), part, d)
                    faults.add(
                        where,
                        f"{entry.strip()!r} is the name of a pointer or tensor argument, not a size: use a symbol or a scalar",
                    )
    known = params + [a.name for a in templates if a.kind not in ("ptr", "tensor")] + list(symbols)
    for arg in templates:
        where = ("args", arg_names.index(arg.name))
        for d, dim in enumerate(arg.shape or ()):
            faults.expr((*where, "shape", d), dim, known)
        for d, entry in enumerate(arg.stride or ()):
            faults.expr((*where, "stride", d), entry, [*known, f"{arg.name}__stride{d}"])
        for name, _ in arg.divisibility:
            if symbols.get(name) != arg.name:
                bound = f"argument {symbols[name]!r} binds it" if name in symbols else "it is not a symbol"
                faults.add(
                    (*where, "divisibility", name),
                    f"{name!r}: declare a symbol's divisibility where it is bound ({bound})",
                )
    return templates


def _validate_launch(
    launch: _LaunchModel, params: list[str], runtime: list[str], faults: Faults
) -> Geometry | None:
    """The launch geometry, its ``let`` names readable by what follows them; None on faults."""
    static_lets: list[str] = []  # lets over params alone, which block, smem and cluster may read
    lets: list[tuple[str, Expr]] = []
    for name, source in launch.let.items():
        where = ("launch", "let", name)
        if not name.isidentifier() or "__" in name or name in params or name in runtime:
            faults.add(where, f"{name!r} must be a new identifier (not a param, argument or symbol)")
            continue
        expr = faults.expr(where, source, [*params, *runtime, *(n for n, _ in lets)])
        if expr is not None:
            if not (expr.names - set(params) - set(static_lets)):
                static_lets.append(name)
            lets.append((name, expr))
    dynamic = [*params, *runtime, *(n for n, _ in lets)]
    static = [*params, *static_lets]

    def dims(field: str, values: list[Any] | None, allowed: list[str]) -> list[Expr | None] | None:
        if values is None:
            return None
        return [faults.expr(("launch", field, i), v, allowed) for i, v in enumerate(values)]

    grid, block, cluster = (
        dims("grid", launch.grid, dynamic),
        dims("block", launch.block, static),
        dims("cluster", launch.cluster, static),
    )
    smem = faults.expr(("launch", "smem"), launch.smem, static) if launch.smem is not None else None
    requires = [faults.expr(("launch", "requires", i), r, dynamic) for i, r in enumerate(launch.requires)]
    parts = [*(grid or ()), *(block or ()), *(cluster or ()), *requires]
    if None in parts or (launch.smem is not None and smem is None) or len(lets) != len(launch.let):
        return None
    return Geometry(
        tuple(grid) if grid else None,  # type: ignore[arg-type]
        tuple(block) if block else None,  # type: ignore[arg-type]
        smem,
        tuple(cluster) if cluster else None,  # type: ignore[arg-type]
        tuple(requires),  # type: ignore[arg-type]
        tuple(lets),
    )


def _entry_values(
    section: str, raw: Mapping[str, Any], params: list[str], faults: Faults
) -> tuple[tuple[str, EntryValue], ...]:
    """``init`` or ``constexpr`` as values: expressions over the params, literals, tuples."""

    def value(item: Any, where: tuple[Any, ...]) -> EntryValue | None:
        if isinstance(item, bool | int):
            return item
        if isinstance(item, str):
            return faults.expr(where, item, params)
        if isinstance(item, list):
            parts = [value(v, (*where, j)) for j, v in enumerate(item)]
            return None if any(p is None for p in parts) else tuple(parts)  # type: ignore[misc]
        faults.add(where, f"must be an int, a bool, an expression string or a list (got {item!r})")
        return None

    out = []
    for name, item in raw.items():
        if not name.isidentifier():
            faults.add((section, name), f"must be a keyword argument name (got {name!r})")
            continue
        parsed = value(item, (section, name))
        if parsed is not None:
            out.append((name, parsed))
    return tuple(out)


def load_spec(path: str | Path) -> Spec:
    """Load and validate one spec file. Raises :class:`SpecError` listing every fault."""
    path = Path(path)
    text = read_text(path)
    data, lines = compose(text, path)
    faults = Faults(lines)
    if not isinstance(data, dict):
        raise SpecError(path, [SpecFault(1, "", "a spec must be a YAML mapping")])
    try:
        model = _SpecModel.model_validate(data)
    except ValidationError as exc:
        pydantic_faults(exc, faults)
        raise SpecError(path, faults.items) from None
    tables = {name: (t.file, tuple(t.columns)) for name, t in model.tables.items()}
    literals = read_tables(path, tables, model.params, [ARCH_NAME], faults)
    args, geometry, constraints = _validate(model, faults, literals)
    params = list(model.params)
    init = _entry_values("init", model.init, params, faults) if model.init is not None else None
    constexpr = _entry_values("constexpr", model.constexpr, params, faults)
    if faults.items or geometry is None:
        raise SpecError(path, faults.items)
    spec = Spec(
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
        init=init,
        constexpr=constexpr,
    )
    runtime = (*spec.scalar_names, *spec.symbols)
    check_expressions(spec.params, spec.archs[0], runtime, geometry, spec.constraints, faults)
    if faults.items:
        raise SpecError(path, faults.items)
    return spec


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
