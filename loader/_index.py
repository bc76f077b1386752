"""Read a SQLite registry with the stdlib, read-only: the variant index and artifact bytes.

The schema is defined by the registry's SQLAlchemy models; this module reads the few columns
a serving process needs and checks the schema version first, so a registry written by newer
or older code fails here with a clear message instead of a confusing SQL error.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from b12x_aot.contract import (
    Arg,
    Expr,
    Geometry,
    InputWord,
    KernelParam,
    StaticGeometry,
    VariantId,
    default_params,
    input_words,
    params_from_json,
    symbol_bindings,
    variant_label,
)

from .errors import IntegrityError, LaunchArgumentError, RegistryFormatError

__all__ = ["READABLE_SCHEMA", "IndexEntry", "RegistryIndex", "blob_path", "schema_version_of"]

# The registry schema versions this loader reads. The registry package's SCHEMA_VERSION must
# be among them; a test keeps the two in step.
READABLE_SCHEMA = (1, 2, 3)

_QUERY = """
SELECT c.key, v.family, v.abi, v.arch, v.params_json, v.artifact_sha256,
       k.symbol, k.args_json, k.launch_json, s.path
FROM current_variants AS c
JOIN variants AS v ON v.id = c.variant_id
JOIN kernels AS k ON k.variant_id = v.id
LEFT JOIN specs AS s ON s.hash = v.spec_hash
"""


def blob_path(directory: Path, sha256: str) -> Path:
    """Where a registry with a blob directory keeps the bytes of artifact ``sha256``."""
    return directory / sha256[:2] / sha256


@functools.lru_cache(maxsize=1024)
def _args(text: str) -> tuple[Arg, ...]:
    return tuple(Arg.from_json(a) for a in json.loads(text))


@functools.lru_cache(maxsize=1024)
def _geometry(text: str) -> Geometry:
    return Geometry.from_json(json.loads(text)).expanded()


@functools.lru_cache(maxsize=1024)
def _recorded_params(text: str) -> tuple[KernelParam, ...] | None:
    recorded = json.loads(text).get("params")
    return params_from_json(recorded) if recorded is not None else None


@functools.lru_cache(maxsize=1024)
def _static_names(text: str) -> tuple[str, ...]:
    return tuple(sorted(_geometry(text).static_names()))


@functools.lru_cache(maxsize=4096)
def _static(text: str, values: tuple[Any, ...]) -> StaticGeometry:
    return _geometry(text).bind_static(dict(zip(_static_names(text), values, strict=True)))


class IndexEntry:
    """What the loader knows of one variant before loading it.

    Opening a registry reads every row but parses a row's params, arguments and launch
    geometry only when something asks for them, and parses each distinct argument list and
    geometry once: a registry of a thousand variants shares a handful of them.
    """

    __slots__ = (
        "_args_json",
        "_launch_json",
        "_params",
        "_params_json",
        "abi",
        "arch",
        "artifact_sha256",
        "family",
        "key",
        "spec_path",
        "symbol",
    )

    def __init__(self, row: tuple[Any, ...]) -> None:
        (
            self.key,
            self.family,
            abi,
            self.arch,
            self._params_json,
            self.artifact_sha256,
            self.symbol,
            self._args_json,
            self._launch_json,
            self.spec_path,
        ) = row
        self.abi = int(abi)
        self._params: Mapping[str, Any] | None = None

    @classmethod
    def of(
        cls, variant: VariantId, artifact_sha256: str, symbol: str, args_json: str, launch_json: str
    ) -> IndexEntry:
        """An entry for a variant read elsewhere than the loader's own query (the audits)."""
        return cls(
            (
                variant.key,
                variant.family,
                variant.abi,
                variant.arch,
                json.dumps(dict(variant.params)),
                artifact_sha256,
                symbol,
                args_json,
                launch_json,
                None,
            )
        )

    @property
    def params(self) -> Mapping[str, Any]:
        if self._params is None:
            self._params = json.loads(self._params_json)
        return self._params

    @property
    def variant(self) -> VariantId:
        return VariantId(self.family, self.abi, self.arch, self.params, self.key)

    @property
    def label(self) -> str:
        return variant_label(self.family, self.params, self.arch)

    @property
    def args(self) -> tuple[Arg, ...]:
        return _args(self._args_json)

    @property
    def geometry(self) -> Geometry:
        """The recorded launch geometry, its ``let`` names substituted."""
        return _geometry(self._launch_json)

    @property
    def input_words(self) -> tuple[InputWord, ...]:
        """The words a call's arguments supply (see ``contract/_params``)."""
        return input_words(self.args, self.params)

    @property
    def kernel_params(self) -> tuple[KernelParam, ...]:
        """The kernel's parameters: recorded where the host function derives them, else one per
        argument as given."""
        recorded = _recorded_params(self._launch_json)
        return recorded if recorded is not None else default_params(self.args, self.params)

    @property
    def static(self) -> StaticGeometry:
        """Block, shared memory and cluster, shared by every variant with the same values."""
        params = self.params
        return _static(self._launch_json, tuple(params.get(n) for n in _static_names(self._launch_json)))

    def shapes(self, **values: int) -> dict[str, tuple[int, ...]]:
        """Each pointer or tensor argument's shape, from the spec, for these runtime values: the
        scalar arguments, and the symbols tensors bind (``shape: [m, k]``) that the shapes read.

        Callers allocate outputs and scratch from it rather than copying a formula. Arguments
        the spec gives no shape are left out. Raises :class:`LaunchArgumentError` naming a
        value that is missing, unknown, or gives a negative dimension.
        """
        shaped = [(a, [Expr.parse(d) for d in a.shape]) for a in self.args if a.addresses_memory and a.shape]
        known = {a.name for a in self.args if a.is_scalar} | set(symbol_bindings(self.args, self.params))
        needed = set().union(*(e.names for _, dims in shaped for e in dims)) & known
        for name, value in values.items():
            if value.__class__ is not int:
                raise LaunchArgumentError(self.label, name, "must be an int for shapes()", repr(value))
        if needed - values.keys() or values.keys() - known:
            raise LaunchArgumentError(
                self.label,
                "*",
                f"shapes() takes the values {', '.join(sorted(needed)) or '(none)'}",
                ", ".join(sorted(values)) or "none",
            )
        env = {**self.params, **values}
        out = {a.name: tuple(int(e.evaluate(env)) for e in dims) for a, dims in shaped}
        for name, shape in out.items():
            if any(d < 0 for d in shape):
                raise LaunchArgumentError(
                    self.label, name, "has a negative dimension for these values", shape
                )
        return out

    def __repr__(self) -> str:
        return f"<IndexEntry {self.family} {self.arch} {self.key[:12]}>"


