"""The hybrid prefix cache's Python binding has what C++ has: evict by
count, copy-on-write matches, chunked insertion, window pages and their early release,
events, metrics, the host tier, and every PrefixMatch field."""
import numpy as np
import pytest

ulacache = pytest.importorskip("ulacache")

STATE, KV, SWA = 0, 1, 2
UNIT = 64  # every kind's block: one 64-byte unit


def buffer(units=256):
    return ulacache.UnifiedBuffer(ulacache.UnifiedBufferConfig(
        units * UNIT, [("state", UNIT, "low"), ("kv", UNIT, "high"), ("swa", UNIT, "low")], padding_kind=KV))


def insert(cache, buf, tokens, windowed=False):
    """One page per token (page_tokens 1), a state at the end; returns Insert's result."""
    n = len(tokens)
    ids = buf.allocate([1, n, n if windowed else 0])
    pages = ids[1:1 + n]
    window = ids[1 + n:].astype(np.int64) if windowed else None
    return cache.insert(np.asarray(tokens, dtype=np.uint32), pages, [(n, int(ids[0]), -1)], window)


def toks(first, last):
    return np.arange(first, last + 1, dtype=np.uint32)


def test_config_fields_and_validation():
    c = ulacache.PrefixCacheConfig(page_tokens=1, kv_kind=KV, state_kind=STATE, window_kind=SWA, sliding_window=3,
                                   record_events=True)
    assert (c.page_tokens, c.kv_kind, c.state_kind, c.window_kind, c.sliding_window, c.record_events) == (1, 1, 0, 2, 3, True)
    c.validate()
    with pytest.raises(ulacache.InvalidArgumentError):
        ulacache.PrefixCacheConfig(page_tokens=1, sliding_window=3).validate()  # no window kind
    assert ulacache.PrefixCacheConfig().window_kind == -1


def test_insert_returns_the_cached_length_and_evict_counts_by_kind():
    buf = buffer()
    cache = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=1), buf)
    assert insert(cache, buf, toks(1, 3)) == 0
    assert insert(cache, buf, toks(1, 7)) == 3
    assert insert(cache, buf, toks(20, 21)) == 0
    m = cache.match(np.append(toks(1, 7), 99).astype(np.uint32), 8)
    assert (m.length, m.kv_length, m.branch, m.host_length) == (7, 7, 0, 7)
    assert len(m.path) == 2 and m.path.dtype == np.uint32
    assert m.copy_state is None and len(m.window_pages) == 0
    ev = cache.evict(1, 1)  # the LRU leaf [20, 21] for the token, then one more state
    assert (ev.tokens, ev.checkpoints, ev.nodes) == (2, 2, 1)  # the state at 3 is tombstoned (the root side first)
    assert ev.tombstones == 1 and ev.offloaded == 0 and ev.window_pages == 0 and ev.offloaded_pages == 0
    assert cache.holds(toks(1, 7)) and not cache.holds(toks(1, 3))
    cache.check_invariants()


def test_copy_on_write_events_and_metrics():
    buf = buffer()
    cache = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=1, record_events=True), buf)
    insert(cache, buf, toks(1, 4))
    events = cache.take_events()
    assert sorted({e.type for e in events}) == ["page_stored", "state_stored"]
    assert sum(e.type == "page_stored" for e in events) == 4 and cache.take_events() == []
    m = cache.match_copy_on_write(toks(1, 5), 4)
    assert m.length == 4 and m.copy_state is not None and m.copy_state != m.checkpoint_state
    metrics = cache.metrics()
    assert metrics.kv.protected_bytes == 4 * UNIT and metrics.state.protected_bytes == UNIT
    assert metrics.kv.evictable == 0 and metrics.nodes == 1 and metrics.checkpoints == 1 and metrics.tombstones == 0
    digest = cache.debug_digest()
    with pytest.raises(ulacache.InvalidArgumentError):
        cache.make_room(buf, [1])  # a demand of the wrong shape: refused, nothing changed
    assert cache.debug_digest() == digest
    cache.unlock(m)
    buf.free(m.copy_state)
    assert cache.metrics().kv.evictable == 4 * UNIT
    cache.evict(100)
    assert sum(e.type == "page_removed" for e in cache.take_events()) == 4
    cache.check_invariants()


