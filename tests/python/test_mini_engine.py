"""The mini engine (examples/mini_engine.py) as an SGLang-style loop against the dense
reference: the step's new tokens allocated before the forward, selections in the flat
page_table_1 form, plan -> descriptors -> complete, the new KV written at the looked-up
location, attention reading every entry (its own included) through the index array, in
FlashMLA-layout per-layer memory; q_len 3 (speculative decoding), layer groups of unequal
size. Logits bit-identical to the dense reference (TP at home: the dense reference that merges
the ranks' partials in rank order, as the TP run does). Its own ctest (python_mini_engine): a
few seconds per run."""
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import mini_engine  # noqa: E402

sys.path.pop(0)


@pytest.mark.parametrize("args", [
    ["--exec", "engine", "--q-len", "3", "--requests", "10"],    # groups 4 + 2 (tiny_glm's)
    ["--exec", "library", "--q-len", "3", "--groups", "3,2,1", "--requests", "10"],
    ["--exec", "engine", "--q-len", "1", "--groups", "3,2,1", "--requests", "10", "--max-batch", "2"],
    ["--tp", "2", "--q-len", "3", "--requests", "16"],
    ["--tp", "4", "--q-len", "1", "--requests", "12"],  # the single-softmax run differs by 0.68 here (a top-k near-tie)
])
def test_mini_engine_matches_dense_reference(args, capsys):
    assert mini_engine.main(args + ["--tensors", "numpy", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["matches_dense_reference"] and out["bit_identical"]
    assert out["entries_fetched"] > 0, "pools too large: nothing moved"
    if out["tp"] > 1:
        assert out["reference"] == "dense_at_home"
        assert out["exec"] == "engine" and out["new_tokens_moved"] == 0
