#!/usr/bin/env python3
"""A KV-aware router fed by UlaCache's prefix cache: the events go out as SGLang's and
vLLM's KVEventBatch (ulacache.KvEventPublisher: msgpack over a ZeroMQ PUB socket), and the
router (a SUB socket, pyzmq and msgpack, nothing of UlaCache's) rebuilds each medium's block
set from them, as SGLang's model gateway, vLLM's routers and Dynamo's KV indexer do.

The router checks every message as it decodes it: three frames [topic, sequence number,
payload], sequence numbers without gaps after the first it received, the schema of every
event (msgspec's array_like, tagged), each stored block's hash recomputed with hashlib as
SGLang defines it (get_hash_str / hash_str_to_int64: SHA-256 over the parent's digest and
each token as 4 bytes little-endian, the first 8 bytes as a signed 64-bit integer), and that
a removal removes a block it holds. AllBlocksCleared empties its view. It scores a request
as a router would: the number of the request's leading full blocks a medium holds
(RouterView.prefix_blocks).

The driver runs a randomized workload on a hybrid prefix cache with a host tier (inserts,
copy-on-write matches that bring KV back from the host, evictions by count, a long request's
demand that offloads KV to the host, a reset half-way), publishes the events after every
operation, lets the router drain them, and at the end checks that the router's multiset of
blocks per (medium, group) equals the cache's own (PrefixCache.stored_blocks). Exit 1 if not.

Usage: python3 examples/kv_router.py [--steps N] [--seed S] [--json]
The in-tree build is found without installing (<repo>/build/python, or ULA_BUILD_DIR).
"""
import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import msgpack
import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[1]


class Bad(Exception):
    """A message that breaks the wire format or the router's view."""


def check(cond, what):
    if not cond:
        raise Bad(what)


def signed64(digest):
    v = int.from_bytes(digest[:8], "big")
    return v - 2**64 if v >= 2**63 else v


def block_hash(parent_digest, tokens):
    """SGLang's block hash: (full SHA-256 digest, its signed 64-bit head)."""
    h = hashlib.sha256()
    if parent_digest is not None:
        h.update(parent_digest)
    for t in tokens:
        h.update(int(t).to_bytes(4, "little", signed=False))
    d = h.digest()
    return d, signed64(d)


