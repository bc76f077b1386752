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
        (
            {"variants": [{"family": "a.b", "abi": 1, "archs": 5}]},
            r"archs: must be a non-empty list .*\(got 5\)",
        ),
        ({"variants": [{"family": "a.b", "abi": 1, "archs": []}]}, "leave it out to mean every arch"),
        ({"variants": [{"family": "a.b", "abi": 1, "archs": [90]}]}, "list of arch names"),
    ],
)
def test_rejects_bad_manifests(data: dict, fragment: str) -> None:
    with pytest.raises(ManifestError, match=fragment):
        Manifest.from_mapping(data)


def test_a_string_of_digits_is_shown_quoted_so_it_does_not_read_as_the_int() -> None:
    m = Manifest.from_mapping(
        {
            "variants": [
                {"family": "a.b", "abi": 1, "params": {"topk": "8", "hidden": 7168, "element": "bf16"}}
            ]
        }
    )
    assert m.requirements[0].describe() == "a.b abi=1 [any arch] topk='8' hidden=7168 element=bf16"
    assert not m.requirements[0].matches("a.b", 1, "sm_90a", {"topk": 8, "hidden": 7168, "element": "bf16"})
