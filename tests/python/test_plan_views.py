"""StepPlanner.plan views the caller's arrays: the indices and the descriptor columns
it writes are the caller's own memory (numpy or DLPack), the inputs are never written, the
columns carry exactly the records' values however many descriptors a step has, and a refused
call changes nothing: not the space, not the outputs, not last_plan_timing."""
import numpy as np
import pytest

import ulacache
from test_vllm_shapes import DLPackOnly  # a producer offering only DLPack, as torch does

ROW, LAYERS = 656, 2   # vLLM's FP8 MLA row, two layers per group
DEV, HOST = 2048, 8192
TOKENS = 6000          # one request's history: most of it on host
TOP_K = 1600           # over 1,536 misses: a step of many descriptors


def setup():
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=ROW * LAYERS, row_bytes=ROW,
                                      device_bytes_per_rank=DEV * ROW * LAYERS,
                                      host_bytes_per_rank=HOST * ROW * LAYERS)
    space = ulacache.AddressSpace(cfg, backend="counting")
    planner = ulacache.StepPlanner(space, max_batch=2, max_q_len=2, max_top_k=TOP_K)
    space.add_request(7)
    addrs = np.concatenate([space.allocate(7, 1000) for _ in range(TOKENS // 1000)])
    space.advance_round()
    on_host = np.array([a for a in addrs if space.lookup(int(a), 0)[0] == "host"], np.int32)
    assert len(on_host) >= TOP_K
    # [tokens = 2, top_k]: a decode row and its draft's, over the same request.
    sel = np.stack([on_host[:TOP_K], on_host[:TOP_K][::-1]]).astype(np.int32)
    sel[1, -5:] = -1
    return space, planner, sel


def test_plan_writes_the_callers_arrays_and_columns_equal_records():
    requests, qsl = np.array([7], np.int32), np.array([0, 2], np.int64)
    got = {}
    for form in ("records", "columns", "dlpack_columns"):
        space, planner, sel = setup()
        sel_before, req_before, qsl_before = sel.copy(), requests.copy(), qsl.copy()
        idx = np.full_like(sel, 99)
        if form == "records":
            desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
            arg = desc
        else:
            desc = ulacache.descriptor_columns(planner.max_descriptors)
            # Either width where a field allows it: the same values either way.
            desc["src_slot"] = np.zeros(planner.max_descriptors, np.int64)
            arg = desc if form == "columns" else {k: DLPackOnly(v) for k, v in desc.items()}
        idx_arg = idx if form != "dlpack_columns" else DLPackOnly(idx)
        fence, n, st = planner.plan(0, 0, sel, idx_arg, arg, requests, query_start_loc=qsl)
        assert n == st.misses and n > 3 * 512, n
        # The indices landed in the caller's array (through DLPack too): every selection's
        # device slot, -1 where it was padding.
        assert ((idx == -1) == (sel == -1)).all() and (idx[sel != -1] >= 0).all()
        assert (idx[sel != -1] < DEV).all()
        assert (sel == sel_before).all() and (requests == req_before).all() and (qsl == qsl_before).all()
        got[form] = {f: np.asarray(desc[f][:n]).astype(np.int64) for f in ulacache.DESCRIPTOR_FIELDS}
        got[form]["idx"] = idx.copy()
        # Past n the columns are untouched.
        if form != "records":
            assert all((np.asarray(v[n:]) == 0).all() for v in desc.values())
        t = planner.last_plan_timing
        assert set(t) == {"args_ns", "planner_ns", "outputs_ns"} and t["planner_ns"] > 0
        assert planner.complete(fence, np.zeros(n, np.uint8)) == (n, 0)
    for form in ("columns", "dlpack_columns"):
        for f, v in got["records"].items():
            assert (got[form][f] == v).all(), (form, f)
    rec = got["records"]
    assert (rec["dst_offset"] == rec["dst_slot"] * ROW).all() and (rec["num_layers"] == LAYERS).all()
    assert len(np.unique(rec["dst_slot"])) == len(rec["dst_slot"])


@pytest.mark.parametrize("case", ["negative_address", "stale_address", "int32_negative_request",
                                  "int64_negative_request", "int64_selections", "too_few_columns",
                                  "columns_differ_in_length", "read_only_indices", "strided_selections"])
def test_a_refused_plan_changes_nothing(case):
    space, planner, sel = setup()
    requests = np.array([7], np.int32)
    qsl = np.array([0, 2], np.int32)
    # A successful plan first, so that last_plan_timing holds a value a refusal must keep.
    fence, n, _ = planner.plan(0, 0, sel[:, :8].copy(), np.zeros((2, 8), np.int32),
                               ulacache.descriptor_columns(planner.max_descriptors), requests, query_start_loc=qsl)
    planner.complete(fence, np.zeros(n, np.uint8))
    space.advance_round()
    timing = planner.last_plan_timing
    idx = np.full_like(sel, 99)
    cols = {k: np.full_like(v, 7) for k, v in ulacache.descriptor_columns(planner.max_descriptors).items()}
    bad_sel = sel.copy()
    exc, text = ulacache.InvalidArgumentError, ""
    if case == "negative_address":
        bad_sel[1, 1234] = -5
        text = "selection 2834: -5 is neither an address nor -1"
    elif case == "stale_address":
        bad_sel[0, 700] = 2 ** 31 - 1
        exc, text = ulacache.NotFoundError, "selection 700"
    elif case == "int32_negative_request":
        requests = np.array([-7], np.int32)
        text = "non-negative"
    elif case == "int64_negative_request":
        requests = np.array([-2 ** 40], np.int64)   # never wraps to a live request
        exc = ulacache.NotFoundError
    elif case == "int64_selections":
        bad_sel = sel.astype(np.int64)
        text = "selections: dtype must be int32"
    elif case == "too_few_columns":
        cols = {k: v[:10] for k, v in cols.items()}
        exc, text = ulacache.ResourceExhaustedError, "descriptor array has 10 rows"
    elif case == "columns_differ_in_length":
        cols["op"] = cols["op"][:-1]
        text = "descriptor columns differ in length"
    elif case == "read_only_indices":
        idx.flags.writeable = False
        text = "indices: must be writable"
    elif case == "strided_selections":
        bad_sel = np.repeat(sel, 2, axis=1)[:, ::2]   # the same values, not C-contiguous: refused, not copied
        text = "selections: must be C-contiguous"
    before = space.debug_digest()
    sel_before = bad_sel.copy()
    with pytest.raises(exc, match=text):
        planner.plan(0, 0, bad_sel, idx, cols, requests, query_start_loc=qsl)
    assert space.debug_digest() == before and not planner.has_pending
    assert (idx == 99).all() and all((v == 7).all() for v in cols.values())
    assert (bad_sel == sel_before).all()
    assert planner.last_plan_timing == timing
