"""docs/utilization.md says what a device name gets: the refusal it quotes for a family name
is the one the code gives, and a name torch reports matches its one entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from modelprof import ModelProfError
from modelprof.timing.peaks import match_device

DOC = Path(__file__).resolve().parents[1] / "docs" / "utilization.md"


def _quoted_refusal() -> str:
    text = " ".join(DOC.read_text().split())
    found = re.search(r"`device=\"A100\"` says `(device name 'A100' is ambiguous: [^`]+)`", text)
    assert found, "docs/utilization.md no longer quotes the refusal of device='A100'"
    return found.group(1)


def test_the_doc_quotes_the_refusal_the_code_gives():
    with pytest.raises(ModelProfError) as raised:
        match_device("A100")
    assert str(raised.value) == _quoted_refusal()


@pytest.mark.parametrize("family", ["H100", "H200", "V100"])
def test_the_other_families_the_doc_names_are_refused_likewise(family):
    with pytest.raises(ModelProfError, match=f"device name '{family}' is ambiguous: it fits"):
        match_device(family)


def test_a_name_torch_reports_matches_one_entry():
    assert match_device("NVIDIA A100-SXM4-40GB") == "A100 SXM 40GB"