def schema_version_of(value: str | None, registry: str) -> int:
    """The integer in a registry's ``schema_version`` meta row. Raises
    :class:`RegistryFormatError` for a missing or garbled one (no b12x-aot wrote it whole)."""
    fix = (
        "Give a registry that b12x-compile built or b12x-registry export wrote, or rebuild this "
        "one with `b12x-compile specs/ --registry NEW`."
    )
    if value is None:
        raise RegistryFormatError(
            f"{registry} is not a b12x-aot registry: its meta table has no schema_version. {fix}"
        )
    try:
        return int(value)
    except ValueError:
        raise RegistryFormatError(
            f"{registry} is not a b12x-aot registry: its schema_version {value!r} is not an integer. {fix}"
        ) from None


# What the loader reads. Every table is checked with quick_check when the registry opens but
# an artifacts table that holds the cubins' bytes (reading it all would cost what loading every
# variant does): there each blob is hashed when it is read.
_TABLES = ("meta", "current_variants", "variants", "kernels", "specs")


def _damaged(path: Path, what: str) -> RegistryFormatError:
    return RegistryFormatError(
        f"registry {path} is damaged ({what}). See what is lost with `b12x-registry verify -r {path}`, "
        "then restore the file from a copy, rebuild it with b12x-compile or export it again."
    )


def _unreadable(path: Path, exc: sqlite3.DatabaseError) -> RegistryFormatError:
    """Why SQLite refused ``path``, and what to do about it."""
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_CORRUPT:
        return _damaged(path, str(exc))
    with path.open("rb") as f:
        header = f.read(20)
    # Bytes 18-19 are 2 in a write-ahead-log database: reading one needs a -shm file beside it,
    # which a read-only directory (a baked image, another user's build) does not allow.
    if (
        isinstance(exc, sqlite3.OperationalError)
        and header[:16] == b"SQLite format 3\0"
        and header[18:20] == b"\2\2"
    ):
        return RegistryFormatError(
            f"cannot read {path} ({exc}): it is a write-ahead-log database, and SQLite reads one "
            f"only where it may create {path.name}-shm beside it. Serve a file from "
            "`b12x-registry export` (written without a log), give this process write access to "
            f"{path.parent}, or open it with Registry.open(path, immutable=True) if nothing writes it."
        )
    return RegistryFormatError(
        f"{path} is not a b12x-aot registry ({exc}). Point the loader at a file written by "
        "b12x-compile or b12x-registry export."
    )


def _check_path(path: Path) -> None:
    if path.is_dir():
        raise RegistryFormatError(
            f"registry {path} is a directory, not a registry file; give the path of the registry "
            "file (the --registry that b12x-compile wrote, or an export)."
        )
    if not path.is_file():
        raise RegistryFormatError(
            f"registry {path} does not exist. Build one with "
            f"`b12x-compile specs/ --registry {path}` or export one with "
            "`b12x-registry export`."
        )


