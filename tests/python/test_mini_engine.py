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


@pytest.mark.parametrize("args", [
    ["--exec", "engine", "--device-slots", "200", "--requests", "10"],
    ["--exec", "library", "--device-slots", "200", "--groups", "3,2,1", "--requests", "10"],
    ["--tp", "2", "--device-slots", "150", "--requests", "12"],
])
def test_sglang_loop_reserves_retracts_and_rolls_back(args, capsys):
    """SGLang's scheduler loop under memory pressure: admissions deferred by the round's
    reservation, running requests retracted in retract_decode's order and prefilled again,
    drafts rejected at verification and truncated; every plan of a reserved round succeeds
    (a refused plan raises) and the logits match the reference replaying the schedule."""
    assert mini_engine.main(args + ["--tensors", "numpy", "--json", "--reject", "0.4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["matches_dense_reference"] and out["bit_identical"]
    assert out["retractions"] > 0 and out["admissions_deferred"] > 0 and out["drafts_rejected"] > 0
    assert out["rounds_reserved"] > 0 and out["entries_fetched"] > 0


def test_without_the_reservation_a_plan_is_refused():
    """The same pressure scheduled by the batch size alone (--no-reserve): a round selects
    more than the device's unused slots and its plan is refused, which the reservation above
    prevents."""
    ulacache = mini_engine.import_ulacache(None)
    with pytest.raises(ulacache.ResourceExhaustedError, match="cannot be evicted"):
        mini_engine.main(["--device-slots", "200", "--requests", "10", "--tensors", "numpy", "--json", "--no-reserve"])


@pytest.mark.parametrize("args", [
    ["--device-slots", "200", "--requests", "10"],
    ["--device-slots", "200", "--requests", "10", "--exec", "library", "--groups", "3,2,1"],
    ["--tp", "2", "--device-slots", "150", "--requests", "12"],
])
def test_quantile_reservation_refused_plans_fall_back(args, capsys):
    """--reserve quantile at a low quantile (0.3): rounds are admitted whose plans do not fit;
    each refused plan retracts a request (retract_decode's order) and the group is planned
    again, and the logits still match the reference replaying that schedule. TP bounds each
    rank by all of a request's selections (about P times what it homes), so even 0.3 of that
    leaves its plans room: bit-identical, no refusal."""
    assert mini_engine.main(args + ["--tensors", "numpy", "--json", "--reserve", "quantile",
                                    "--reserve-quantile", "0.3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["matches_dense_reference"] and out["bit_identical"]
    assert out["reserve"] == "quantile"
    assert (out["plan_refusals"] > 0) == (out["tp"] == 1), out["plan_refusals"]


def test_reservation_modes_against_the_oracle(capsys):
    """At 200 device slots (batch <= 4, q_len 3): the oracle (reserve_round over each round's
    true selections, drawn first) admits more than the guaranteed bound, and quantile 0.99
    (the measured share of the bound) closes part of that gap without a refused plan; every
    mode matches the reference."""
    out = {}
    for mode in ("guaranteed", "quantile", "oracle"):
        assert mini_engine.main(["--device-slots", "200", "--requests", "10", "--tensors", "numpy", "--json",
                                 "--reserve", mode]) == 0
        out[mode] = json.loads(capsys.readouterr().out)
        assert out[mode]["matches_dense_reference"] and out[mode]["bit_identical"], mode
    assert out["guaranteed"]["plan_refusals"] == 0 and out["oracle"]["plan_refusals"] == 0
    assert out["guaranteed"]["mean_batch"] < out["quantile"]["mean_batch"] <= out["oracle"]["mean_batch"] * 1.05


def test_verification_keeps_drafts_in_order():
    """Drafts are kept in order up to the first rejection; the decision is a function of
    (seed, request, position) alone, so a replay verifies alike."""
    kept = [mini_engine.accepted_drafts(7, rid, pos, 3, 0.4) for rid in range(20) for pos in range(40, 60)]
    assert set(kept) == {0, 1, 2}
    assert kept == [mini_engine.accepted_drafts(7, rid, pos, 3, 0.4) for rid in range(20) for pos in range(40, 60)]
    assert all(mini_engine.accepted_drafts(7, r, 50, 1, 0.4) == 0 for r in range(10))
    assert all(mini_engine.accepted_drafts(7, r, 50, 3, 0.0) == 2 for r in range(10))


def test_retraction_order_is_sglangs():
    """retract_decode pops the end of the list sorted by (output tokens, -prompt length)
    descending: the fewest output tokens first, the longest prompt among equals."""
    rows = [0, 1, 2, 3]
    out_len = {0: 9, 1: 2, 2: 2, 3: 5}
    prompt_len = {0: 50, 1: 40, 2: 90, 3: 10}
    order = mini_engine.retract_order(rows, out_len, prompt_len)
    assert order[-1] == 2 and order[-2] == 1 and order[0] == 0
