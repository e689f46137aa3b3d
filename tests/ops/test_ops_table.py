"""docs/OPS.md is generated from the registry and must be current."""
from vkdelegate.ops import coverage as ops_table
from vkdelegate.ops.registry import OpSpec


def test_committed_table_is_current():
    committed = ops_table.DEFAULT_PATH.read_text()
    assert committed == ops_table.render(), (
        "docs/OPS.md is out of date: run python -m vkdelegate.ops.coverage")


def test_table_lists_each_op_with_its_claims():
    spec = OpSpec("aten.fake.default", frozenset({"float32", "int64"}), impl=lambda b, n: 0,
                  shape_fn=None, arg_dtypes={0: frozenset({"bool"})}, max_rank=4,
                  notes="a note")
    text = ops_table.render({"aten.fake.default": spec})
    row = next(line for line in text.splitlines() if "`aten.fake.default`" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["`aten.fake.default`", "float32, int64; arg 0: bool", "no", "4",
                     "a note"]
    assert "## other" in text  # a spec registered outside vkdelegate.ops.families


def test_check_mode_detects_a_stale_file(tmp_path):
    path = tmp_path / "OPS.md"
    assert ops_table.main(["--path", str(path), "--check"]) == 1
    assert ops_table.main(["--path", str(path)]) == 0
    assert ops_table.main(["--path", str(path), "--check"]) == 0
    path.write_text(path.read_text() + "edited\n")
    assert ops_table.main(["--path", str(path), "--check"]) == 1
