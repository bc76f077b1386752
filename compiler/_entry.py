"""A spec's kernel entry as its author wrote it: a ``@cute.jit`` function or a class.

The entry ``package.module:name`` is one of

- a *registry kernel class* (an ``AotKernel``): built as ``Kernel(geometry, static, **params)``;
- a *class* whose ``__call__`` is ``@cute.jit``: built with the spec's ``init`` keywords (its
  own constructor's arguments: ints, strings, tuples, DSL numeric types), then called;
- a ``@cute.jit`` *function*.

In each case the jit callable takes the spec's arguments in order (``cute.Tensor``,
``cute.Pointer``, DSL scalars), optionally a ``cuda.CUstream``, and the spec's ``constexpr``
keywords (``cutlass.Constexpr`` parameters; others keep their defaults). :func:`check_entry`
holds the entry to that before anything compiles; :func:`prepare_entry` builds the callable,
its placeholder arguments and their input words for one variant. Both import the DSL.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from b12x_aot.contract import Arg, Geometry, StaticGeometry, input_words, symbol_bindings

from ._host_frame import HostInput
from ._spec import Spec, entry_value
from ._spec_args import static_extent
from .errors import EntryError

__all__ = ["Entry", "PreparedEntry", "check_entry", "load_entry", "prepare_entry"]

_SCALAR_TYPES = {
    "i32": "Int32",
    "u32": "Uint32",
    "i64": "Int64",
    "u64": "Uint64",
    "f32": "Float32",
    "f64": "Float64",
}


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of the jit callable (``self`` left out)."""

    name: str
    annotation: Any
    has_default: bool
    default: Any
    constexpr: bool
    stream: bool


@dataclass(frozen=True, slots=True)
class Entry:
    """A resolved kernel entry: the object, its kind, and the jit callable's parameters."""

    name: str
    obj: Any
    kind: str  # "registry", "class" or "function"
    params: tuple[Param, ...]

    @property
    def runtime(self) -> tuple[Param, ...]:
        """The parameters the spec's arguments fill, in order (no Constexpr, no stream)."""
        return tuple(p for p in self.params if not p.constexpr and not p.stream)

    @property
    def takes_stream(self) -> bool:
        return any(p.stream for p in self.params)


def _unwrap(func: Any) -> Any:
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return func


def _is_jit(func: Any) -> bool:
    return (
        getattr(func, "_decorator_kind", None) == "jit"
        or getattr(_unwrap(func), "_decorator_kind", None) == "jit"
    )


def _is_constexpr(annotation: Any) -> bool:
    import cutlass

    if isinstance(annotation, str):
        return "Constexpr" in annotation
    return annotation is cutlass.Constexpr or typing.get_origin(annotation) is cutlass.Constexpr


def _is_stream(param: inspect.Parameter) -> bool:
    import cuda.bindings.driver as cuda

    annotation = param.annotation
    return (
        annotation is cuda.CUstream
        or (isinstance(annotation, str) and "CUstream" in annotation)
        or (annotation is inspect.Parameter.empty and param.name == "stream")
    )


def _parameters(func: Any, skip_self: bool) -> tuple[Param, ...]:
    try:
        signature = inspect.signature(_unwrap(func), eval_str=True)
    except Exception:  # annotations that do not evaluate here: read them as written
        signature = inspect.signature(_unwrap(func))
    out = []
    for i, p in enumerate(signature.parameters.values()):
        if skip_self and i == 0:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise EntryError(f"its jit function takes *{p.name}; name every argument the spec passes")
        out.append(
            Param(
                p.name,
                p.annotation,
                p.default is not p.empty,
                p.default,
                _is_constexpr(p.annotation),
                _is_stream(p),
            )
        )
    return tuple(out)


