from __future__ import annotations

import pytest

from b12x_aot.loader import Manifest, ManifestError, ParamRange


def test_parses_values_lists_and_ranges() -> None:
    m = Manifest.from_mapping(
        {
            "variants": [
                {
                    "family": "moe.topk_sum",
                    "abi": 1,
                    "archs": "sm_90a",
                    "params": {
                        "element": "bf16",
                        "output": ["fp32", "bf16"],
                        "hidden": {"min": 2048, "max": 4096},
                    },
                }
            ]
        }
    )
    (req,) = m.requirements
    assert req.archs == ("sm_90a",)
    assert dict(req.params)["hidden"] == ParamRange(2048, 4096)
    assert not req.is_exact
    assert req.matches("moe.topk_sum", 1, "sm_90a", {"element": "bf16", "output": "bf16", "hidden": 3584})
    assert not req.matches("moe.topk_sum", 1, "sm_90a", {"element": "bf16", "output": "bf16", "hidden": 7168})
    assert not req.matches(
        "moe.topk_sum", 1, "sm_100a", {"element": "bf16", "output": "bf16", "hidden": 3584}
    )
    with pytest.raises(ManifestError, match="ranges"):
        list(req.combinations())


def test_exact_combinations() -> None:
    m = Manifest.from_mapping({"variants": [{"family": "a.b", "abi": 1, "params": {"x": [1, 2], "y": "z"}}]})
    assert list(m.requirements[0].combinations()) == [{"x": 1, "y": "z"}, {"x": 2, "y": "z"}]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({}, "'variants' list"),
        ({"variants": []}, "empty"),
        ({"variants": [{"family": "a.b"}]}, "abi"),
        ({"variants": [{"family": "a.b", "abi": 1, "colour": 1}]}, "unknown keys"),
        ({"variants": [{"family": "a.b", "abi": 1, "params": {"x": {"lo": 1}}}]}, "range is"),
        ({"variants": [{"family": "a.b", "abi": 1, "params": {"x": [1.5]}}]}, "ints, strings or bools"),
    ],
)
def test_rejects_bad_manifests(data: dict, fragment: str) -> None:
    with pytest.raises(ManifestError, match=fragment):
        Manifest.from_mapping(data)
