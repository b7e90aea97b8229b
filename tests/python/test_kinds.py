"""DeepSeek-V4's kinds from Python (docs/ARCHITECTURE.md "Kinds"): a V4-Flash space built from
configs/models/deepseek_v4_flash.json through space_config_of_model, requests allocated,
decoded, rolled back and freed, and every kind's page table (kind_pages_of) checked after
every op against a per-request model of the rules: C4 and its index keys floor(T / 4) entries,
C128 floor(T / 128) in blocks of 64, the window ring the tokens [max(0, most - ring), T), one
compressor state per request with T mod its rate filling; no live block changes id, no block
is held twice. Over frames (kind_frame_bytes), kind_budget_of's frames and C4 share move as
requests come and go. Refused calls raise the library's reason and change nothing."""
import random
from pathlib import Path

import numpy as np
import pytest

ulacache = pytest.importorskip("ulacache")

REPO = Path(__file__).resolve().parents[2]
FLASH = REPO / "configs" / "models" / "deepseek_v4_flash.json"
SEED = 57
GROUPS, C4_ROW = 21, 584  # V4-Flash: one group per CSA layer (MTP included), the C4 row
WINDOW, C4, C4_KEY, C128, C4_STATE, C4_INDEX_STATE, C128_STATE = range(7)
C4_SLOTS_PER_FRAME = 136 * 64  # 136 padded C4 blocks of 64 entries per frame (ARCHITECTURE.md)


def flash_model():
    return ulacache.load_model_config(str(FLASH))


def flash_config(drafts, device_c4=2000, host_c4=20000, frames=0):
    base = ulacache.AddressSpaceConfig(device_bytes_per_rank=device_c4 * GROUPS * C4_ROW,
                                       host_bytes_per_rank=host_c4 * GROUPS * C4_ROW, stable_new_entries=True)
    if frames:
        base.device_bytes_per_rank = frames * ulacache.KIND_FRAME_BYTES
        base.kind_frame_bytes = ulacache.KIND_FRAME_BYTES
    return ulacache.space_config_of_model(flash_model(), base, max_draft_tokens=drafts)


def test_the_model_config_gives_v4_flash_seven_kinds():
    model = flash_model()
    assert model.has_layer_kinds and model.sliding_window == 128
    assert model.num_layers_of_kind(ulacache.AttentionLayerType.compressed_sparse) == 21
    assert model.num_layers_of_kind(ulacache.AttentionLayerType.heavily_compressed) == 20
    kinds = ulacache.kinds_of_model(model, max_draft_tokens=3)
    L, P = ulacache.KindLifetime, ulacache.KindPlacement
    got = [(k.name, k.tokens_per_entry, k.lifetime, k.layers, k.row_bytes, k.placement, k.companion_of, k.state_rows)
           for k in kinds]
    assert got == [
        ("window", 1, L.ring, 44, 584, P.resident, None, 0),
        ("c4", 4, L.append, 21, 584, P.sparse, None, 0),
        ("c4_index_key", 4, L.append, 21, 132, P.resident, C4, 0),
        ("c128", 128, L.append, 20, 584, P.resident, None, 0),
        ("c4_state", 4, L.per_request, 21, 8192, P.resident, None, 8),
        ("c4_index_state", 4, L.per_request, 21, 2048, P.resident, None, 8),
        ("c128_state", 128, L.per_request, 20, 4096, P.resident, None, 128),
    ]
    assert (kinds[WINDOW].ring_tokens, kinds[WINDOW].ring_draft_tokens) == (131, 3)
    assert kinds[C4_KEY].entry_bytes() == 21 * 132
    assert ulacache.kinds_of_model(model, index_format="fp4")[C4_KEY].row_bytes == 68
    cfg = flash_config(drafts=3)
    assert (cfg.num_groups, cfg.row(), cfg.kinds, cfg.kind_frame_bytes) == (GROUPS, C4_ROW, kinds, 0)
    ulacache.validate_kinds(cfg.kinds)


