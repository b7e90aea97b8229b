"""A KV-aware router's view of a ula prefix cache, in its own process (kv_event_wire_test).

Subscribes to a KvEventPublisher over ZeroMQ, decodes every KVEventBatch with msgpack
exactly as SGLang's and vLLM's msgspec structs lay it out (array_like, tagged), and rebuilds
the multiset of stored blocks per (medium, group). It checks, message by message: three
frames, sequence numbers without gaps, the schema of every event, each stored block's hash
recomputed with hashlib as SGLang's get_hash_str / hash_str_to_int64 define it (SHA-256 over
the parent's digest and each token as 4 bytes little-endian), and that a removal removes a
block that was stored. AllBlocksCleared empties the view.

Protocol with the test (stdin / stdout, one line each):
  argv: endpoint block_size sliding_window
  out "ready"                  after the first message arrived (the test sends heartbeats till then)
  in  "end <seq>"              the last sequence number the test published
  out one JSON object          {"blocks": [[medium, group, hash], ...], "messages": n, "events": n,
                                "hashes_checked": n}, or {"error": "..."}; exit status 1 on error
"""
import hashlib
import json
import sys

import msgpack
import zmq


class Bad(Exception):
    pass


def signed64(digest):
    v = int.from_bytes(digest[:8], "big")
    return v - 2**64 if v >= 2**63 else v


def check(cond, what):
    if not cond:
        raise Bad(what)


class View:
    def __init__(self, block_size, sliding_window):
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.blocks = {}  # (medium, group, hash) -> count
        self.digest = {}  # hash -> full SHA-256 digest (to chain a child's hash)
        self.events = 0
        self.hashes_checked = 0

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
            hasher = hashlib.sha256()
            if prior is not None:
                check(prior in self.digest, f"parent {prior} was never stored")
                hasher.update(self.digest[prior])
            for t in page:
                hasher.update(int(t).to_bytes(4, "little", signed=False))
            d = hasher.digest()
            check(signed64(d) == h, f"hash {h} ({medium}, tokens {page}, parent {prior}) is not SGLang's hash of its tokens and parent")
            self.hashes_checked += 1
            self.digest[h] = d
            key = (medium, group, h)
            self.blocks[key] = self.blocks.get(key, 0) + 1
            prior = h

    def removed(self, ev):
        check(len(ev) in (3, 4), f"BlockRemoved with {len(ev)} fields")
        hashes, medium = ev[1], ev[2]
        group = ev[3] if len(ev) == 4 else 0
        check(medium in ("GPU", "CPU") and group in (0, 1), f"medium {medium!r} group {group!r}")
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
            else:
                raise Bad(f"unknown event {ev[0]!r}")


def main():
    endpoint, block_size, sliding_window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    check(endpoint.startswith("tcp://127.0.0.1:"), "loopback only")
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    view = View(block_size, sliding_window)
    last_seq, end_seq, messages = None, None, 0
    while end_seq is None or last_seq != end_seq:
        ready = dict(poller.poll(20000))
        check(ready, f"nothing for 20 s (last seq {last_seq}, end {end_seq})")
        if sys.stdin.fileno() in ready:
            line = sys.stdin.readline().split()
            check(len(line) == 2 and line[0] == "end", f"bad control line {line}")
            end_seq = int(line[1])
            poller.unregister(sys.stdin.fileno())
        if sock not in ready:
            continue
        frames = sock.recv_multipart()
        check(len(frames) == 3 and len(frames[1]) == 8, "three frames: topic, seq, payload")
        seq = int.from_bytes(frames[1], "big")
        check(last_seq is None or seq == last_seq + 1, f"seq {seq} after {last_seq}")
        if last_seq is None:
            print("ready", flush=True)
        last_seq = seq
        messages += 1
        view.batch(frames[2])
    blocks = sorted([m, g, h] for (m, g, h), n in view.blocks.items() for _ in range(n))
    print(json.dumps({"blocks": blocks, "messages": messages, "events": view.events,
                      "hashes_checked": view.hashes_checked}), flush=True)


if __name__ == "__main__":
    try:
        main()
    except (Bad, msgpack.exceptions.ExtraData, ValueError) as e:
        print(json.dumps({"error": str(e)}), flush=True)
        sys.exit(1)
