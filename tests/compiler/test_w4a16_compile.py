"""moe.route_pack + moe.w4a16: real offline compiles of a small subset, and the bundled plan."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from b12x_aot.compiler._arch import ARCHS
from b12x_aot.compiler._plan import in_shard
from b12x_aot.compiler._spec import load_spec
from b12x_aot.compiler._variants import expand
from b12x_aot.loader._index import RegistryIndex

from ..conftest import ROOT, SPECS, checked_cubin, current_rows, run_compile

pytestmark = pytest.mark.dsl

W4A16 = SPECS / "moe_w4a16.yaml"
ROUTE_PACK = SPECS / "moe_route_pack.yaml"
FULL = ROOT / "tests" / "specs" / "moe_w4a16_full.yaml"
TILES = ROOT / "benchmarks" / "specs" / "bench_w4a16_tiles.yaml"
PACK_TILES = ROOT / "benchmarks" / "specs" / "bench_route_pack_tiles.yaml"
# Three decode variants per arch that differ only in cta_threads, plus their route packer.
SUBSET = (
    *("element=bf16", "output=bf16", "n=256", "block_m=16", "group=128", "e_cap=256", "w_layout=nk"),
    *("split_k=1", "k_ctas=1"),
)


@pytest.fixture(scope="module")
def small_w4a16_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("w4a16") / "kernels.db"
    where = [arg for item in SUBSET for arg in ("--where", item)]
    run_compile(str(W4A16), "--registry", str(db), "-j", "2", *where, "--where", "tile_k=128")
    run_compile(
        str(ROUTE_PACK), "--registry", str(db), "-j", "2", "--where", "block_m=16", "--where", "e_cap=256"
    )
    return db


def test_subset_builds_for_every_arch_and_cta_size(small_w4a16_registry: Path) -> None:
    index = RegistryIndex(small_w4a16_registry)
    entries = list(index.entries.values())
    gemms = [e for e in entries if e.family == "moe.w4a16"]
    packs = [e for e in entries if e.family == "moe.route_pack"]
    assert {(e.arch, e.params["cta_threads"]) for e in gemms} == {
        (a, t) for a in ARCHS for t in (128, 256, 512)
    }
    assert {e.arch for e in packs} == set(ARCHS)
    resources = {r.key: r for r in current_rows(small_w4a16_registry)}
    for entry in entries:
        kernel = checked_cubin(index, entry).kernel(entry.symbol)
        assert kernel.max_threads == entry.params["cta_threads"]
        assert resources[entry.key].registers
    # cta_threads is a scheduling choice the audit can see: same params otherwise, other registers.
    for arch in ARCHS:
        regs = {e.params["cta_threads"]: resources[e.key].registers for e in gemms if e.arch == arch}
        assert len(set(regs.values())) > 1 and regs[256] != regs[512], f"{arch}: {regs}"


@pytest.mark.usefixtures("needs_nvdisasm")
def test_subset_sass_has_tensor_cores_cp_async_and_no_spills(small_w4a16_registry: Path) -> None:
    rows = current_rows(small_w4a16_registry)
    assert {r.family for r in rows} == {"moe.w4a16", "moe.route_pack"}
    for row in rows:
        assert row.spill_store_bytes == 0 and row.classes["local"] == 0, (row.arch, row.params)
        if row.family == "moe.w4a16":
            assert row.classes["mma"] > 0 and any(op.startswith("HMMA") for op in row.opcodes)
            assert any(op.startswith("LDGSTS") for op in row.opcodes)  # cp.async pipeline
            # Decode tiles take nibble pairs t, t + 4 (nk: k and k + 4; n64k128's lane order: k
            # and k + 1), one shift each, no PRMT; pairing k with k + 1 in nk rows would take a
            # PRMT per operand register, as many as the HFMA2s. At 128 threads (64 HFMA2) the
            # activation pairing's few PRMTs keep the count far below.
            if row.params["cta_threads"] == 128:
                prmt, hfma2 = (
                    sum(n for op, n in row.opcodes.items() if op.startswith(p)) for p in ("PRMT", "HFMA2")
                )
                assert prmt < hfma2 // 2, (row.arch, row.params, prmt, hfma2)


@pytest.mark.usefixtures("needs_nvdisasm")
def test_prefill_tile_runs_wgmma_on_sm90a_only(tmp_path: Path) -> None:
    # The one prefill tile of the subset, in both weight layouts: sm_90a takes the warpgroup-MMA
    # k-loop (HGMMA, weights as the register operand), the other archs the warp-level one (HMMA);
    # all without spills.
    db = tmp_path / "kernels.db"
    picks = ("element=bf16", "output=bf16", "n=256", "group=128", "block_m=64", "tile_k=64")
    run_compile(str(W4A16), "--registry", str(db), "-j", "2", *[a for p in picks for a in ("--where", p)])
    rows = current_rows(db)
    assert sorted((r.arch, r.params["w_layout"]) for r in rows) == sorted(
        (arch, layout) for arch in ARCHS for layout in ("nk", "n64k128")
    )
    want = {"sm_90a": {"HGMMA"}, "sm_100a": {"HMMA"}, "sm_120a": {"HMMA"}}
    for row in rows:
        assert {op.split(".")[0] for op in row.opcodes if "MMA" in op} == want[row.arch], row.params
        assert row.spill_store_bytes == 0, (row.arch, row.params)
    # A block's wgmmas are only as wide as its real rows need: one k-loop per width (block_m 64:
    # n = 64, 32, 16), each with the same wgmmas (4 steps per m64 chunk).
    for sm90 in (r for r in rows if r.arch == "sm_90a"):
        widths = Counter()
        for op, count in sm90.opcodes.items():
            if op.startswith("HGMMA"):
                widths[int(op.split(".")[1].split("x")[1])] += count
        assert set(widths) == {64, 32, 16} and len(set(widths.values())) == 1, sm90.opcodes
        # The wgmmas run asynchronously: a k-loop waits on its groups once per m64 chunk and k-tile
        # (two here) and once at its end, 3 waits to 8 wgmmas. ptxas falls back to waiting after
        # every wgmma when it sees A registers rewritten inside a pipeline stage.
        waits = sum(n for op, n in sm90.opcodes.items() if op.startswith("WARPGROUP.DEPBAR"))
        assert 2 * waits < sum(widths.values()), sm90.opcodes


def test_the_copy_warp_tile_hands_registers_over_and_syncs_on_mbarriers(tmp_path: Path) -> None:
    # FC2's 256-wide tile and its copy-warp twin: 384 threads, the copy warpgroup's registers
    # handed to the compute warpgroups (setmaxnreg both ways), the CTA barrier of each k-loop
    # gone (left: one after the mbarrier init and the epilogue's two named ones) for mbarrier
    # waits and arrivals, and the wgmmas as asynchronous as the twin's (the same waits).
    db = tmp_path / "kernels.db"
    picks = ("element=bf16", "output=bf16", "n=7168", "group=128", "tile_n=256", "w_layout=n64k128")
    run_compile(str(W4A16), "--registry", str(db), "-j", "2", *[a for p in picks for a in ("--where", p)])
    rows = {r.params["copy_warps"]: r for r in current_rows(db)}
    assert set(rows) == {0, 4}
    index = RegistryIndex(db)
    for entry in index.entries.values():
        want = 256 + 32 * entry.params["copy_warps"]
        assert checked_cubin(index, entry).kernel(entry.symbol).max_threads == want

    def count(row, *prefixes: str) -> int:
        return sum(n for op, n in row.opcodes.items() if op.startswith(prefixes))

    split, plain = rows[4], rows[0]
    assert {"USETMAXREG.DEALLOC.CTAPOOL", "USETMAXREG.TRY_ALLOC.CTAPOOL"} <= set(split.opcodes)
    assert count(split, "BAR.SYNC") == 3 < count(plain, "BAR.SYNC")
    assert count(split, "SYNCS.PHASECHK") and count(split, "SYNCS.ARRIVE")
    assert count(split, "WARPGROUP.DEPBAR") == count(plain, "WARPGROUP.DEPBAR") < count(split, "HGMMA")
    assert split.spill_store_bytes == plain.spill_store_bytes == 0


def test_copy_warps_need_their_warpgroup_and_the_wgmma_loop() -> None:
    # The kernel refuses what the spec's constraints would let through by mistake: a launch
    # without the copy warpgroup's threads, other copy-warp counts, and tiles off the wgmma loop.
    from b12x_aot.kernels.w4a16 import W4A16 as Kernel

    spec = load_spec(W4A16)
    accepted = expand(spec, archs=["sm_90a"]).accepted
    split = next(v for v in accepted if v.id.params["copy_warps"] == 4)
    Kernel(spec.geometry, split.static, **split.id.params)  # as built
    with pytest.raises(ValueError, match=r"launch.block == \[cta_threads \+ 32 \* copy_warps"):
        Kernel(spec.geometry, split.static._replace(block=(256, 1, 1)), **split.id.params)
    one_warp = {**split.id.params, "copy_warps": 1}
    with pytest.raises(ValueError, match=r"copy_warps in \(0, 4\)"):
        Kernel(spec.geometry, split.static._replace(block=(288, 1, 1)), **one_warp)
    decode = next(v for v in accepted if v.id.params["block_m"] == 16 and v.id.params["split_k"] == 1)
    smem = decode.static.smem + 16 * decode.id.params["stages"]
    with pytest.raises(ValueError, match="4: the wgmma loop's split_k == k_ctas == 1, block_m > 16"):
        Kernel(
            spec.geometry,
            decode.static._replace(block=(decode.static.block[0] + 128, 1, 1), smem=smem),
            **{**decode.id.params, "copy_warps": 4},
        )


def test_the_abi_1_argument_lists_stay_as_released() -> None:
    # Callers pass arguments by position: reordering or retyping one needs a new abi version.
    spec = load_spec(W4A16)
    names = [(a.name, a.kind, a.dtype, a.intent) for a in spec.args]
    assert names == [
        ("out", "ptr", "{output}", "out"),
        ("a", "ptr", "{element}", "in"),
        ("w", "ptr", "u8", "in"),
        ("scales", "ptr", "{element}", "in"),
        ("scratch", "ptr", "i32", "in"),
        ("num_tokens", "i32", None, "in"),
        ("num_experts", "i32", None, "in"),
    ]
    pack = load_spec(ROUTE_PACK)
    assert [(a.name, a.intent) for a in pack.args] == [
        ("scratch", "out"),
        ("route_ids", "in"),
        ("num_tokens", "in"),
        ("num_experts", "in"),
    ]


def test_spec_smem_grid_and_scratch_agree() -> None:
    from b12x_aot.kernels.w4a16 import smem_bytes

    from ..kernels.w4a16_reference import HEADER_WORDS, max_blocks
    from ..loader.test_checked_errors import entry_for

    def contract(spec):
        return spec.kernel, spec.args, spec.geometry.to_json(), spec.limits

    spec = load_spec(W4A16)
    for path in (W4A16, FULL, TILES):
        other = load_spec(path)
        # The scale-test and benchmark specs copy the bundled contract; it must not drift.
        assert contract(other) == contract(spec), path
        accepted = expand(other, archs=["sm_90a"]).accepted
        for v in accepted:
            assert v.static.smem == smem_bytes(v.id.params), v.label
    assert contract(load_spec(PACK_TILES)) == contract(load_spec(ROUTE_PACK))
    # The GEMM's grid is the block bound that route packing lays out; both specs size the
    # scratch alike, and one buffer sized for the most tokens serves every smaller count.
    for block_m in (16, 32, 64, 128):
        gemm = entry_for("moe_w4a16.yaml", {"block_m": block_m, "k_ctas": 1})
        pack = entry_for("moe_route_pack.yaml", {"block_m": block_m})
        sizes = []
        for tokens in (0, 1, 3, 16, 33, 4096, 70000):
            grid = gemm.geometry.grid_of({**gemm.params, "num_tokens": tokens, "num_experts": 256})
            words = pack.shapes(num_tokens=tokens, num_experts=256)["scratch"]
            assert words == gemm.shapes(num_tokens=tokens, num_experts=256)["scratch"]
            assert grid[0] == max_blocks(tokens, 8, block_m, 256)
            assert words == (HEADER_WORDS + grid[0] * (1 + block_m),)
            sizes.append(words[0])
        assert sizes == sorted(sizes)


def test_the_op_tiles_are_ones_the_spec_builds() -> None:
    # The op's table names its tiles, and the spec builds their shapes from it; the other
    # constraints (layout, arch, copies) still decide where each is built. So each tile must
    # be one the bundled spec builds, and every regime must find one for each serving shape,
    # dtype pair and weight layout at group 128 (group 32 is built for the long-k prefill
    # tiles only).
    pytest.importorskip("torch")
    from b12x_aot.ops.moe_w4a16_tiles import shipped_tiles

    table = shipped_tiles()
    keys = table.params
    accepted = expand(load_spec(W4A16), archs=["sm_90a"]).accepted
    built: dict[tuple, set[tuple]] = {}
    for v in accepted:
        p = v.id.params
        problem = (p["element"], p["output"], p["n"], p["k"], p["group"], p["w_layout"])
        built.setdefault(problem, set()).add(tuple(p[k] for k in keys))
    every = set().union(*built.values())
    # prefill_tail's riding tiles (built for sm_90a only) lead it, ride as the op's policy
    # assumes (W4A16Tiles.riding), and one exists for every problem there, so on an H200 the
    # op's prefill_tail regime always takes one
    tail, block = keys.index("tail_rows"), keys.index("block_m")
    tiles = table.regimes["prefill_tail"]
    riders = [tile for tile in tiles if tile[tail]]
    assert list(tiles[: len(riders)]) == riders and len(riders) >= 2
    rider = table.choices("prefill_tail")[0]
    assert all((tile[block], tile[tail]) == (rider["block_m"], rider["tail_rows"]) for tile in riders)
    lacking = [p for p, have in built.items() if not have.intersection(riders)]
    assert not lacking, lacking
    # the 256-wide rider fits every shape whose n it divides
    assert {p[2] for p, have in built.items() if riders[0] in have} == {256, 2048, 7168}
    group128 = {problem: have for problem, have in built.items() if problem[4] == 128}
    assert len(group128) == 3 * 4 * 2  # dtype pairs x shapes x layouts
    for regime, tiles in table.regimes.items():
        assert set(tiles) <= every, (regime, set(tiles) - every)
        for problem, have in group128.items():
            assert have.intersection(tiles), (regime, problem)
        # n64k128 weights find each bulk-copy tile of a regime wherever its cp.async twin is
        # built, and a tile built with bulk copies only (the 2-stage split-k ones) on every
        # long-k shape
        copy = keys.index("w_copy")
        for bulk in (tile for tile in tiles if tile[copy] == "bulk"):
            twin = (*bulk[:copy], "cp_async", *bulk[copy + 1 :])
            for problem, have in group128.items():
                wanted = twin in have if twin in every else problem[3] == 7168
                if problem[5] == "n64k128" and wanted:
                    assert bulk in have, (regime, bulk, problem)
    # Group 32 (long-k shapes) has mid and prefill tiles on every arch, sm_120a's 101,376 B of
    # shared memory included (prefill_tail falls back to a prefill tile off sm_90a).
    for arch in ARCHS:
        accepted = expand(load_spec(W4A16), archs=[arch]).accepted
        group32: dict[tuple, set[tuple]] = {}
        for v in accepted:
            p = v.id.params
            if p["group"] == 32:
                problem = (p["element"], p["output"], p["n"], p["k"], p["w_layout"])
                group32.setdefault(problem, set()).add(tuple(p[k] for k in keys))
        assert len(group32) == 3 * 3 * 2, arch  # dtype pairs x long-k shapes x layouts
        for regime in ("mid", "prefill", "prefill_tail"):
            for problem, have in group32.items():
                assert have.intersection(table.regimes[regime]), (arch, regime, problem)


def test_dry_run_plan_rejects_big_tiles_on_sm120a_only(tmp_path: Path) -> None:
    proc = run_compile(str(W4A16), "--registry", str(tmp_path / "plan.db"), "--dry-run", "--json")
    plan = json.loads(proc.stdout)
    items = plan["variants"]
    smem = [v for v in items if v["state"] == "rejected" and v["stage"] == "smem"]
    assert smem and {v["arch"] for v in smem} == {"sm_120a"}
    assert all("exceeds the sm_120a opt-in limit of 101376 B" in v["reason"] for v in smem)
    spec = load_spec(W4A16)
    for v in smem:
        static = spec.geometry.bind_static(v["params"])
        assert 101_376 < static.smem <= 232_448 - 1024  # fits sm_90a beside the 1 KiB alignment pad
        twins = [u for u in items if u["params"] == v["params"] and u["arch"] in ("sm_90a", "sm_100a")]
        assert {u["state"] for u in twins} == {"new"} and len(twins) == 2
    built = {v["arch"] for v in items if v["state"] == "new"}
    assert built == {"sm_90a", "sm_100a", "sm_120a"}


def test_full_matrix_plans_with_reasons_and_shards_split_it(tmp_path: Path) -> None:
    # The whole variant space, planned only (no compile): every variant is new or rejected with
    # a reason, and the shards of a sharded build split the new ones exactly.
    db = str(tmp_path / "plan.db")

    def new_keys(*extra: str) -> set[str]:
        plan = json.loads(run_compile(str(FULL), "--registry", db, "--dry-run", "--json", *extra).stdout)
        assert {v["state"] for v in plan["variants"]} <= {"new", "rejected"}
        assert all(v["reason"] for v in plan["variants"] if v["state"] == "rejected")
        return {v["key"] for v in plan["variants"] if v["state"] == "new"}

    # One sharded plan through the CLI; the other shard is what the partition leaves (the
    # partition itself is tested at small scale in test_build.py).
    whole = new_keys()
    shards = [new_keys("--shard", "0/2")]
    shards.append({key for key in whole if in_shard(key, (1, 2))})
    assert whole and shards[0] and shards[1]
    assert shards[0].isdisjoint(shards[1]) and shards[0] | shards[1] == whole
