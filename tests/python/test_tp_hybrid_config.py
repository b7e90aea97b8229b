"""TP space and planner, unified buffer, prefix cache, configs and the indexer."""
from pathlib import Path

import numpy as np
import pytest

import ulacache

REPO = Path(__file__).resolve().parents[2]


def test_tp_local_buffer_and_at_home():
    for attention, buffer_bytes in (("local_buffer", 64 * 2 * 16), ("at_home", 0)):
        cfg = ulacache.TpConfig(num_ranks=2, num_groups=1, entry_bytes=64, attention=attention,
                                device_bytes_per_rank=64 * 16, host_bytes_per_rank=64 * 64,
                                buffer_bytes_per_rank=buffer_bytes)
        assert cfg.attention == attention
        space = ulacache.TpAddressSpace(cfg)
        space.add_request(1)
        addrs = space.allocate(1, 40)
        assert {space.home_of(int(a)) for a in addrs} == {0, 1}
        data = np.arange(64, dtype=np.uint8)
        space.write(int(addrs[3]), 0, data)
        out = np.zeros(64, np.uint8)
        space.read(int(addrs[3]), 0, out)
        assert np.array_equal(out, data)
        planner = ulacache.TpStepPlanner(space)
        source, slot, stats = planner.step_runs(0, addrs[:12].copy(), [(1, 12)])
        assert source.shape == (2, 12) and slot.shape == (2, 12) and len(stats) == 2
        if attention == "at_home":
            for r in range(2):
                home = np.array([space.home_of(int(a)) == r for a in addrs[:12]])
                assert np.array_equal(source[r] == 0, home) and np.all(source[r][~home] == 2)
        else:
            assert np.all(source != 2)
        space.check_invariants()
        with pytest.raises(ulacache.NotFoundError):
            planner.step_runs(0, np.array([100000], np.uint32), [(1, 1)])
        with pytest.raises(ulacache.InvalidArgumentError):
            planner.step_runs(0, addrs[:4].astype(np.int32), [(1, 4)])
        with pytest.raises(ulacache.NotFoundError):  # request 1's addresses named as request 2's (isolation)
            planner.step_runs(0, addrs[:4].copy(), [(2, 4)])
        with pytest.raises(ulacache.InvalidArgumentError):  # runs that do not cover the selections
            planner.step_runs(0, addrs[:4].copy(), [(1, 3)])
        space.free(1)
        with pytest.raises(ulacache.NotFoundError):
            space.free(1)
    with pytest.raises(ulacache.InvalidArgumentError):
        ulacache.TpConfig(attention="sideways")


def unified():
    cfg = ulacache.UnifiedBufferConfig(capacity_bytes=64 * 40, kinds=[("state", 128, "low"), ("kv", 64, "high")],
                                       padding_kind=1, padding_blocks=1)
    return ulacache.UnifiedBuffer(cfg)


def test_unified_buffer():
    buf = unified()
    ids = buf.allocate([2, 5])
    assert ids.dtype == np.uint32 and len(ids) == 7
    assert [buf.kind_of(int(i)) for i in ids] == [0, 0, 1, 1, 1, 1, 1]
    offs = np.zeros(len(ids), np.uint64)
    buf.translate(ids, offs)
    assert offs[0] == 0 and offs[1] == 128 and buf.offset(int(ids[2])) == offs[2]
    assert len(set(offs.tolist())) == len(ids)
    buf.pin(int(ids[2]))
    with pytest.raises(ulacache.FailedPreconditionError):
        buf.free(int(ids[2]))
    buf.unpin(int(ids[2]))
    with pytest.raises(ulacache.FailedPreconditionError):
        buf.unpin(int(ids[2]))
    buf.free(int(ids[0]))
    before = buf.stats().live_bytes
    with pytest.raises(ulacache.NotFoundError):  # a stale id
        buf.translate(np.array([ids[0]], np.uint32), np.zeros(1, np.uint64))
    with pytest.raises(ulacache.InvalidArgumentError):
        buf.translate(ids.astype(np.int64), offs)
    with pytest.raises(ulacache.ResourceExhaustedError):
        buf.allocate([0, 1000])
    with pytest.raises(ulacache.InvalidArgumentError):
        buf.allocate([1])
    assert buf.stats().live_bytes == before
    assert buf.can_allocate([1, 1]) and not buf.can_allocate([100, 0])
    buf.compact()
    buf.check_invariants()