def load_entry(kernel: str) -> Entry:
    """Import ``package.module:name`` and say what kind of entry it is. Raises
    :class:`EntryError` for an object that is not a jit function or a class with a jit call."""
    module_name, _, name = kernel.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EntryError(
            f"cannot import {module_name} ({exc}); install its package or put it on PYTHONPATH"
        ) from None
    if not hasattr(module, name):
        raise EntryError(f"module {module_name} has no {name!r}")
    obj = getattr(module, name)
    from b12x_aot.kernels import AotKernel

    if inspect.isclass(obj):
        call = getattr(obj, "__call__", None)  # noqa: B004 (the attribute, not callability)
        if call is None or not _is_jit(call):
            raise EntryError(f"{kernel} is a class whose __call__ is not decorated with @cute.jit")
        kind = "registry" if issubclass(obj, AotKernel) else "class"
        return Entry(kernel, obj, kind, _parameters(call, skip_self=True))
    if inspect.isfunction(obj) or callable(obj):
        if getattr(_unwrap(obj), "_decorator_kind", None) == "kernel":
            raise EntryError(f"{kernel} is a @cute.kernel; name the @cute.jit host function that launches it")
        if not _is_jit(obj):
            raise EntryError(f"{kernel} is not decorated with @cute.jit")
        return Entry(kernel, obj, "function", _parameters(obj, skip_self=False))
    raise EntryError(f"{kernel} is a {type(obj).__name__}, not a @cute.jit function or a class")


def _kind_fault(param: Param, arg: Any) -> str | None:
    """Why the spec argument's kind cannot fill this parameter, judged by its annotation."""
    import cutlass.cute as cute

    annotation = param.annotation
    if annotation is inspect.Parameter.empty or isinstance(annotation, str):
        return None
    if arg.kind == "tensor":
        ok = annotation is cute.Tensor
    elif arg.kind == "ptr":
        ok = annotation is cute.Pointer
    else:
        ok = getattr(annotation, "__name__", None) == _SCALAR_TYPES[arg.kind]
    if ok:
        return None
    return (
        f"argument {arg.name!r} is {arg.kind} in the spec, but parameter {param.name!r} of the kernel "
        f"is annotated {getattr(annotation, '__name__', annotation)}"
    )


def check_entry(spec: Spec, entry: Entry) -> list[str]:
    """Every way the entry and the spec disagree, in the spec's terms (empty when they agree)."""
    faults: list[str] = []
    if entry.kind == "registry" and spec.init is not None:
        faults.append(f"{entry.name} is a registry kernel (built from the params); drop the spec's init")
    if entry.kind == "function" and spec.init is not None:
        faults.append(f"{entry.name} is a function; init is for a class's constructor (use constexpr)")
    if entry.kind == "registry" and spec.geometry.block is None:
        faults.append(f"{entry.name} launches with the spec's geometry: declare launch.block")
    if entry.kind == "registry" and spec.geometry.grid is None:
        faults.append(f"{entry.name} launches with the spec's geometry: declare launch.grid")
    if entry.kind == "class" and spec.init is not None:
        try:
            inspect.signature(entry.obj).bind(**dict(spec.init))
        except TypeError as exc:
            faults.append(f"init does not fit {entry.name}'s constructor: {exc}")
    by_name = {p.name: p for p in entry.params}
    for name, _ in spec.constexpr:
        if name not in by_name:
            faults.append(f"constexpr {name!r}: {entry.name}'s jit function has no such parameter")
        elif not by_name[name].constexpr:
            faults.append(f"constexpr {name!r}: parameter {name!r} is not annotated cutlass.Constexpr")
    given = {name for name, _ in spec.constexpr}
    for p in entry.params:
        if p.constexpr and not p.has_default and p.name not in given:
            faults.append(
                f"parameter {p.name!r} is a Constexpr with no default: give it in the spec's constexpr"
            )
    runtime = entry.runtime
    for i, arg in enumerate(spec.args):
        if i >= len(runtime):
            names = ", ".join(a.name for a in spec.args[len(runtime) :])
            faults.append(
                f"the spec's argument {arg.name!r} (and any after it: {names}) has no parameter in "
                f"{entry.name}, which takes ({', '.join(p.name for p in runtime)})"
            )
            break
        fault = _kind_fault(runtime[i], arg)
        if fault is not None:
            faults.append(fault)
    stream = next((i for i, p in enumerate(entry.params) if p.stream), None)
    for p in runtime[len(spec.args) :]:
        if stream is not None and entry.params.index(p) < stream:
            faults.append(
                f"parameter {p.name!r} of {entry.name} comes before its stream parameter but has no spec "
                "argument: declare it in the spec's args"
            )
        elif not p.has_default:
            faults.append(
                f"parameter {p.name!r} of {entry.name} has no spec argument (the spec declares {len(spec.args)})"
            )
    return faults


