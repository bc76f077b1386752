from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from b12x_aot.compiler._spec import load_spec
from b12x_aot.compiler._variants import expand, parse_where
from b12x_aot.compiler.errors import SpecError
from b12x_aot.contract import ExpressionError, variant_key

from ..conftest import SPECS, TOPK_SMALL, write_spec


def test_bundled_topk_spec_expands_with_constraints() -> None:
    spec = load_spec(SPECS / "moe_topk_sum.yaml")
    expansion = expand(spec)
    accepted = expansion.accepted
    total = 2 * 3 * 4 * 4 * 2 * 2 * 3
    pruned = sum(p.count for p in expansion.pruned)
    assert not expansion.rejected and pruned and len(accepted) + pruned == total
    assert all(p.family == spec.family and "constraint" in p.reason for p in expansion.pruned)
    # every (hidden, cta_threads) pair but the two whose last CTA would be under half busy
    pairs = {(v.id.params["hidden"], v.id.params["cta_threads"]) for v in accepted}
    assert {(h, t) for h in (2048, 3584, 4096, 7168) for t in (128, 256)} - pairs == {
        (3584, 128),
        (7168, 256),
    }
    assert {v.id.params["topk"] for v in accepted if v.id.params["tokens_per_cta"] > 1} == {1}
    keys = [v.key for v in accepted]
    assert len(set(keys)) == len(keys)
    v = accepted[0]
    assert v.key == variant_key(family=spec.family, abi=spec.abi, arch=v.id.arch, params=v.id.params)
    assert v.args[0].dtype == v.id.params["output"] and v.args[1].dtype == v.id.params["element"]


def test_where_and_arch_narrow(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, "s.yaml", TOPK_SMALL))
    accepted = expand(spec, archs=["sm_120a"], where={"output": "bf16"}).accepted
    assert {v.id.arch for v in accepted} == {"sm_120a"}
    assert {v.id.params["output"] for v in accepted} == {"bf16"}
    with pytest.raises(SpecError, match="is not in this spec's matrix"):
        expand(spec, where={"hidden": "5120"})
    with pytest.raises(SpecError, match="not params of"):
        expand(spec, where={"colour": "red"})


def test_planner_rejects_threads_and_smem(tmp_path: Path) -> None:
    text = (
        TOPK_SMALL.replace("cta_threads: [128, 256]", "cta_threads: [96, 128, 2048]")
        .replace("smem: 0", 'smem: "200000 if cta_threads == 128 else 0"')
        .replace('constraints: ["hidden % (cta_threads * 8) == 0"]', "constraints: []")
    )
    spec = load_spec(write_spec(tmp_path, "s.yaml", text))
    expansion = expand(spec, where={"output": "fp32"})
    accepted, rejected = expansion.accepted, expansion.rejected
    reasons = {(r.variant.id.arch, r.variant.id.params["cta_threads"]): r for r in rejected}
    assert reasons[("sm_90a", 2048)].stage == "threads"
    assert "allows a multiple of 32 from 32 to 1024" in reasons[("sm_90a", 2048)].reason
    # 200,000 B fits sm_90a/sm_100a (227 KiB) but not sm_120a (101,376 B).
    assert reasons[("sm_120a", 128)].stage == "smem"
    assert "exceeds the sm_120a opt-in limit of 101376 B" in reasons[("sm_120a", 128)].reason
    assert ("sm_90a", 128) not in reasons
    assert {(v.id.arch, v.id.params["cta_threads"]) for v in accepted} >= {("sm_90a", 128), ("sm_100a", 96)}