def test_chunked_insert_and_window_release():
    buf = buffer()
    cache = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=1), buf)
    held = cache.match(toks(1, 1), 0)  # an unlocked empty match
    ids = buf.allocate([1, 4, 0])
    first = cache.insert_chunk(toks(1, 4), ids[1:], [(4, int(ids[0]), -1)], held)
    assert first.length == 4
    ids2 = buf.allocate([1, 4, 0])
    pages = np.concatenate([first.pages, ids2[1:]])
    second = cache.insert_chunk(toks(1, 8), pages, [(8, int(ids2[0]), -1)], first)
    assert second.length == 8 and list(second.pages[:4]) == list(first.pages)
    cache.unlock(second)
    with pytest.raises(ulacache.FailedPreconditionError):
        cache.unlock(second)

    wbuf = buffer()
    wcache = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=1, window_kind=SWA, sliding_window=2), wbuf)
    insert(wcache, wbuf, toks(1, 4), windowed=True)
    m = wcache.match(toks(1, 4), 4)
    assert m.window_pages.dtype == np.int64 and list(m.window_pages[:3]) == [-1, -1, -1] and m.window_pages[3] >= 0
    wcache.lock(m)
    # Insert cut [1..4] at its window ([1..3] [4]): the lock protects only the window page 3.
    assert wcache.metrics().window.evictable == 3 * UNIT and wcache.metrics().window.protected_bytes == UNIT
    assert wcache.evict(0, 0, 100).window_pages == 3  # [1..3]: a window tombstone
    wcache.release_window(m)
    assert len(m.window_pages) == 0 and wcache.metrics().window.evictable == UNIT
    with pytest.raises(ulacache.FailedPreconditionError):
        wcache.release_window(wcache.match(toks(1, 4), 4))  # not locked
    assert wcache.evict(0, 0, 1).window_pages == 1  # a window tombstone: KV and state stay
    assert wcache.match(toks(1, 4), 4).length == 0
    wcache.unlock(m)  # the window tombstone at a leaf is useless now: it goes
    assert wcache.num_nodes == 0
    wcache.check_invariants()


def test_host_tier_takes_evicted_checkpoints():
    buf = buffer()
    cache = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=1), buf)
    cache.attach_host_tier(buf, 2)
    cache.attach_copy_backend(buf)
    with pytest.raises(ulacache.FailedPreconditionError):
        cache.attach_host_tier(buf, 2)
    insert(cache, buf, toks(1, 4))
    ev = cache.evict(0, 1)
    assert ev.offloaded == 1 and cache.holds_on_host(toks(1, 4)) and not cache.holds(toks(1, 4))
    assert not cache.kv_on_host(toks(1, 4))
    probe = cache.match(toks(1, 5), 4)
    assert probe.length == 0 and probe.host_length == 4
    m = cache.match_copy_on_write(toks(1, 5), 4)
    assert m.length == 4 and cache.holds(toks(1, 4)) and not cache.holds_on_host(toks(1, 4))
    assert cache.metrics().host_hits == 1 and cache.metrics().host_checkpoints == 0
    cache.unlock(m)
    buf.free(m.copy_state)
    cache.check_invariants()


def test_events_carry_block_hashes_parents_and_tokens():
    """what KV-aware routers read (SGLang's BlockStored / BlockRemoved)."""
    buf = buffer()
    cache = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=2, window_kind=SWA, sliding_window=3,
                                                            record_events=True), buf)
    ids = buf.allocate([1, 3, 3])  # 5 tokens: pages [1, 2] [3, 4] [5], a window page each
    cache.insert(toks(1, 5), ids[1:4], [(5, int(ids[0]), -1)], ids[4:].astype(np.int64))
    events = cache.take_events()
    pages = [e for e in events if e.type == "page_stored"]
    windows = [e for e in events if e.type == "window_stored"]
    assert [list(e.tokens) for e in pages] == [[1, 2], [3, 4], [5]] and pages[0].tokens.dtype == np.uint32
    assert pages[0].parent_hash is None
    assert [e.parent_hash for e in pages[1:]] == [e.hash for e in pages[:-1]]
    assert [e.hash for e in windows] == [e.hash for e in pages]  # a window page has its KV page's hash
    # The same prefix in another cache hashes the same.
    other_buf = buffer()
    other = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=2, record_events=True), other_buf)
    oids = other_buf.allocate([1, 2, 0])
    other.insert(toks(1, 4), oids[1:], [(4, int(oids[0]), -1)])
    assert [e.hash for e in other.take_events() if e.type == "page_stored"] == [e.hash for e in pages[:2]]
    # Window evictions emit events; removals repeat the stored hashes.
    cache.evict(0, 0, 100)
    removed = cache.take_events()
    assert sorted(e.hash for e in removed if e.type == "window_removed") == sorted(e.hash for e in windows)
    assert sorted(e.hash for e in removed if e.type == "page_removed") == sorted(e.hash for e in pages)
    cache.check_invariants()