@dataclass(frozen=True, slots=True)
class PreparedEntry:
    """What ``cute.compile`` is called with for one variant, and what its host function's
    arguments are, word by word, for reading its launch."""

    callable: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    inputs: tuple[HostInput, ...]
    strict: bool  # a registry kernel: its parameters must be the spec's arguments as given


def _dsl_functions() -> dict[str, Any]:
    from b12x_aot.kernels import dsl_dtype

    return {"dtype": dsl_dtype}


def _placeholder(
    arg: Arg, params: Mapping[str, Any], symbols: dict[tuple[str, int], Any], divisibility: Mapping[str, int]
) -> Any:
    """A compile-time stand-in for one argument: a fake tensor of its layout, a pointer, a scalar.
    A symbol is one ``SymInt`` per width wherever it appears; any other dynamic entry its own."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor, make_ptr

    from b12x_aot.kernels import DSL_SCALARS, dsl_dtype

    if arg.is_scalar:
        return DSL_SCALARS[arg.kind](0)
    dtype = dsl_dtype(arg.dtype)  # type: ignore[arg-type]
    if arg.is_pointer:
        return make_ptr(dtype, arg.align, cute.AddressSpace.gmem, assumed_align=arg.align)

    def sym(bits: int, divisor: int) -> Any:
        return (cute.sym_int32 if bits == 32 else cute.sym_int64)(divisibility=divisor)

    def entries(values: Sequence[str], dynamic: Sequence[int], bits: int) -> tuple[Any, ...]:
        out: list[Any] = []
        for mode, entry in enumerate(values):
            name = entry.strip()
            if mode not in dynamic:
                out.append(static_extent(entry, params))
            elif (name, bits) in symbols:
                out.append(symbols[(name, bits)])
            else:
                out.append(sym(bits, divisibility.get(name, 1)))
        return tuple(out)

    shape = entries(arg.shape or (), arg.dynamic, arg.shape_bits)
    stride = entries(arg.stride or (), arg.dynamic_stride, arg.stride_bits)
    return make_fake_tensor(dtype, shape, stride, assumed_align=arg.align)


def prepare_entry(
    spec_kernel: str,
    init: Sequence[tuple[str, Any]] | None,
    constexpr: Sequence[tuple[str, Any]],
    args: Sequence[Arg],
    geometry: Geometry,
    static: StaticGeometry,
    params: Mapping[str, Any],
) -> PreparedEntry:
    """The callable, placeholders and keywords that compile one variant. Raises
    :class:`EntryError` as :func:`load_entry` does.

    Arguments go positionally in the jit function's parameter order: the spec's arguments into
    its runtime parameters, a stream placeholder where it takes one, and any Constexpr among
    them by value (the spec's, else its default); Constexpr parameters after the last of
    those are passed by keyword.
    """
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    entry = load_entry(spec_kernel)
    functions = _dsl_functions()
    if entry.kind == "registry":
        target = entry.obj(geometry, static, **params)
    elif entry.kind == "class":
        target = entry.obj(**{k: entry_value(v, params, functions) for k, v in (init or ())})
    else:
        target = entry.obj
    given = {k: entry_value(v, params, functions) for k, v in constexpr}
    divisibility = {name: by for arg in args for name, by in arg.divisibility}
    symbols = {
        (name, bits): (cute.sym_int32 if bits == 32 else cute.sym_int64)(
            divisibility=divisibility.get(name, 1)
        )
        for name in symbol_bindings(args, params)
        for bits in (32, 64)
    }
    words = input_words(args, params)
    runtime = iter(range(len(args)))
    filled = [p for p in entry.params if p.stream or p in entry.runtime[: len(args)]]
    last = entry.params.index(filled[-1]) if filled else -1
    positional: list[Any] = []
    inputs: list[HostInput] = []
    for p in entry.params[: last + 1]:
        if p.constexpr:
            positional.append(given.pop(p.name) if p.name in given else p.default)
        elif p.stream:
            positional.append(cuda.CUstream(0))
            inputs.append(HostInput(("__stream",), (True,)))
        else:
            i = next(runtime)
            positional.append(_placeholder(args[i], params, symbols, divisibility))
            own = [w for w in words if w.arg == i]
            inputs.append(HostInput(tuple(w.name for w in own), tuple(w.nonneg for w in own)))
    return PreparedEntry(target, tuple(positional), given, tuple(inputs), entry.kind == "registry")
