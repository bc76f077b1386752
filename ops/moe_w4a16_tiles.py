"""The ``moe.w4a16`` op's tile table: the tiles each batch regime tries, best first, and the
thresholds between the regimes, read from ``moe_w4a16_tiles.yaml`` beside this module.

That file is the one declaration of the tiles: ``specs/moe_w4a16.yaml`` builds from it too
(its ``tables:``), so the op only ever asks for tiles the spec builds. :func:`shipped_tiles`
reads it once; a :class:`W4A16Tiles` of another file (a table tuned for another GPU) can be
given to the op instead. No torch here: the choice is plain arithmetic on the batch's shape.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from b12x_aot.contract import short_repr

from .errors import TileTableError

__all__ = ["SHIPPED", "Tile", "W4A16Tiles", "riding_share", "shipped_tiles", "touched_experts"]

SHIPPED = Path(__file__).with_name("moe_w4a16_tiles.yaml")

Tile = tuple[Any, ...]  # one value per name of W4A16Tiles.params

_KEYS = ("params", "tiles", "decode_bands", "tail_share", "decode_tokens", "prefill_tokens", "route_pack")


@dataclass(frozen=True, slots=True)
class W4A16Tiles:
    """Tiles by regime, best first, and where each regime starts.

    ``params`` names a tile's values; ``regimes`` maps each regime to its tiles. A decode
    batch (at most ``decode_tokens`` tokens) takes the first of ``decode_bands`` whose bound
    its 128-wide tiles per SM are under, else ``decode``; a batch above ``prefill_tokens`` takes
    ``prefill_tail`` when at least ``tail_share`` of the experts are expected to end on a block
    that rides along (:meth:`riding`), else ``prefill``; one between takes ``mid``.
    ``route_pack`` holds the ``moe.route_pack`` params besides those the GEMM fixes.
    """

    params: tuple[str, ...]
    regimes: Mapping[str, tuple[Tile, ...]]
    decode_bands: tuple[tuple[str, float], ...]
    tail_share: float
    decode_tokens: int
    prefill_tokens: int
    route_pack: Mapping[str, int]
    source: str = "<table>"  # where it was read, for errors

    # the regimes the op names itself; the bands name the others
    NAMED: ClassVar[tuple[str, ...]] = ("decode", "mid", "prefill", "prefill_tail")
    # the lead prefill_tail tile's params that riding reads
    RIDER: ClassVar[tuple[str, ...]] = ("block_m", "tail_rows")

    def __post_init__(self) -> None:
        fault = functools.partial(TileTableError, self.source)
        if not self.params or len(set(self.params)) != len(self.params):
            raise fault(f"params must name each value once (got {short_repr(self.params)})")
        missing = [n for n in (*self.NAMED, *(b for b, _ in self.decode_bands)) if n not in self.regimes]
        if missing:
            raise fault(f"regime(s) {', '.join(dict.fromkeys(missing))} have no tiles: list them under tiles")
        for name, tiles in self.regimes.items():
            if not tiles:
                raise fault(f"regime {name!r} lists no tile")
            for tile in tiles:
                if len(tile) != len(self.params):
                    raise fault(
                        f"a tile of {name!r} has {len(tile)} values, params names {len(self.params)} "
                        f"(got {short_repr(tile)})"
                    )
        if not set(self.RIDER) <= set(self.params):
            raise fault(f"params must name {' and '.join(self.RIDER)} (got {short_repr(self.params)})")
        bounds = [bound for _, bound in self.decode_bands]
        if bounds != sorted(set(bounds)):
            raise fault(f"decode_bands' bounds must increase, or a band is never reached (got {bounds})")
        if not 0.0 <= self.tail_share <= 1.0:
            raise fault(f"tail_share is a share of experts, 0 to 1 (got {self.tail_share!r})")
        if not 0 <= self.decode_tokens <= self.prefill_tokens:
            raise fault(
                f"needs 0 <= decode_tokens <= prefill_tokens (got {self.decode_tokens}, {self.prefill_tokens})"
            )

    @classmethod
    def read(cls, path: str | Path) -> W4A16Tiles:
        """The table in the YAML file ``path``; raises :class:`TileTableError` naming what is
        missing or malformed, ``OSError`` when the file cannot be read."""
        import yaml  # only when a table is read

        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise TileTableError(str(path), f"invalid YAML: {exc}") from None
        return cls.from_data(data, str(path))

    @classmethod
    def from_data(cls, data: Any, source: str = "<table>") -> W4A16Tiles:
        """The table of a mapping shaped as ``moe_w4a16_tiles.yaml`` is; a list inside a
        regime's list stands for its tiles, in place."""
        if not isinstance(data, Mapping) or set(data) != set(_KEYS):
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise TileTableError(source, f"must be a mapping of exactly {', '.join(_KEYS)} (got {got})")
        try:
            return cls(
                params=tuple(data["params"]),
                regimes={str(name): tuple(_tiles(items)) for name, items in data["tiles"].items()},
                decode_bands=tuple((str(name), float(bound)) for name, bound in data["decode_bands"]),
                tail_share=float(data["tail_share"]),
                decode_tokens=int(data["decode_tokens"]),
                prefill_tokens=int(data["prefill_tokens"]),
                route_pack={str(k): int(v) for k, v in data["route_pack"].items()},
                source=source,
            )
        except TileTableError:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            raise TileTableError(source, f"a value of the wrong shape: {exc}") from None

    def choices(self, regime: str) -> list[dict[str, Any]]:
        """The tiles of ``regime``, best first, each as its params."""
        return [dict(zip(self.params, tile, strict=True)) for tile in self.regimes[regime]]

    def decode_regime(self, tokens: int, topk: int, experts: int, n: int, *, sms: int) -> str:
        """The first of :attr:`decode_bands` whose bound the launch's 128-wide tiles per SM
        (one per expert the batch is expected to touch: :func:`touched_experts`) are under,
        else ``decode``."""
        per_sm = touched_experts(tokens, topk, experts) * (n // 128) / sms
        return next((name for name, bound in self.decode_bands if per_sm < bound), "decode")

    def riding(self, routes: int, experts: int) -> float:
        """:func:`riding_share` for the ``block_m`` and ``tail_rows`` of ``prefill_tail``'s
        lead tile."""
        lead = self.choices("prefill_tail")[0]
        return riding_share(routes, experts, **{name: lead[name] for name in self.RIDER})


def _tiles(items: Sequence[Any]) -> list[Tile]:
    """The tiles of a regime's list: a list of lists (an alias of another list) spliced in."""
    out: list[Tile] = []
    for item in items:
        if isinstance(item, list) and item and all(isinstance(v, list) for v in item):
            out.extend(_tiles(item))
        else:
            out.append(tuple(item))
    return out


@functools.cache
def shipped_tiles() -> W4A16Tiles:
    """The table shipped beside this module (:data:`SHIPPED`), read on first use."""
    return W4A16Tiles.read(SHIPPED)


def touched_experts(tokens: int, topk: int, experts: int) -> float:
    """The expected number of ``experts`` that ``tokens`` tokens route to, each to ``topk``
    distinct experts picked uniformly."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - min(topk, experts) / experts) ** tokens)


@functools.lru_cache(maxsize=256)  # the op asks once per prefill call, mostly for a few batch sizes
def riding_share(routes: int, experts: int, *, block_m: int, tail_rows: int) -> float:
    """The expected share of ``experts`` whose routes, of ``routes`` spread uniformly, end on a
    last block of 1 to ``tail_rows`` routes after at least one full block of ``block_m``: the
    blocks a ``tail_rows`` tile folds into the block before. A normal approximation of each
    expert's binomial count."""
    if routes <= 0 or experts <= 0:
        return 0.0
    p = 1.0 / experts
    mean, sd = routes * p, max(math.sqrt(routes * p * (1.0 - p)), 1e-9)

    def below(x: float) -> float:  # P(count <= x)
        return 0.5 * (1.0 + math.erf((x + 0.5 - mean) / (sd * math.sqrt(2.0))))

    top = int(mean + 8 * sd) // block_m + 1
    return sum(below(j * block_m + tail_rows) - below(j * block_m) for j in range(1, top + 1))