def sglang_hashes(tokens, page):
    """SGLang's block hashes (get_hash_str, hash_str_to_int64), computed here with hashlib."""
    import hashlib
    out, prior = [], None
    for i in range(0, len(tokens), page):
        h = hashlib.sha256()
        if prior is not None:
            h.update(prior)
        for t in tokens[i:i + page]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        prior = h.digest()
        v = int(h.hexdigest()[:16], 16)
        out.append(v - 2**64 if v >= 2**63 else v)
    return out


def test_events_carry_sglang_hashes_a_medium_and_all_cleared_on_reset():
    """Events key blocks as SGLang does (SHA-256 chain, signed int64), say their medium, and a
    reset is one all_cleared event; stored_blocks() is what the events built."""
    buf = buffer()
    config = ulacache.PrefixCacheConfig(page_tokens=2, record_events=True)
    assert config.event_hash == "sglang"
    cache = ulacache.PrefixCache(config, buf)
    t = np.array([7, 70000, 3, 4, 5], dtype=np.uint32)
    ids = buf.allocate([1, 3, 0])
    cache.insert(t, ids[1:], [(5, int(ids[0]), -1)])
    pages = [e for e in cache.take_events() if e.type == "page_stored"]
    assert [e.hash for e in pages] == sglang_hashes(list(t), 2)
    assert all(e.medium == "GPU" and e.kv and e.stored and not e.window for e in pages)
    assert [(e.hash, e.parent_hash) for e in cache.stored_blocks()] == [(e.hash, e.parent_hash) for e in pages]
    m = cache.match(t, 5)
    cache.lock(m)
    with pytest.raises(Exception):
        cache.reset()  # refused while locked
    cache.unlock(m)
    cache.reset()
    assert [e.type for e in cache.take_events()] == ["all_cleared"]
    assert cache.num_nodes == 0 and cache.stored_blocks() == []
    assert ulacache.PrefixCacheConfig(event_hash="debug").event_hash == "debug"
    assert config.window_recency == "cushion" and ulacache.PrefixCacheConfig(window_recency="path").window_recency == "path"
    with pytest.raises(ValueError):
        ulacache.PrefixCacheConfig(event_hash="md5")
    assert config.unaligned_tail == "keep" and ulacache.PrefixCacheConfig(unaligned_tail="drop").unaligned_tail == "drop"
    with pytest.raises(ValueError):
        ulacache.PrefixCacheConfig(unaligned_tail="trim")
    cache.check_invariants()


def test_a_window_only_cache_matches_at_a_node_boundary():
    """no state kind (a pure SWA model): no checkpoints, no dummy states."""
    buf = buffer()
    config = ulacache.PrefixCacheConfig(page_tokens=1, state_kind=-1, window_kind=SWA, sliding_window=5)
    assert config.state_kind == -1
    cache = ulacache.PrefixCache(config, buf)
    for t in (toks(1, 7), np.array([1, 2, 3, 4, 5, 60, 70], dtype=np.uint32)):
        ids = buf.allocate([0, len(t), len(t)])
        cache.insert(t, ids[:len(t)], [], ids[len(t):].astype(np.int64))
    m = cache.match(toks(1, 5), 5)
    assert m.length == 5 and m.checkpoint_state is None and cache.num_checkpoints == 0
    # Chunked prefill with window pages: the released first pages stay window tombstones.
    ids = buf.allocate([0, 6, 6])
    window = ids[6:].astype(np.int64)
    buf.free(ids[6])
    window[0] = -1  # released: outside the window of 6 (tokens [2, 6))
    held = cache.match(toks(90, 90), 0)
    chunk = cache.insert_chunk(toks(90, 95), ids[:6], [], held, window)
    assert chunk.length == 6 and list(chunk.window_pages) == [-1, -1] + list(window[2:])
    cache.unlock(chunk)
    with pytest.raises(ulacache.InvalidArgumentError):
        cache.attach_host_tier(buf, 2)  # a host tier holds checkpoints: none here
    cache.check_invariants()