class RouterView:
    """The blocks one engine instance holds, per (medium, group): group 0 the KV pages, group 1
    the window pages (vLLM's group_idx of a hybrid model's sliding-window group)."""

    def __init__(self, block_size, sliding_window):
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.blocks = {}  # (medium, group, hash) -> count
        self.digest = {}  # hash -> full SHA-256 digest (to chain a child's hash)
        self.events = 0
        self.removed_events = 0
        self.cleared = 0
        self.hashes_checked = 0
        self.stored_on = {"GPU": 0, "CPU": 0}  # blocks stored per medium, ever

    def stored(self, ev):
        check(len(ev) in (8, 12), f"BlockStored with {len(ev)} fields")
        _, hashes, parent, tokens, block_size, lora_id, medium, lora_name = ev[:8]
        check(isinstance(hashes, list) and hashes and all(isinstance(h, int) for h in hashes), "block_hashes")
        check(parent is None or isinstance(parent, int), "parent_block_hash")
        check(block_size == self.block_size, f"block_size {block_size}")
        check(lora_id is None and lora_name is None, "lora fields")
        check(medium in ("GPU", "CPU"), f"medium {medium!r}")
        group = 0
        if len(ev) == 12:
            extra_keys, group, kind, window = ev[8:]
            check(extra_keys is None and group == 1 and kind == "sliding_window" and window == self.sliding_window,
                  f"window group fields {ev[8:]}")
        check(len(tokens) <= len(hashes) * block_size and len(tokens) > (len(hashes) - 1) * block_size,
              f"{len(tokens)} tokens for {len(hashes)} blocks")
        prior = parent
        for k, h in enumerate(hashes):
            page = tokens[k * block_size:(k + 1) * block_size]
            if prior is not None:
                check(prior in self.digest, f"parent {prior} was never stored")
            d, mine = block_hash(self.digest.get(prior) if prior is not None else None, page)
            check(mine == h, f"hash {h} ({medium}, tokens {page}, parent {prior}) is not SGLang's hash of its tokens and parent")
            self.hashes_checked += 1
            self.digest[h] = d
            key = (medium, group, h)
            self.blocks[key] = self.blocks.get(key, 0) + 1
            self.stored_on[medium] += 1
            prior = h

    def removed(self, ev):
        check(len(ev) in (3, 4), f"BlockRemoved with {len(ev)} fields")
        hashes, medium = ev[1], ev[2]
        group = ev[3] if len(ev) == 4 else 0
        check(medium in ("GPU", "CPU") and group in (0, 1), f"medium {medium!r} group {group!r}")
        self.removed_events += 1
        for h in hashes:
            key = (medium, group, h)
            check(self.blocks.get(key, 0) > 0, f"removed {key}, which is not stored")
            self.blocks[key] -= 1
            if self.blocks[key] == 0:
                del self.blocks[key]

    def batch(self, payload):
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=True)
        check(isinstance(batch, list) and len(batch) in (2, 3), "KVEventBatch is [ts, events(, dp_rank)]")
        check(isinstance(batch[0], float) and isinstance(batch[1], list), f"ts and events: {batch!r:.200}")
        for ev in batch[1]:
            check(isinstance(ev, list) and ev and isinstance(ev[0], str), "a tagged event")
            self.events += 1
            if ev[0] == "BlockStored":
                self.stored(ev)
            elif ev[0] == "BlockRemoved":
                self.removed(ev)
            elif ev[0] == "AllBlocksCleared":
                check(len(ev) == 1, "AllBlocksCleared has no fields")
                self.blocks.clear()
                self.cleared += 1
            else:
                raise Bad(f"unknown event {ev[0]!r}")

    def prefix_blocks(self, tokens, media=("GPU",)):
        """The router's score of a request on this instance: how many of its leading full
        blocks (KV group) one of `media` holds."""
        n, parent = 0, None
        for k in range(len(tokens) // self.block_size):
            parent, h = block_hash(parent, tokens[k * self.block_size:(k + 1) * self.block_size])
            if not any(self.blocks.get((m, 0, h), 0) for m in media):
                break
            n += 1
        return n

    def sorted_blocks(self):
        return sorted((m, g, h) for (m, g, h), n in self.blocks.items() for _ in range(n))


class Router:
    """A SUB socket on one instance's publisher and the view it rebuilds."""

    def __init__(self, endpoint, block_size, sliding_window):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.view = RouterView(block_size, sliding_window)
        self.last_seq = None
        self.messages = 0

    def drain(self, timeout_ms=0):
        """Applies every message that arrives within timeout_ms (then whatever is queued)."""
        got = 0
        while self.sock.poll(timeout_ms if got == 0 else 0):
            frames = self.sock.recv_multipart()
            check(len(frames) == 3 and len(frames[1]) == 8, "three frames: topic, seq, payload")
            seq = int.from_bytes(frames[1], "big")
            check(self.last_seq is None or seq == self.last_seq + 1, f"seq {seq} after {self.last_seq}")
            self.last_seq = seq
            self.messages += 1
            self.view.batch(frames[2])
            got += 1
        return got

    def close(self):
        self.sock.close(linger=0)


STATE, KV = 0, 1
PAGE = 2  # tokens per page


def import_ulacache():
    build = Path(os.environ.get("ULA_BUILD_DIR") or REPO / "build") / "python"
    if (build / "ulacache").is_dir():
        sys.path.insert(0, str(build))
    import ulacache
    return ulacache


def run(ulacache, steps, seed):
    rng = np.random.default_rng(seed)
    unit = 64
    buf = ulacache.UnifiedBuffer(ulacache.UnifiedBufferConfig(
        48 * unit, [("state", unit, "low"), ("kv", unit, "high"), ("swa", unit, "low")], padding_kind=KV))
    cache = ulacache.PrefixCache(ulacache.PrefixCacheConfig(page_tokens=PAGE, record_events=True), buf)
    cache.attach_host_tier(buf, 4, 12)
    publisher = ulacache.KvEventPublisher(ulacache.KvEventPublisherConfig(
        endpoint="tcp://127.0.0.1:*", block_size=PAGE, sliding_window=0))
    router = Router(publisher.endpoint, PAGE, 0)
    # PUB drops what it sends before the subscription arrives: heartbeats until one lands.
    for _ in range(400):
        publisher.publish([], 0.0)
        if router.drain(25):
            break
    check(router.messages > 0, "the router never received a heartbeat")
    bases = [rng.integers(1, 51, 12).astype(np.uint32) for _ in range(4)]

    def tokens():
        base = bases[rng.integers(len(bases))]
        t = list(base[:rng.integers(len(base) + 1)]) + list(rng.integers(1, 4, rng.integers(5)))
        return np.asarray(t or [1], np.uint32)

    counts = {"inserts": 0, "matches": 0, "host_loads": 0, "offloaded_pages": 0, "routed_hits": 0}
    last = None
    for step in range(steps):
        what = rng.integers(10)
        if step == steps // 2:
            cache.reset()  # AllBlocksCleared in the middle
        elif what < 5:
            t = tokens()
            demand = [1, -(-len(t) // PAGE), 0]
            try:
                if not buf.can_allocate(demand):
                    counts["offloaded_pages"] += cache.make_room(buf, demand).offloaded_pages
            except ulacache.ResourceExhaustedError:
                continue
            ids = buf.allocate(demand)
            cache.insert(t, ids[1:], [(len(t), int(ids[0]), -1)])
            counts["inserts"] += 1
        elif what < 8:
            t = tokens()
            # The router's score first (what it knows), then the instance's match.
            counts["routed_hits"] += router.view.prefix_blocks(t, ("GPU", "CPU")) > 0
            before = cache.metrics().host_page_hits
            try:
                m = cache.match_copy_on_write(t, len(t))
            except ulacache.ResourceExhaustedError:
                continue
            if m.length == 0:
                continue
            counts["matches"] += 1
            counts["host_loads"] += cache.metrics().host_page_hits > before
            cache.unlock(m)
            buf.free(m.copy_state)
        elif what < 9:
            cache.evict(int(rng.integers(4)), int(rng.integers(2)))
        else:  # a long request's demand: KV moves to the host
            try:
                counts["offloaded_pages"] += cache.make_room(buf, [0, 40, 0]).offloaded_pages
            except ulacache.ResourceExhaustedError:
                pass
        last = publisher.publish(cache.take_events(), float(step))
        while router.last_seq != last:  # the router is current before the next request is scored
            check(router.drain(5000), f"nothing for 5 s (last seq {router.last_seq}, end {last})")
    cache.check_invariants()
    theirs = router.view.sorted_blocks()
    ours = sorted((e.medium, 1 if e.window else 0, e.hash) for e in cache.stored_blocks())
    router.close()
    v = router.view
    return {"steps": steps, "messages": router.messages, "events": v.events, "removals": v.removed_events,
            "cleared": v.cleared, "hashes_checked": v.hashes_checked,
            "stored_gpu": v.stored_on["GPU"], "stored_cpu": v.stored_on["CPU"],
            "blocks_gpu": sum(1 for b in theirs if b[0] == "GPU"), "blocks_cpu": sum(1 for b in theirs if b[0] == "CPU"),
            **counts, "router_matches_cache": theirs == ours}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    out = run(import_ulacache(), args.steps, args.seed)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"kv router: {out['steps']} cache operations -> {out['messages']} messages, {out['events']} events "
              f"({out['removals']} removals, {out['cleared']} clears), {out['hashes_checked']} block hashes recomputed")
        print(f"  {out['inserts']} inserts, {out['matches']} matches ({out['host_loads']} brought KV back from the host), "
              f"{out['offloaded_pages']} pages offloaded; the router scored a prefix hit for {out['routed_hits']} requests")
        verdict = "equals" if out["router_matches_cache"] else "DIFFERS from"
        print(f"  the router's view ({out['blocks_gpu']} GPU + {out['blocks_cpu']} CPU blocks) {verdict} the cache's")
    return 0 if out["router_matches_cache"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Bad as e:
        print(f"kv router: {e}", file=sys.stderr)
        sys.exit(1)
