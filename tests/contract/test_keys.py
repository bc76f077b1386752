"""The variant key: every input changes it, nothing else does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from b12x_aot.contract import variant_key

BASE = {
    "family": "moe.topk_sum",
    "abi": 1,
    "arch": "sm_90a",
    "params": {"element": "bf16", "output": "fp32", "topk": 8, "hidden": 7168, "cta_threads": 128},
}


def key(**changes: object) -> str:
    spec = {**BASE, **{k: v for k, v in changes.items() if k != "params"}}
    spec["params"] = {**BASE["params"], **changes.get("params", {})}  # type: ignore[dict-item]
    return variant_key(**spec)  # type: ignore[arg-type]


def test_stable_and_hex() -> None:
    assert key() == key()
    assert len(key()) == 64 and int(key(), 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"family": "moe.topk_sum2"},
        {"abi": 2},
        {"arch": "sm_100a"},
        {"params": {"element": "fp16"}},
        {"params": {"output": "bf16"}},
        {"params": {"topk": 4}},
        {"params": {"hidden": 3584}},
        {"params": {"cta_threads": 256}},
        {"params": {"extra": 1}},
        {"params": {"topk": "8"}},  # type matters: "8" is not 8
    ],
)
def test_each_input_changes_the_key(change: dict) -> None:
    assert key(**change) != key()


def test_param_order_does_not_matter() -> None:
    reordered = dict(reversed(list(BASE["params"].items())))  # type: ignore[union-attr]
    assert variant_key(family="moe.topk_sum", abi=1, arch="sm_90a", params=reordered) == key()


def test_environment_paths_and_cwd_do_not_matter(tmp_path) -> None:
    code = (
        "from b12x_aot.contract import variant_key;"
        "print(variant_key(family='moe.topk_sum', abi=1, arch='sm_90a', params="
        "{'element': 'bf16', 'output': 'fp32', 'topk': 8, 'hidden': 7168, 'cta_threads': 128}))"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "3", "CUTE_DSL_ARCH": "sm_120a", "B12X_ANYTHING": "x"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == key()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"family": "TopK"}, ValueError),
        ({"abi": 0}, ValueError),
        ({"abi": True}, ValueError),
        ({"arch": "hopper"}, ValueError),
        ({"params": {"x": 1.5}}, TypeError),
        ({"params": {"bad name": 1}}, TypeError),
    ],
)
def test_malformed_inputs_raise(kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        variant_key(**{**BASE, **kwargs})  # type: ignore[arg-type]
