"""The KV event publisher from Python and the example router (examples/kv_router.py): a
randomized run of a hybrid prefix cache with a host tier whose events go over ZeroMQ to a
router that rebuilds each medium's block set and must end equal to the cache's own; the
router refuses a forged block and a gap in the sequence numbers; a bad publisher config is
refused with the field named."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ulacache = pytest.importorskip("ulacache")
pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import kv_router  # noqa: E402

sys.path.pop(0)


def test_the_router_rebuilds_the_caches_blocks_over_zeromq(capsys):
    assert kv_router.main(["--steps", "300", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["router_matches_cache"]
    assert out["removals"] > 0 and out["cleared"] == 1 and out["hashes_checked"] > 100
    assert out["offloaded_pages"] > 0 and out["stored_cpu"] > 0  # the host medium is exercised


def small_cache():
    buf = ulacache.UnifiedBuffer(ulacache.UnifiedBufferConfig(
        32 * 64, [("state", 64, "low"), ("kv", 64, "high")], padding_kind=1))
    cache = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=2, record_events=True), buf)
    t = np.arange(1, 7, dtype=np.uint32)
    ids = buf.allocate([1, 3])
    cache.insert(t, ids[1:], [(6, int(ids[0]), -1)])
    return cache, t


def test_encode_is_the_wire_payload_and_the_view_scores_prefixes():
    cache, t = small_cache()
    pub = ulacache.KvEventPublisher(ulacache.KvEventPublisherConfig(endpoint="tcp://127.0.0.1:*", block_size=2))
    view = kv_router.RouterView(2, 0)
    view.batch(pub.encode(cache.take_events(), 1.0))
    assert len(view.blocks) == 3 and view.hashes_checked == 3
    assert view.prefix_blocks(t) == 3 and view.prefix_blocks(np.array([1, 2, 9, 9], np.uint32)) == 1
    assert view.prefix_blocks(t, ("CPU",)) == 0
    assert sorted(view.sorted_blocks()) == sorted((e.medium, 0, e.hash) for e in cache.stored_blocks())


def test_the_router_refuses_a_forged_block_and_a_removal_it_never_saw():
    cache, _ = small_cache()
    pub = ulacache.KvEventPublisher(ulacache.KvEventPublisherConfig(endpoint="tcp://127.0.0.1:*", block_size=2))
    batch = msgpack.unpackb(pub.encode(cache.take_events(), 1.0), raw=False)
    stored = next(ev for ev in batch[1] if ev[0] == "BlockStored")
    stored[3][0] += 1  # a token that does not hash to the block's hash
    with pytest.raises(kv_router.Bad, match="not SGLang's hash"):
        kv_router.RouterView(2, 0).batch(msgpack.packb(batch))
    with pytest.raises(kv_router.Bad, match="which is not stored"):
        kv_router.RouterView(2, 0).batch(msgpack.packb([1.0, [["BlockRemoved", [42], "GPU"]]]))


def test_bad_publisher_config_is_refused_with_the_field_named():
    with pytest.raises(ulacache.InvalidArgumentError, match="block_size"):
        ulacache.KvEventPublisherConfig(block_size=0).validate()
    with pytest.raises(ulacache.InvalidArgumentError):
        ulacache.KvEventPublisher(ulacache.KvEventPublisherConfig(endpoint="tcp://127.0.0.1:*", block_size=0))
    c = ulacache.KvEventPublisherConfig(endpoint="tcp://127.0.0.1:*", topic="kv", block_size=4, data_parallel_rank=3)
    assert (c.topic, c.block_size, c.data_parallel_rank, c.sliding_window) == ("kv", 4, 3, 0)
