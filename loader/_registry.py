"""The serving-side registry: resolve, verify, load, and hand out prepared launches.

Open once at startup, resolve and preload every variant the process needs, then launch. A
resolve is an in-memory lookup; a load is sha256 verification, ``cuLibraryLoadData`` and
``cuLibraryGetKernel``; per-device function handles come from ``cuKernelGetFunction`` with the
dynamic shared memory limit raised once. Loads and misses refuse to run while the stream is
capturing a CUDA graph, and libraries stay loaded until :meth:`Registry.close`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as cu

from b12x_aot.contract import StaticGeometry, VariantId, canonical_params, params_text, variant_key

from ._cuda import check, current_device, device_arch, ensure_init, stream_is_capturing, torch_stream_getter
from ._index import IndexEntry, RegistryIndex
from ._launch import PreparedLaunch
from .errors import CaptureError, CudaError, Miss, RegistryClosedError, RequirementError, VariantMissError

if TYPE_CHECKING:
    from ._manifest import Manifest

__all__ = ["Kernel", "LoadStats", "Registry"]


class LoadStats:
    """Counters of the loader's work, for tests and startup logs."""

    __slots__ = ("functions", "loads", "misses", "resolves")

    def __init__(self) -> None:
        self.resolves = 0
        self.misses = 0
        self.loads = 0  # cuLibraryLoadData calls
        self.functions = 0  # cuKernelGetFunction calls

    def __repr__(self) -> str:
        return f"LoadStats(resolves={self.resolves}, misses={self.misses}, loads={self.loads}, functions={self.functions})"


def _manifest(manifest: Manifest | Mapping[str, Any]) -> Manifest:
    from ._manifest import Manifest  # only deployments that pass manifests pay for its import

    return manifest if isinstance(manifest, Manifest) else Manifest.from_mapping(manifest)


class Kernel:
    """A loaded variant. Built only by :meth:`Registry.kernel`; launch it via :meth:`prepare`.

    It owns no driver handles: its library and per-device functions belong to the registry,
    which creates them (refusing while a graph is being captured) and unloads them on close.
    """

    __slots__ = ("_registry", "entry")

    def __init__(self, registry: Registry, entry: IndexEntry) -> None:
        self._registry = registry
        self.entry = entry

    @property
    def key(self) -> str:
        return self.entry.key

    @property
    def name(self) -> str:
        return self.entry.label

    @property
    def static(self) -> StaticGeometry:
        return self.entry.static

    @property
    def devices(self) -> tuple[int, ...]:
        """The devices this kernel has a function handle on."""
        return self._registry.devices_of(self)

    def shapes(self, **scalars: int) -> dict[str, tuple[int, ...]]:
        """Every pointer argument's shape for these scalars (see :meth:`IndexEntry.shapes`)."""
        return self.entry.shapes(**scalars)

    def function(self, device: int, *, stream: Any = None) -> Any:
        """The ``CUfunction`` of this kernel on ``device``; see :meth:`Registry.function`."""
        return self._registry.function(self, device, stream=stream)

    def prepare(self, *, device: int | None = None, stream: Any = None) -> PreparedLaunch:
        """Bind this kernel to ``device`` (default: the current one) for fast launches.

        ``stream`` fixes the launch stream; by default each launch uses torch's current
        stream when torch is imported, else the legacy default stream.
        """
        if device is None:
            device = current_device()
        return PreparedLaunch(self.entry, device, self.function(device, stream=stream), stream)

    def __repr__(self) -> str:
        return f"<Kernel {self.name} key={self.key[:12]}>"