def test_constraints_read_the_target_arch(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace(
        'constraints: ["hidden % (cta_threads * 8) == 0"]',
        "constraints: [\"cta_threads == 128 or arch == 'sm_90a'\"]",
    )
    expansion = expand(load_spec(write_spec(tmp_path, "s.yaml", text)))
    built = {(v.id.arch, v.id.params["cta_threads"]) for v in expansion.accepted}
    assert ("sm_90a", 256) in built and ("sm_90a", 128) in built and ("sm_120a", 128) in built
    assert not any(t == 256 for arch, t in built if arch != "sm_90a")
    # the other archs' 256-thread combinations (one per output dtype), and nothing of sm_90a's
    assert {p.arch for p in expansion.pruned} == {"sm_100a", "sm_120a"}
    assert all("arch == 'sm_90a'" in p.reason and p.count == 2 for p in expansion.pruned)


def test_a_param_named_arch_is_refused(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace("cta_threads: [128, 256]", "cta_threads: [128, 256]\n  arch: [x]")
    with pytest.raises(SpecError, match="'arch' is the target arch constraints read"):
        load_spec(write_spec(tmp_path, "s.yaml", text))


def test_where_takes_one_value_per_param() -> None:
    assert parse_where(["topk=8", " hidden = 7168 "]) == {"topk": "8", "hidden": "7168"}
    with pytest.raises(ValueError, match=r"--where topk is given twice \(4 and 8\)"):
        parse_where(["topk=4", "topk=8"])
    with pytest.raises(ValueError, match="takes param=value"):
        parse_where(["topk"])


W4A16_SLICE = {"n": "7168", "k": "2048", "element": "bf16", "output": "bf16", "group": "128"}
W4A16_SLICE |= {"w_layout": "n64k128", "w_copy": "cp_async"}


@pytest.mark.parametrize(
    ("name", "where"),
    [("moe_topk_sum.yaml", {}), ("moe_w4a16.yaml", W4A16_SLICE), ("arch_and_constant", {})],
)
def test_pruning_as_params_bind_keeps_what_every_constraint_holds_for(
    tmp_path: Path, name: str, where: dict
) -> None:
    # Against the plain definition, in order: each combination (itertools.product order, per
    # arch), every constraint evaluated on it whole; one that cannot evaluate is false.
    if name == "arch_and_constant":  # constraints of no param: arch alone, none at all
        text = TOPK_SMALL.replace(
            'constraints: ["hidden % (cta_threads * 8) == 0"]',
            'constraints: ["arch != \'sm_100a\'", "1 == 1", "cta_threads == 128 or arch == \'sm_90a\'"]',
        )
        spec = load_spec(write_spec(tmp_path, "s.yaml", text))
    else:
        spec = load_spec(SPECS / name)
    expansion = expand(spec, where=where)

    def holds(c, env: dict) -> bool:
        try:
            return bool(c.evaluate(env))
        except (ExpressionError, ArithmeticError, TypeError):
            return False

    matrix = [(n, [v for v in values if n not in where or str(v) == where[n]]) for n, values in spec.params]
    want = []
    for arch in spec.archs:
        for values in itertools.product(*(v for _, v in matrix)):
            params = dict(zip(spec.param_names, values, strict=True))
            if all(holds(c, {**params, "arch": arch}) for c in spec.constraints):
                want.append((arch, tuple(sorted(params.items()))))
    rejected = {(r.variant.id.arch, tuple(sorted(r.variant.id.params.items()))) for r in expansion.rejected}
    got = [(v.id.arch, tuple(sorted(v.id.params.items()))) for v in expansion.accepted]
    assert got == [w for w in want if w not in rejected] and rejected <= set(want)
    total = math.prod(len(v) for _, v in matrix) * len(spec.archs)
    pruned = sum(p.count for p in expansion.pruned)
    assert pruned and len(expansion.accepted) + len(expansion.rejected) + pruned == total


def test_the_w4a16_matrix_is_counted_whole() -> None:
    # Millions of combinations, a few hundred variants per arch: every combination is counted once.
    spec = load_spec(SPECS / "moe_w4a16.yaml")
    expansion = expand(spec)
    total = math.prod(len(v) for _, v in spec.params) * len(spec.archs)
    assert total > 4_000_000
    assert len(expansion.accepted) + len(expansion.rejected) + sum(p.count for p in expansion.pruned) == total
    assert {v.id.arch for v in expansion.accepted} == set(spec.archs)