def test_prefix_cache_insert_match_lock_evict():
    buf = unified()
    cache = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=4, kv_kind=1, state_kind=0), buf)
    tokens = np.arange(12, dtype=np.uint32)
    blocks = buf.allocate([1, 3])
    state, pages = int(blocks[0]), blocks[1:]
    cache.insert(tokens, pages, [(12, state, -1)])
    assert cache.holds(tokens) and cache.num_nodes == 1 and cache.num_checkpoints == 1  # one span of 12 tokens
    m = cache.match(tokens, 12)
    assert m.length == 12 and list(m.pages) == list(pages) and m.checkpoint_state == state
    cache.lock(m)
    with pytest.raises(ulacache.ResourceExhaustedError):
        cache.make_room(buf, [0, 100])
    assert cache.holds(tokens)  # locked: nothing evicted
    cache.unlock(m)
    with pytest.raises(ulacache.FailedPreconditionError):
        cache.unlock(m)
    free_kv = 40 - 1 - 2 - 3  # capacity units - padding - state - pages
    ev = cache.make_room(buf, [0, free_kv + 2])
    # Evicting the checkpoint (state, 2 units) makes room; the leaf is then left without a
    # state, which no request can resume from, so its 3 pages go with it (prefix_cache.h).
    assert ev.nodes == 1 and ev.pages == 3 and ev.checkpoints == 1
    assert buf.can_allocate([0, free_kv + 2]) and not cache.holds(tokens)
    cache.check_invariants()
    with pytest.raises(ulacache.InvalidArgumentError):
        cache.match(tokens.astype(np.int64), 12)


def test_configs():
    cfg = ulacache.load_model_config(str(REPO / "configs" / "models" / "tiny_glm.json"))
    assert cfg.name == "tiny_glm" and cfg.num_groups == 3 and cfg.group_entry_bytes == 4 * 96 and cfg.is_float32
    assert cfg.group_layers(1) == 2
    hw = ulacache.load_hardware_config(str(REPO / "configs" / "hardware" / "h200.json"))
    assert hw.device_memory_bytes > 0
    with pytest.raises(ulacache.IoError):
        ulacache.load_model_config(str(REPO / "configs" / "models" / "no_such_model.json"))
    with pytest.raises(ulacache.InvalidArgumentError) as info:
        ulacache.parse_model_config('{"name": "x"}')
    assert info.value.code == "invalid argument"


def test_indexer_matches_numpy():
    rng = np.random.default_rng(3)
    h, d, k = 4, 16, 8
    ix = ulacache.Indexer(h, d, k)
    q = rng.standard_normal(h * d).astype(np.float32)
    w = rng.standard_normal(h).astype(np.float32)
    keys = rng.standard_normal((50, d)).astype(np.float32)
    top = ix.select(q, w, keys)
    scores = (np.maximum(q.reshape(h, d) @ keys.T, 0) * w[:, None]).sum(axis=0)
    assert list(top) == list(np.argsort(-scores, kind="stable")[:k])
    with pytest.raises(ulacache.InvalidArgumentError):
        ix.select(q.astype(np.float64), w, keys)
    with pytest.raises(ulacache.InvalidArgumentError):
        ix.select(q[:5], w, keys)


def test_stub_and_docstrings_cover_every_binding():
    import ast
    import ulacache._ulacache as ext
    stub = Path(ulacache.__file__).with_name("__init__.pyi")
    tree = ast.parse(stub.read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    stubbed |= {t.target.id for t in tree.body if isinstance(t, ast.AnnAssign)}
    public = {n for n in dir(ext) if not n.startswith("_")}
    assert public - stubbed == set(), "bindings missing from __init__.pyi"
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name in public:
        obj = getattr(ext, name)
        if isinstance(obj, type):
            members = {m for m in vars(obj) if not m.startswith("_")}
            in_stub = {b.name for b in classes[name].body if isinstance(b, ast.FunctionDef)}
            in_stub |= {b.target.id for b in classes[name].body if isinstance(b, ast.AnnAssign)}
            assert members - in_stub == set(), f"{name}: members missing from the stub"
    for cls in (ext.AddressSpace, ext.StepPlanner, ext.TpAddressSpace, ext.UnifiedBuffer, ext.PrefixCache):
        assert cls.__doc__ and len(cls.__doc__) > 40


def test_readme_snippet_runs():
    text = (REPO / "README.md").read_text()
    start = text.index("```python\nimport numpy as np, ulacache")
    code = text[start + len("```python\n"):text.index("```", start + 10)]
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["stats"].misses == 20
    assert (scope["idx"][0, 0, 20:] == -1).all() and (scope["idx"][0, 0, :20] >= 0).all()
