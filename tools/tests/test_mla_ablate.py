"""tools/bench/h200/mla_ablate.py: every ablation's edit still finds its text in the kernel, exactly once, so a
kernel change that moves the text fails here rather than timing the intact kernel on the device."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools/bench/h200"))
import mla_ablate  # noqa: E402


@pytest.mark.parametrize("name", sorted(mla_ablate.ABLATIONS))
def test_each_ablation_edits_the_kernel(name, tmp_path):
    _, edits = mla_ablate.ABLATIONS[name]
    src = mla_ablate.make_copy(name, edits, ROOT, base=tmp_path)
    intact = "".join((ROOT / "mla" / f).read_text() for f in mla_ablate.KERNEL_FILES)
    cut = "".join((src / f).read_text() for f in mla_ablate.KERNEL_FILES)
    assert cut != intact
    for old, new in edits:
        assert cut.count(old) == 0 or old in new


def test_an_edit_whose_text_is_gone_fails_loudly(tmp_path):
    with pytest.raises(SystemExit, match="not in the kernel"):
        mla_ablate.make_copy("x", [("no such text in the kernel", "")], ROOT, base=tmp_path)
