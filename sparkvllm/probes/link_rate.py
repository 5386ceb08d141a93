"""What the cluster link carries now, over TCP: a bounded transfer of zeros, measured where
it arrives. Run on a node's host python3 (stdlib only) by scripts/link_rate.sh:

    python3 -c SRC receive BIND_ADDRESS PEER_ADDRESS STREAMS SECONDS
        listens on BIND_ADDRESS (a port the kernel picks), prints `port=N` at once, takes
        STREAMS connections from PEER_ADDRESS (any other is closed unread), reads them to
        their end, then prints `bytes=`, `seconds=` (first byte to last) and `gbit=`.
        It gives up SECONDS + 15 s after it started listening.
    python3 -c SRC send ADDRESS PORT STREAMS SECONDS MAX_BYTES
        STREAMS connections to ADDRESS:PORT, each sending zeros until SECONDS have passed
        or its share of MAX_BYTES is sent; prints `sent=`.

The bytes are zeros: TCP does not compress, and nothing of the node's is read or sent.
Several streams: one TCP stream on one core does not fill a fast link (the link, not the
sender's core, is what is measured). Exit 2 on bad arguments, 1 when nothing arrived.
"""

from __future__ import annotations

# What this probe does (sparkvllm.probes.revision): bump it when that changes, not for
# wording, comments or layout; a step that runs it re-runs then.
# revision: 1
import socket
import sys
import threading
import time

BLOCK = 1 << 20  # each send and receive moves up to 1 MiB
GRACE_S = 15.0  # how long past SECONDS a receiver waits for its streams


def receive(bind: str, peer: str, streams: int, seconds: float) -> int:
    server = socket.create_server((bind, 0), backlog=streams)
    print(f"port={server.getsockname()[1]}", flush=True)
    deadline = time.monotonic() + seconds + GRACE_S
    totals: list[int] = []
    marks: list[float] = []
    lock = threading.Lock()

    def drain(conn: socket.socket) -> None:
        buf = bytearray(BLOCK)
        view = memoryview(buf)
        got = 0
        first = last = 0.0
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            while n := conn.recv_into(view):
                last = time.monotonic()
                first = first or last
                got += n
        except OSError:
            pass
        finally:
            conn.close()
        with lock:
            totals.append(got)
            if got:
                marks.extend((first, last))

    readers: list[threading.Thread] = []
    while len(readers) < streams and time.monotonic() < deadline:
        server.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, (address, *_rest) = server.accept()
        except OSError:
            break
        if address != peer:
            conn.close()
            continue
        reader = threading.Thread(target=drain, args=(conn,), daemon=True)
        reader.start()
        readers.append(reader)
    server.close()
    for reader in readers:
        reader.join(max(0.0, deadline - time.monotonic()))
    total = sum(totals)
    span = (max(marks) - min(marks)) if marks else 0.0
    print(f"bytes={total}")
    print(f"seconds={span:.3f}")
    print(f"gbit={total * 8 / span / 1e9:.3f}" if span > 0 else "gbit=")
    return 0 if total else 1


def send(address: str, port: int, streams: int, seconds: float, max_bytes: int) -> int:
    block = bytes(BLOCK)
    share = max(BLOCK, max_bytes // streams)
    sent: list[int] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def pour() -> None:
        done = 0
        try:
            with socket.create_connection((address, port), timeout=10) as conn:
                while done < share and time.monotonic() < stop:
                    conn.sendall(block)
                    done += len(block)
        except OSError as e:
            print(f"send: {e}", file=sys.stderr)
        with lock:
            sent.append(done)

    pourers = [threading.Thread(target=pour, daemon=True) for _ in range(streams)]
    for p in pourers:
        p.start()
    for p in pourers:
        p.join(seconds + GRACE_S)
    print(f"sent={sum(sent)}")
    return 0 if sum(sent) else 1


def main(argv: list[str]) -> int:
    try:
        if argv[1:2] == ["receive"] and len(argv) == 6:
            return receive(argv[2], argv[3], int(argv[4]), float(argv[5]))
        if argv[1:2] == ["send"] and len(argv) == 7:
            return send(argv[2], int(argv[3]), int(argv[4]), float(argv[5]), int(argv[6]))
    except ValueError:
        pass
    print(f"usage: {__doc__.splitlines()[3].strip()} | ... send ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