class Registry:
    """A registry file opened for serving. Thread-safe; close it (or use ``with``) at exit."""

    def __init__(self, index: RegistryIndex) -> None:
        self._index = index
        self._kernels: dict[str, Kernel] = {}
        self._libraries: dict[str, tuple[Any, Any]] = {}  # key -> (CUlibrary, CUkernel)
        self._functions: dict[tuple[str, int], Any] = {}  # (key, device) -> CUfunction
        self._contexts: dict[int, Any] = {}
        self._arch: dict[int, str] = {}
        self._lock = threading.RLock()
        self._closed = False
        self.stats = LoadStats()
        self._by_family: dict[tuple[str, int, str], dict[str, IndexEntry]] = {}
        for entry in index.entries.values():
            self._by_family.setdefault((entry.family, entry.abi, entry.arch), {})[entry.key] = entry

    @classmethod
    def open(cls, path: str | Path, *, immutable: bool = False) -> Registry:
        """Open a registry file read-only and read its index. Makes no driver call.

        ``immutable=True`` tells SQLite the file cannot change (a baked serving image), which
        skips locking entirely.
        """
        return cls(RegistryIndex(path, immutable=immutable))

    @property
    def path(self) -> Path:
        return self._index.path

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._index.entries)

    def entries(self) -> list[IndexEntry]:
        return list(self._index.entries.values())

    # --- resolution (no driver) ------------------------------------------------------------

    def arch(self, device: int) -> str:
        arch = self._arch.get(device)
        if arch is None:
            arch = self._arch[device] = device_arch(device)
        return arch

    def resolve(self, family: str, abi: int, *, arch: str, **params: Any) -> IndexEntry:
        """Find a variant by family, ABI, arch and params. Raises :class:`VariantMissError`."""
        self.stats.resolves += 1
        key = variant_key(family=family, abi=abi, arch=arch, params=params)
        entry = self._index.entries.get(key)
        if entry is None:
            self.stats.misses += 1
            raise VariantMissError(str(self.path), self._miss(family, abi, arch, params, key))
        return entry

    def holds(self, family: str, abi: int, *, arch: str, **params: Any) -> bool:
        """Whether the registry has this variant: one key lookup, none of a miss's diagnostics
        (for callers that try several variants in order of preference)."""
        return variant_key(family=family, abi=abi, arch=arch, params=params) in self._index.entries

    def _miss(self, family: str, abi: int, arch: str, params: Mapping[str, Any], key: str) -> Miss:
        import difflib  # error path only

        canonical_params(params)
        same = self._by_family.get((family, abi, arch), {})
        spec_path = next((e.spec_path for e in self._index.entries.values() if e.family == family), None)
        hint = ""
        if not same:
            families = sorted({(e.family, e.abi) for e in self._index.entries.values()})
            here = sorted(
                {e.arch for e in self._index.entries.values() if e.family == family and e.abi == abi}
            )
            abis = sorted({e.abi for e in self._index.entries.values() if e.family == family})
            if here:
                hint = f"{family} abi={abi} is built only for {', '.join(here)}"
            elif abis:
                hint = f"{family} is built only at abi {', '.join(map(str, abis))}"
            else:
                shown = ", ".join(f"{f} abi={a}" for f, a in families) or "(none)"
                hint = f"no variant of {family} at all; families present: {shown}"
        else:
            names = set().union(*(e.params.keys() for e in same.values()))
            if names != set(params):
                hint = f"{family} params are {', '.join(sorted(names))} (got {', '.join(sorted(params))})"
        rendered = {k: params_text(e.params) for k, e in same.items()}
        nearest = difflib.get_close_matches(params_text(params), list(rendered.values()), n=3, cutoff=0.0)
        by_text = {v: same[k].params for k, v in rendered.items()}
        return Miss(
            variant=VariantId(family, abi, arch, dict(params), key),
            nearest=tuple(by_text[t] for t in nearest),
            spec_path=spec_path,
            hint=hint,
        )

    # --- loading -----------------------------------------------------------------------------

    def kernel(
        self, family: str, abi: int, *, device: int | None = None, stream: Any = None, **params: Any
    ) -> Kernel:
        """Resolve, verify and load a variant for ``device`` (default: the current device).

        A variant loaded before is returned at once with no driver call, so this is safe inside
        graph capture for preloaded variants. A miss or a first load while ``stream`` (default:
        torch's current stream) is capturing raises :class:`CaptureError` before any driver
        work that could invalidate the capture.
        """
        if device is None:
            device = current_device()
        arch = self.arch(device)
        try:
            entry = self.resolve(family, abi, arch=arch, **params)
        except VariantMissError as miss:
            if self._capturing(device, stream):
                raise CaptureError(f"a registry miss ({miss.miss.describe(str(self.path))})") from miss
            raise
        kernel = self._kernels.get(entry.key)
        if kernel is None or (entry.key, device) not in self._functions:
            (kernel,) = self._load([entry], device, stream)
        return kernel

    def function(self, kernel: Kernel, device: int, *, stream: Any = None) -> Any:
        """The kernel's ``CUfunction`` on ``device``, created once per device.

        Creating one is driver work: it raises :class:`CaptureError` while ``stream`` (default:
        torch's current stream) is capturing a CUDA graph.
        """
        fn = self._functions.get((kernel.key, device))
        if fn is None:
            self._load([kernel.entry], device, stream)
            fn = self._functions[(kernel.key, device)]
        return fn

    def devices_of(self, kernel: Kernel) -> tuple[int, ...]:
        """The devices on which ``kernel`` has a function handle."""
        with self._lock:
            return tuple(sorted(d for k, d in self._functions if k == kernel.key))

    def preload(
        self, manifest: Manifest | Mapping[str, Any], *, devices: Iterable[int] | None = None
    ) -> list[Kernel]:
        """Load every variant a manifest names on each device; report all misses at once."""
        manifest = _manifest(manifest)
        devices = list(devices) if devices is not None else [current_device()]
        kernels: list[Kernel] = []
        for device in devices:
            kernels.extend(self._load(self._require(manifest, device), device, None))
        return kernels

    def require(self, manifest: Manifest | Mapping[str, Any], *, device: int | None = None) -> None:
        """Check that every variant the manifest names exists for the device's arch.

        Loads nothing. Raises :class:`RequirementError` listing every missing variant, each
        with its nearest neighbours and the command that builds it.
        """
        self._require(_manifest(manifest), current_device() if device is None else device)

    def _require(self, manifest: Manifest, device: int) -> list[IndexEntry]:
        """Every entry the manifest names for the device's arch, or one error listing all misses."""
        arch = self.arch(device)
        found: list[IndexEntry] = []
        misses: list[Miss] = []
        for req in manifest.requirements:
            if req.archs is not None and arch not in req.archs:
                continue
            for params in req.combinations():
                try:
                    found.append(self.resolve(req.family, req.abi, arch=arch, **params))
                except VariantMissError as err:
                    misses.append(err.miss)
        if misses:
            raise RequirementError(str(self.path), misses)
        return found

    def _capturing(self, device: int, stream: Any) -> bool:
        if stream is None:
            torch = sys.modules.get("torch")
            raw_stream = torch_stream_getter()
            if raw_stream is None or not torch.cuda.is_initialized():
                return False
            stream = raw_stream(device)
        return stream_is_capturing(int(stream))

    def _load(self, entries: list[IndexEntry], device: int, stream: Any) -> list[Kernel]:
        """Load what is not loaded yet and create the device's functions, in one batch.

        Refuses (before any driver call) while ``stream`` is capturing and work remains.
        """
        with self._lock:
            self._ensure_open()
            entries = list({e.key: e for e in entries}.values())  # a manifest may name one twice
            todo = [e for e in entries if e.key not in self._kernels]
            missing_fn = [
                e for e in entries if e.key in self._kernels and (e.key, device) not in self._functions
            ]
            if (todo or missing_fn) and self._capturing(device, stream):
                first = (todo or missing_fn)[0]
                what = "loading" if todo else f"creating the device-{device} function of"
                raise CaptureError(f"{what} {first.family} variant {first.key[:16]}")
            if todo:
                blobs = self._index.read_artifacts(todo)
                ensure_init()
                for entry in todo:
                    variant = f"{entry.label} ({entry.key[:16]})"
                    library = check(
                        cu.cuLibraryLoadData(blobs[entry.artifact_sha256], None, None, 0, None, None, 0),
                        f"cuLibraryLoadData of {variant}",
                    )
                    self.stats.loads += 1
                    try:
                        handle = check(
                            cu.cuLibraryGetKernel(library, entry.symbol.encode()),
                            f"cuLibraryGetKernel({entry.symbol}) of {variant}",
                        )
                    except BaseException:
                        cu.cuLibraryUnload(library)  # not recorded yet: close() would miss it
                        raise
                    self._libraries[entry.key] = (library, handle)
                    self._kernels[entry.key] = Kernel(self, entry)
            self._make_functions([e for e in entries if (e.key, device) not in self._functions], device)
            return [self._kernels[e.key] for e in entries]

    def _context(self, device: int) -> Any:
        ctx = self._contexts.get(device)
        if ctx is None:
            dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
            ctx = self._contexts[device] = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        return ctx

    def _make_functions(self, entries: list[IndexEntry], device: int) -> None:
        """Per-device function handles, with the dynamic shared memory limit raised once."""
        if not entries:
            return
        check(cu.cuCtxPushCurrent(self._context(device)), "cuCtxPushCurrent")
        try:
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            for entry in entries:
                fn = check(cu.cuKernelGetFunction(self._libraries[entry.key][1]), "cuKernelGetFunction")
                self.stats.functions += 1
                if entry.static.smem > 0:
                    check(cu.cuFuncSetAttribute(fn, attr, entry.static.smem), "cuFuncSetAttribute")
                self._functions[(entry.key, device)] = fn
        finally:
            check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def close(self) -> None:
        """Unload every library and release the primary contexts this registry retained.

        Every release is attempted even when one fails, and the first failure is raised after
        them. Closing twice is harmless; loading after closing raises
        :class:`RegistryClosedError`.
        """
        with self._lock:
            failures: list[CudaError] = []
            for key, (library, _) in self._libraries.items():
                try:
                    check(cu.cuLibraryUnload(library), f"cuLibraryUnload of variant {key[:16]}")
                except CudaError as exc:
                    failures.append(exc)
            for device in self._contexts:
                try:
                    dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
                    check(cu.cuDevicePrimaryCtxRelease(dev), f"cuDevicePrimaryCtxRelease of device {device}")
                except CudaError as exc:
                    failures.append(exc)
            self._libraries.clear()
            self._functions.clear()
            self._kernels.clear()
            self._contexts.clear()
            self._index.close()
            self._closed = True
            if failures:
                raise failures[0]

    def _ensure_open(self) -> None:
        if self._closed:
            raise RegistryClosedError(str(self.path))
