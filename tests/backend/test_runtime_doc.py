"""docs/RUNTIME.md's "How to add an op" quotes a real op family: the quote must stay
equal to the file, so that pasting it never re-registers an op or drifts from the API."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_add_an_op_recipe_quotes_softmax_verbatim():
    doc = (ROOT / "docs" / "RUNTIME.md").read_text()
    section = doc[doc.index("## How to add an op"):]
    quoted = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert quoted == (ROOT / "vkdelegate" / "ops" / "families" / "softmax.py").read_text()
