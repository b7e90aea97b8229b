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
import json
import sys
from pathlib import Path

import msgpack
import zmq

# The router's view is the example router's (one implementation): examples/kv_router.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from kv_router import Bad, RouterView as View, check  # noqa: E402


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