class RegistryIndex:
    """An open, read-only registry file: its variant index and a way to read blobs."""

    def __init__(self, path: str | Path, *, immutable: bool = False) -> None:
        self.path = Path(path)
        _check_path(self.path)
        mode = "ro&immutable=1" if immutable else "ro"
        uri = f"{self.path.resolve().as_uri()}?mode={mode}"
        try:
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False)
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise _unreadable(self.path, exc) from None
        try:
            version = schema_version_of(meta.get("schema_version"), str(self.path))
            if version not in READABLE_SCHEMA:
                newer = version > max(READABLE_SCHEMA)
                raise RegistryFormatError(
                    f"{self.path} has registry schema {version}; this loader reads "
                    f"{', '.join(map(str, READABLE_SCHEMA))}. "
                    + (
                        "Upgrade b12x-aot in the serving image."
                        if newer
                        else f"Run `b12x-registry migrate --registry {self.path}`."
                    )
                )
            self.entries = self._read_entries(inline_blobs=not meta.get("blob_dir"))
        except BaseException:
            self._db.close()
            raise
        blob_dir = meta.get("blob_dir")
        self._blob_dir = (self.path.parent / blob_dir) if blob_dir else None

    def _read_entries(self, inline_blobs: bool) -> dict[str, IndexEntry]:
        """Every current variant, once the tables are whole (``inline_blobs``: but artifacts)."""
        try:
            present = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            missing = [t for t in _TABLES if t not in present]
            if missing:
                raise RegistryFormatError(
                    f"{self.path} is not a whole b12x-aot registry: it lacks the tables "
                    f"{', '.join(missing)}. Point the loader at a file written by b12x-compile or "
                    "b12x-registry export."
                )
            checked = present - ({"artifacts"} if inline_blobs else set())
            for table in sorted(checked):
                found = [str(r[0]) for r in self._db.execute(f'PRAGMA quick_check("{table}")')]
                if found != ["ok"]:
                    raise _damaged(self.path, f"{table}: {' '.join(' '.join(found[:3]).split())}")
            entries = {row[0]: IndexEntry(row) for row in self._db.execute(_QUERY)}
            (current,) = self._db.execute("SELECT count(*) FROM current_variants").fetchone()
        except sqlite3.DatabaseError as exc:
            raise _unreadable(self.path, exc) from None
        if current != len(entries):
            # A current variant whose variants or kernels row is gone: serving on would turn it
            # into a miss that tells the user to build what the registry says it has.
            lost = [k for (k,) in self._db.execute("SELECT key FROM current_variants") if k not in entries]
            raise _damaged(
                self.path,
                f"{len(lost)} current variant(s) lost their variants or kernels row: "
                + ", ".join(k[:16] for k in lost[:5]),
            )
        return entries

    def read_artifact(self, entry: IndexEntry) -> bytes:
        """The artifact's bytes, verified against its sha256 before anyone sees them."""
        return self.read_artifacts([entry])[entry.artifact_sha256]

    def read_artifacts(self, entries: list[IndexEntry]) -> dict[str, bytes]:
        """sha256 -> verified bytes for the entries' artifacts, in a few batched queries."""
        import hashlib  # here, not at import: OpenSSL's load is a third of the import budget

        wanted = {e.artifact_sha256: e for e in entries}
        shas = list(wanted)
        rows: dict[str, Any] = {}
        for i in range(0, len(shas), 500):
            chunk = shas[i : i + 500]
            marks = ",".join("?" * len(chunk))
            try:
                rows.update(
                    self._db.execute(f"SELECT sha256, data FROM artifacts WHERE sha256 IN ({marks})", chunk)
                )
            except sqlite3.DatabaseError as exc:
                raise _unreadable(self.path, exc) from None
        out: dict[str, bytes] = {}
        for sha, entry in wanted.items():
            if sha not in rows:
                raise RegistryFormatError(
                    f"{self.path}: artifact {sha[:16]} of variant {entry.key[:16]} is missing. "
                    "Run `b12x-registry verify` and rebuild with b12x-compile."
                )
            data = rows[sha]
            data = bytes(data) if data is not None else self._blob_file(sha)
            actual = hashlib.sha256(data).hexdigest()
            if actual != sha:
                raise IntegrityError(entry.key, sha, actual)
            out[sha] = data
        return out

    def _blob_file(self, sha: str) -> bytes:
        if self._blob_dir is None:
            raise RegistryFormatError(f"{self.path}: artifact {sha[:16]} has no bytes")
        blob = blob_path(self._blob_dir, sha)
        try:
            return blob.read_bytes()
        except OSError as exc:
            raise RegistryFormatError(
                f"{self.path}: blob {blob} is unreadable ({exc.strerror}); the blob directory "
                "must travel with the registry, or export a self-contained file."
            ) from None

    def close(self) -> None:
        self._db.close()
