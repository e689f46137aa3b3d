"""shaders/variants.py's declare_grid: an op's variants are its grid's product."""
import pytest

from vkdelegate.shaders import variants


@pytest.fixture
def fresh(monkeypatch):
    """An empty variant table, so that these made-up shaders never reach the tests that
    compile every declared variant."""
    monkeypatch.setattr(variants, "_VARIANTS", {})
    return variants


def test_every_point_of_the_product_is_declared(fresh):
    seen = []

    def defines(dtype, tile, flag):
        seen.append((dtype, tile, flag))
        return {"DT": dtype, "TILE": tile, **({"FLAG": "1"} if flag else {})}

    fresh.declare_grid("grid_a", defines, dtype=("float32", "float16"), tile=(1, 4),
                       flag=(False, True))
    assert len(seen) == 8 and len(set(seen)) == 8
    assert seen[0] == ("float32", 1, False) and seen[-1] == ("float16", 4, True)
    got = fresh.all_variants()
    assert len(got) == 8
    assert ("grid_a", {"DT": "float16", "TILE": "4", "FLAG": "1"}) in got  # str values


def test_none_skips_a_point_and_lists_give_several_forms(fresh):
    def defines(a, b):
        if a == b:
            return None
        return [{"A": a, "B": b}, {"A": a, "B": b, "WG": "64"}]

    fresh.declare_grid(("grid_b", "grid_c"), defines, a=(0, 1, 2), b=(0, 1, 2))
    got = fresh.all_variants()
    # 6 points with a != b, two forms each, for two shaders.
    assert len(got) == 24
    assert ("grid_c", {"A": "2", "B": "0", "WG": "64"}) in got
    assert not any(d["A"] == d["B"] for _, d in got)


def test_declare_keeps_its_signature(fresh):
    fresh.declare("grid_d", {"X": 1})
    fresh.declare("grid_d", {"X": "1"})  # the same variant once
    assert fresh.all_variants() == [("grid_d", {"X": "1"})]