class Model:
    """What every kind's page table must be, per request: its tokens and the most it held."""

    def __init__(self, kinds, page_tokens):
        self.ring = kinds[WINDOW].ring_tokens
        self.ring_drafts = kinds[WINDOW].ring_draft_tokens
        self.page_tokens = page_tokens
        self.tokens, self.most = {}, {}

    def grow(self, r, n):
        self.tokens[r] = self.tokens.get(r, 0) + n
        self.most[r] = max(self.most.get(r, 0), self.tokens[r])

    def first(self, r):
        return max(0, self.most[r] - self.ring)

    def rollback_holds(self, r, length):
        # The window of `length` (its last ring - drafts tokens) must still be live.
        return max(0, length - (self.ring - self.ring_drafts)) >= self.first(r)

    def expect(self, r, kind):
        """(entries, entries_per_block, first_offset, filling_tokens, number of blocks)."""
        t = self.tokens[r]
        if kind == WINDOW:
            first = self.first(r)
            off = first % 64
            return t - first, 64, off, 0, -(-(off + t - first) // 64)
        if kind in (C4, C4_KEY):
            e = t // 4
            return e, self.page_tokens, 0, t % 4, -(-e // self.page_tokens)
        if kind == C128:
            e = t // 128
            return e, 64, 0, t % 128, -(-e // 64)
        rate = 128 if kind == C128_STATE else 4
        return 1, 1, 0, t % rate, 1


def check_pages(space, model, last, frames):
    """Every kind's page table of every live request against the model; no block id held by two
    requests; a block that holds a live entry in two reads keeps its id. Returns the reads."""
    now = {}
    for kind in range(7):
        owners = {}
        for r in model.tokens:
            p = space.kind_pages_of(r, kind)
            entries, epb, off, filling, nblocks = model.expect(r, kind)
            assert (p.tokens, p.entries, p.entries_per_block, p.first_offset, p.filling_tokens) == \
                (model.tokens[r], entries, epb, off, filling), (r, kind, p)
            blocks = p.blocks
            assert blocks.dtype == np.int32 and len(blocks) == nblocks, (r, kind, p)
            if kind == C4 or (kind == C4_KEY and not frames):
                # The directory's pages: C4 entry i sits at offset i % 64 of page blocks[i // 64].
                addrs = space.addresses_of(r)
                assert list(blocks) == list(addrs[::64] // 64), (r, kind)
            for b in blocks:
                assert owners.setdefault(int(b), r) == r, f"kind {kind}: block {b} held by {owners[int(b)]} and {r}"
            # Absolute block index (a ring's blocks start at its first live token's block) -> id.
            base = model.first(r) // 64 if kind == WINDOW else 0
            now[(r, kind)] = (base, p.first_offset, p.entries, [int(b) for b in blocks])
            if (r, kind) in last:
                was_base, was_off, was_entries, was = last[(r, kind)]
                # Live in both reads: absolute blocks holding an entry in both ranges.
                lo = max(base, was_base)
                hi = min(base + (p.first_offset + p.entries + epb - 1) // epb if p.entries else base,
                         was_base + (was_off + was_entries + epb - 1) // epb if was_entries else was_base)
                for a in range(lo, hi):
                    assert blocks[a - base] == was[a - was_base], f"request {r} kind {kind}: live block {a} moved"
    return now


def run_ops(space, model, rng, ops, frames, on_budget=None):
    """A seeded mix of arrivals, decodes with drafts, rollbacks and frees."""
    live, next_id = [], 1
    last = {}
    counts = {"allocated": 0, "rollbacks": 0, "refused_rollbacks": 0, "freed": 0, "refused_allocates": 0}
    for op in range(ops):
        choice = rng.random()
        if not live or (choice < 0.2 and len(live) < 12):
            r, next_id = next_id, next_id + 1
            space.add_request(r)
            n = rng.randrange(1, 700)
            before = space.debug_digest()
            try:
                fresh = space.allocate(r, n)
            except ulacache.ResourceExhaustedError:
                assert space.debug_digest() == before
                counts["refused_allocates"] += 1
                space.free(r)
                continue
            assert len(fresh) == n // 4
            model.grow(r, n)
            live.append(r)
        elif choice < 0.75:
            r = rng.choice(live)
            q = rng.randrange(1, 4)  # the verified token and up to two drafts
            t = model.tokens[r]
            fresh = space.allocate(r, q)
            assert len(fresh) == (t + q) // 4 - t // 4
            model.grow(r, q)
            counts["allocated"] += q
            # Newest entries: where the engine writes the tokens just decoded.
            w = ulacache.newest_entry(space.kind_pages_of(r, WINDOW))
            assert w is not None and w[1] == (model.tokens[r] - 1) % 64
        elif choice < 0.92:
            r = rng.choice(live)
            length = max(0, model.tokens[r] - rng.randrange(0, 4))
            before = space.debug_digest()
            if model.rollback_holds(r, length):
                space.truncate(r, length)
                model.tokens[r] = length
                counts["rollbacks"] += 1
            else:
                with pytest.raises(ulacache.FailedPreconditionError):
                    space.truncate(r, length)
                assert space.debug_digest() == before
                counts["refused_rollbacks"] += 1
        else:
            r = live.pop(rng.randrange(len(live)))
            space.free(r)
            del model.tokens[r], model.most[r]
            last = {k: v for k, v in last.items() if k[0] != r}
            with pytest.raises(ulacache.NotFoundError):
                space.kind_pages_of(r, WINDOW)
            counts["freed"] += 1
        space.advance_round()
        space.check_invariants()
        last = check_pages(space, model, last, frames)
        if on_budget:
            on_budget(space, model)
    return counts


@pytest.mark.parametrize("frames", [0, 8], ids=["logical_blocks", "frames"])
def test_every_kinds_page_table_follows_the_rules_through_decode_rollback_and_free(frames):
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    cfg = flash_config(drafts=2, frames=frames)
    space = ulacache.AddressSpace(cfg, backend="counting")
    model = Model(cfg.kinds, cfg.page_tokens)
    counts = run_ops(space, model, rng, 300, frames, on_budget=budget_check if frames else None)
    print(counts)
    assert counts["rollbacks"] > 20 and counts["refused_rollbacks"] > 0 and counts["freed"] > 5


def budget_check(space, model):
    b = space.kind_budget_of()
    assert b.frames_of_kind[C4] == 0
    assert b.free_frames + sum(b.frames_of_kind) == b.frames
    assert b.c4_device_slots == b.free_frames * C4_SLOTS_PER_FRAME
    assert b.c4_entries == sum(t // 4 for t in model.tokens.values())
    assert b.c4_on_device <= min(b.c4_entries, b.c4_device_slots)


def test_over_frames_the_budget_and_the_c4_share_move_as_requests_come_and_go():
    frames, tokens = 16, 16384
    cfg = flash_config(drafts=3, host_c4=100000, frames=frames)
    space = ulacache.AddressSpace(cfg, backend="counting")
    model = Model(cfg.kinds, cfg.page_tokens)
    start = space.kind_budget_of()
    assert (start.frames, start.free_frames, start.c4_entries) == (frames, frames, 0)
    assert start.c4_device_slots == frames * C4_SLOTS_PER_FRAME == cfg.device_slots_per_group
    last, admitted = start, []
    while True:
        r = len(admitted) + 1
        space.add_request(r)
        before, budget_before = space.debug_digest(), space.kind_budget_of()
        try:
            space.allocate(r, tokens)
        except ulacache.ResourceExhaustedError as e:
            # Refused with the library's reason and nothing changed.
            assert e.code == "resource exhausted" and e.message
            assert space.debug_digest() == before
            assert vars_of(space.kind_budget_of()) == vars_of(budget_before)
            space.free(r)
            break
        model.grow(r, tokens)
        admitted.append(r)
        space.advance_round()
        b = space.kind_budget_of()
        budget_check(space, model)
        assert b.free_frames <= last.free_frames and b.c4_device_slots <= last.c4_device_slots
        assert b.c4_entries == last.c4_entries + tokens // 4
        last = b
        assert len(admitted) < 1000
    print(f"admitted {len(admitted)} requests of {tokens} tokens; resident frames {frames - last.free_frames}, "
          f"C4 device slots {start.c4_device_slots} -> {last.c4_device_slots}")
    assert len(admitted) >= 2 and last.free_frames < start.free_frames
    # Requests go: their frames return and the C4 share grows back.
    for r in admitted[::2]:
        space.free(r)
        del model.tokens[r], model.most[r]
        b = space.kind_budget_of()
        budget_check(space, model)
        assert b.free_frames >= last.free_frames and b.c4_device_slots >= last.c4_device_slots
        last = b
    space.check_invariants()
    # Compaction of each resident kind returns what it empties; the pages still follow the rules.
    returned = sum(space.compact_kind(k) for k in (WINDOW, C4_KEY, C128, C4_STATE, C4_INDEX_STATE, C128_STATE))
    b = space.kind_budget_of()
    assert b.free_frames == last.free_frames + returned
    budget_check(space, model)
    check_pages(space, model, {}, frames)
    for r in admitted[1::2]:
        space.free(r)
    end = space.kind_budget_of()
    assert (end.free_frames, end.c4_device_slots, end.c4_entries) == (frames, start.c4_device_slots, 0)


def vars_of(budget):
    return (budget.frames, budget.free_frames, list(budget.frames_of_kind), budget.c4_device_slots,
            budget.c4_entries, budget.c4_on_device)


def test_slot_helpers_give_each_kinds_block_table_and_newest_entry():
    cfg = flash_config(drafts=2)
    space = ulacache.AddressSpace(cfg, backend="counting")
    for r, n in ((1, 1000), (2, 130), (3, 3)):
        space.add_request(r)
        space.allocate(r, n)
    space.advance_round()  # the prefill's round ends: each window ring keeps its last 130 tokens
    table = ulacache.kind_block_table(space, [1, 2, 3], C128)
    assert table.dtype == np.int32 and table.shape == (3, 1)
    # 1,000 and 130 tokens hold C128 entries (7 and 1, one block each); 3 tokens none.
    assert list(table[:, 0]) == [space.kind_pages_of(1, C128).blocks[0], space.kind_pages_of(2, C128).blocks[0], -1]
    c4 = ulacache.kind_block_table(space, [3, 1], C4, width=8)
    assert c4.shape == (2, 8) and (c4[0] == -1).all() and list(c4[1, :4]) == list(space.kind_pages_of(1, C4).blocks)
    with pytest.raises(ulacache.InvalidArgumentError):
        ulacache.kind_block_table(space, [1], C4, width=2)
    # The window of request 1 (1,000 tokens, ring 130): live tokens [870, 1000), token 999 newest.
    w = space.kind_pages_of(1, WINDOW)
    assert (w.first_offset, w.entries) == (870 % 64, 130)
    assert ulacache.newest_entry(w) == (int(w.blocks[-1]), 999 % 64)
    # C4 entry 249 (tokens 996..999) at offset 249 % 64 of the 4th page; C128 entry 6 of block 0.
    assert ulacache.newest_entry(space.kind_pages_of(1, C4)) == (int(space.addresses_of(1)[249]) // 64, 249 % 64)
    assert ulacache.newest_entry(space.kind_pages_of(1, C128))[1] == 6
    assert ulacache.newest_entry(space.kind_pages_of(3, C4)) is None  # 3 tokens: no C4 entry yet
    state = space.kind_pages_of(3, C4_STATE)
    assert ulacache.newest_entry(state) == (int(state.blocks[0]), 0) and state.filling_tokens == 3


def test_bad_input_raises_the_libraries_reason_and_changes_nothing():
    cfg = flash_config(drafts=2)
    space = ulacache.AddressSpace(cfg, backend="counting")
    space.add_request(1)
    space.allocate(1, 500)
    space.add_request(2)
    before = space.debug_digest()
    pages = [space.kind_pages_of(1, k) for k in range(7)]
    with pytest.raises(ulacache.OutOfRangeError, match="kind 7 is out of range"):
        space.kind_pages_of(1, 7)
    with pytest.raises(ulacache.NotFoundError, match="request 9 is unknown"):
        space.kind_pages_of(9, WINDOW)
    with pytest.raises(ulacache.FailedPreconditionError, match="kind frames|frames"):
        space.kind_budget_of()
    with pytest.raises(ulacache.FailedPreconditionError):
        space.compact_kind(WINDOW)
    with pytest.raises(ulacache.FailedPreconditionError):
        space.truncate(1, 300)  # past the window ring (130 tokens live)
    with pytest.raises(ulacache.UnsupportedError):
        space.share_into(2, space.addresses_of(1)[:4])
    assert space.debug_digest() == before
    assert [space.kind_pages_of(1, k) for k in range(7)] == pages

    # A bad kinds list: refused naming the field, by validate_kinds, validate() and the space.
    bad = cfg.kinds
    bad[C4_KEY].companion_of = C128  # a later kind
    with pytest.raises(ulacache.InvalidArgumentError, match=r"kinds\[2\]\.companion_of"):
        ulacache.validate_kinds(bad)
    bad_cfg = flash_config(drafts=2)
    bad_cfg.kinds = bad
    with pytest.raises(ulacache.InvalidArgumentError, match=r"kinds\[2\]\.companion_of"):
        bad_cfg.validate()
    with pytest.raises(ulacache.InvalidArgumentError, match=r"kinds\[2\]\.companion_of"):
        ulacache.AddressSpace(bad_cfg, backend="counting")
    ring4 = ulacache.kinds_of_model(flash_model(), max_draft_tokens=2)
    ring4[WINDOW].tokens_per_entry = 4
    with pytest.raises(ulacache.InvalidArgumentError, match=r"kinds\[0\]"):
        ulacache.validate_kinds(ring4)
    # Frames without kinds.
    plain = ulacache.AddressSpaceConfig(num_groups=1, entry_bytes=64, device_bytes_per_rank=ulacache.KIND_FRAME_BYTES)
    plain.kind_frame_bytes = ulacache.KIND_FRAME_BYTES
    with pytest.raises(ulacache.InvalidArgumentError, match="kind_frame_bytes"):
        ulacache.AddressSpace(plain, backend="counting")
    # A space without kinds has no page tables of kinds.
    plain.kind_frame_bytes = 0
    single = ulacache.AddressSpace(plain, backend="counting")
    single.add_request(1)
    with pytest.raises(ulacache.FailedPreconditionError, match="no kinds"):
        single.kind_pages_of(1, 0)
    # A model without layer kinds, and an unknown storage format.
    glm = ulacache.load_model_config(str(REPO / "configs" / "models" / "glm5.json"))
    with pytest.raises(ulacache.FailedPreconditionError):
        ulacache.kinds_of_model(glm)
    with pytest.raises(ulacache.InvalidArgumentError, match="kv_format"):
        ulacache.kinds_of_model(flash_model(), kv_format="fp16")
    # The space that refused everything is as it was.
    assert space.debug_digest() == before


def test_a_prefix_is_shared_in_whole_blocks_of_every_kind():
    # share_prefix (docs/ARCHITECTURE.md "Kinds", "Shared prefixes across kinds"): the first
    # floor(tokens / 256) * 256 tokens, C4 by address, full C128 blocks by reference, the last
    # partly filled one copied; the request resumes its prefill from resume_from.
    space = ulacache.AddressSpace(flash_config(drafts=3), backend="counting")
    space.add_request(1)
    space.allocate(1, 8500)  # one round: the ring holds every token until it ends
    space.add_request(2)
    share = space.share_prefix(2, 1, 8300)
    assert share.resume_from == 8192 and share.copies == []
    assert list(space.addresses_of(2)) == list(space.addresses_of(1)[:2048])
    assert list(space.kind_pages_of(2, C128).blocks) == list(space.kind_pages_of(1, C128).blocks[:1])
    space.add_request(3)
    mid = space.share_prefix(3, 1, 1000)
    assert mid.resume_from == 768
    assert [(c.kind, c.src_block, c.entries) for c in mid.copies] == [(C128, space.kind_pages_of(1, C128).blocks[0], 6)]
    space.advance_round()
    space.allocate(2, 8300 - 8192)  # recomputes the tokens past the shared blocks
    space.check_invariants()
    with pytest.raises(ulacache.FailedPreconditionError, match="shared prefix"):
        space.truncate(2, 8000)
    for r in (1, 2, 3):
        space.free(r)
        space.check_invariants()


def test_over_frames_a_refused_call_changes_neither_the_space_nor_the_budget():
    cfg = flash_config(drafts=2, host_c4=0, frames=8)
    space = ulacache.AddressSpace(cfg, backend="counting")
    space.add_request(1)
    space.allocate(1, 4096)
    space.advance_round()
    space.add_request(2)
    before, budget = space.debug_digest(), vars_of(space.kind_budget_of())
    with pytest.raises(ulacache.InvalidArgumentError):
        space.compact_kind(C4)  # the sparse kind: its entries are the addresses
    with pytest.raises(ulacache.OutOfRangeError):
        space.compact_kind(7)
    with pytest.raises(ulacache.OutOfRangeError):
        space.kind_pages_of(1, 7)
    with pytest.raises(ulacache.ResourceExhaustedError):
        space.allocate(2, 10_000_000)
    assert space.debug_digest() == before and vars_of(space.kind_budget_of()) == budget


def test_the_integration_guides_v4_calls_run():
    """docs/INTEGRATION.md's DeepSeek-V4 block, as it stands there."""
    text = (REPO / "docs" / "INTEGRATION.md").read_text()
    section = text.index("### The calls, in the order a scheduler makes them")
    start = text.index("```python\n", section) + len("```python\n")
    code = text[start:text.index("```", start)]
    scope = {}
    import os
    cwd = os.getcwd()
    os.chdir(REPO)  # the block names the model config by its path in the repository
    try:
        exec(compile(code, "INTEGRATION.md", "exec"), scope)
    finally:
        os.chdir(cwd)
    new_c4, slots = scope["new_c4"], scope["slots"]
    assert len(new_c4) == 1 and slots.shape == (GROUPS, 1) and (slots >= 0).all()  # token 1003 completes entry 250
    assert scope["window_slots"] == [int(scope["window"].blocks[-1]) * 64 + i % 64 for i in (1001, 1002, 1003)]
    assert (scope["c128"].entries, scope["state"].filling_tokens) == (7, 0)
    assert (scope["idx"][0, :, :126] >= 0).all() and (scope["idx"][0, :, 126:] == -1).all()
    assert scope["budget"].c4_entries == 250 and scope["space"].num_requests == 0


def test_over_frames_every_kind_reads_through_a_strided_view_of_one_buffer():
    """Small kinds on the CPU backend: each C4 entry's bytes are at its slot's row of
    device_layer_view, and the resident kinds' views are of the same buffer."""
    L, P = ulacache.KindLifetime, ulacache.KindPlacement
    kinds = [
        ulacache.KvKind("window", 1, L.ring, ring_tokens=18, ring_draft_tokens=2, layers=2, row_bytes=64),
        ulacache.KvKind("c4", 4, L.append, layers=2, row_bytes=64, placement=P.sparse),
        ulacache.KvKind("c4_index_key", 4, L.append, layers=2, row_bytes=16, companion_of=1),
        ulacache.KvKind("c4_state", 4, L.per_request, state_rows=8, layers=2, row_bytes=64),
    ]
    frame = 32 * 1024  # 4 C4 blocks of 64 x 2 x 64 B
    cfg = ulacache.AddressSpaceConfig(num_groups=2, entry_bytes=64, row_bytes=64, device_bytes_per_rank=8 * frame,
                                      host_bytes_per_rank=4096 * 2 * 64, stable_new_entries=True)
    cfg.kinds = kinds
    cfg.kind_frame_bytes = frame
    space = ulacache.AddressSpace(cfg, backend="cpu")
    space.add_request(1)
    addrs = space.allocate(1, 1024)  # 256 C4 entries
    rng = np.random.default_rng(SEED)
    rows = {}
    for a in addrs:
        for g in range(2):
            rows[(int(a), g)] = rng.integers(0, 256, 64, dtype=np.uint8)
            space.write(int(a), g, rows[(int(a), g)])
    c4 = [space.device_layer_view(0, g, 0) for g in range(2)]
    assert c4[0].shape == (8 * 4, 64, 64) and c4[0].strides == (frame // 4, 64, 1)
    window = space.kind_layer_view(WINDOW, 0)
    base = lambda v: v.__array_interface__["data"][0]  # noqa: E731
    assert window.shape[1:] == (64, 64) and base(window) == base(c4[0])  # block 0 of every kind: the buffer's start
    assert base(c4[1]) == base(c4[0]) + 64 * 64  # group 1: the C4 kind's second layer in each block
    assert not c4[0].flags.writeable
    on_device = 0
    for (a, g), want in rows.items():
        tier, _, slot = space.lookup(a, g)
        if tier == "device":
            on_device += 1
            assert np.array_equal(c4[g][slot // 64, slot % 64], want), (a, g, slot)
    assert on_device > 0
    with pytest.raises(ulacache.InvalidArgumentError):
        space.kind_layer_view(C4, 0)  # the sparse kind's layers are device_layer_view's
    with pytest.raises(ulacache.OutOfRangeError):
        space.device_layer_view(0, 2, 0)


def test_a_tp_space_holds_every_kind_on_exactly_one_rank():
    """TP (docs/ARCHITECTURE.md "Kinds under TP"): C4 and its keys by address (a mod P), C128
    entry j on rank j mod P, the window and the states whole on the request's window home."""
    dp = flash_config(drafts=3)
    cfg = ulacache.TpConfig(num_ranks=4, num_groups=dp.num_groups, entry_bytes=dp.entry_bytes, attention="at_home",
                            device_bytes_per_rank=dp.device_bytes_per_rank,
                            host_bytes_per_rank=dp.host_bytes_per_rank, stable_new_entries=True)
    cfg.kinds = dp.kinds
    space = ulacache.TpAddressSpace(cfg)
    for r in (1, 2):
        space.add_request(r)
    assert [space.window_home_of(r) for r in (1, 2)] == [0, 1]
    addrs = space.allocate(2, 1000)
    space.advance_round()
    assert len(addrs) == 250
    for rank in range(4):
        c4 = space.kind_pages_of(2, C4, rank)
        assert c4.entries == int((addrs % 4 == rank).sum()) == 250 // 4 + (250 % 4 > rank)
        assert space.kind_pages_of(2, C128, rank).entries == 7 // 4 + (7 % 4 > rank)
        window = space.kind_pages_of(2, WINDOW, rank)
        state = space.kind_pages_of(2, C128_STATE, rank)
        assert (window.entries, state.entries) == ((131, 1) if rank == 1 else (0, 0))
    with pytest.raises(ulacache.OutOfRangeError):
        space.kind_pages_of(2, WINDOW, 4)
    local = ulacache.TpConfig(num_ranks=4, num_groups=dp.num_groups, entry_bytes=dp.entry_bytes,
                              attention="local_buffer", device_bytes_per_rank=dp.device_bytes_per_rank,
                              buffer_bytes_per_rank=64 * dp.entry_bytes * dp.num_groups)
    local.kinds = dp.kinds
    with pytest.raises(ulacache.UnsupportedError, match="local_buffer with kinds"):
        ulacache.TpAddressSpace(local)
