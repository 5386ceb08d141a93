"""One byte stream over several connections, in order: a bulk transfer no single ssh
stream can carry at the link's speed (one stream's cipher runs on one core). Run on a
node's host python3 (stdlib only) by lib/bulk.sh stripe (the head's image stream and
weights copy, each image relay hop):

    python3 -c SRC split PIPE...   (the sender: stdin cut into chunks, sent round robin
                                    to the named pipes, each one ssh connection's stdin)
    python3 -c SRC join PIPE...    (the receiver: the pipes, each one connection's
                                    output, read back in that order to stdout)

Each chunk goes as an 8-byte big-endian length and its bytes; a zero length ends a pipe.
Every pipe must end with that zero, so a cut connection is an error (exit 1), never a
short stream passed on as whole. Each pipe has a thread of its own on both ends and a
few chunks of room, so the connections move at once, not in turn.

`join` removes each named pipe as soon as it is open (and the pipes' folder once empty):
nothing stays on the node. It gives up (exit 1) after IDLE_S seconds without a chunk,
or at once when any pipe breaks. Exit 2 on bad arguments.
"""

from __future__ import annotations

# What this probe does (sparkvllm.probes.revision): bump it when that changes, not for
# wording, comments or layout; a step that runs it re-runs then.
# revision: 1
import contextlib
import os
import queue
import struct
import sys
import threading
from typing import BinaryIO

CHUNK = 4 << 20  # bytes a chunk carries at most
DEPTH = 3  # chunks waiting per pipe, at most: memory is about PIPES x (DEPTH + 2) x CHUNK
IDLE_S = 300.0  # how long the receiver waits for a chunk before it gives up
HEADER = struct.Struct(">Q")


class Broken(Exception):
    """A pipe failed: the transfer is not whole."""


def _say(message: str) -> None:
    print(f"stripe: {message}", file=sys.stderr, flush=True)


def split(paths: list[str], source: BinaryIO) -> int:
    failed = threading.Event()
    # A pipe's chunks, then None: its end.
    queues: list[queue.Queue[bytes | None]] = [queue.Queue(DEPTH) for _ in paths]

    def send(path: str, chunks: queue.Queue[bytes | None]) -> None:
        try:
            with open(path, "wb") as out:
                while (chunk := chunks.get()) is not None:
                    out.write(HEADER.pack(len(chunk)))
                    out.write(chunk)
                out.write(HEADER.pack(0))
        except OSError as e:
            _say(f"{path}: {e}")
            failed.set()
            while chunks.get() is not None:  # the reader never blocks on a dead pipe
                pass

    threads = [
        threading.Thread(target=send, args=pq, daemon=True)
        for pq in zip(paths, queues, strict=True)
    ]
    for t in threads:
        t.start()
    i = 0
    while not failed.is_set() and (chunk := source.read(CHUNK)):
        queues[i % len(paths)].put(chunk)
        i += 1
    for q in queues:
        q.put(None)
    for t in threads:
        t.join()
    return 1 if failed.is_set() else 0


def _read_exact(source: BinaryIO, size: int, path: str) -> bytes:
    data = source.read(size)
    if len(data) != size:
        raise Broken(f"{path}: cut off ({len(data)} of {size} bytes)")
    return data


def join(paths: list[str], out: BinaryIO) -> int:
    queues: list[queue.Queue[bytes | None]] = [queue.Queue(DEPTH) for _ in paths]
    problems: list[str] = []  # a receiver's failure, seen by the writer within a second
    opened: set[str] = set()

    def receive(path: str, chunks: queue.Queue[bytes | None]) -> None:
        try:
            with open(path, "rb") as source:
                opened.add(path)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                while size := HEADER.unpack(_read_exact(source, HEADER.size, path))[0]:
                    if size > CHUNK:
                        raise Broken(f"{path}: a chunk of {size} bytes (at most {CHUNK})")
                    chunks.put(_read_exact(source, size, path))
                chunks.put(None)
        except (OSError, Broken) as e:
            problems.append(str(e))

    for pq in zip(paths, queues, strict=True):
        threading.Thread(target=receive, args=pq, daemon=True).start()
    try:
        i = ended = 0
        while ended < len(paths):
            chunk = _next(queues[i % len(paths)], problems)
            i += 1
            if chunk is None:
                ended += 1
            elif ended:
                raise Broken("a pipe went on after another had ended")
            else:
                out.write(chunk)
        out.flush()
        return 0
    except (Broken, OSError) as e:
        _say(str(e))
        return 1
    finally:
        for p in paths:
            if p not in opened:
                with contextlib.suppress(OSError):
                    os.unlink(p)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(os.path.abspath(paths[0])))


def _next(chunks: queue.Queue[bytes | None], problems: list[str]) -> bytes | None:
    """The next item of `chunks`; a failure of any pipe ends the wait within a second."""
    waited = 0.0
    while True:
        if problems:
            raise Broken(problems[0])
        try:
            return chunks.get(timeout=1.0)
        except queue.Empty:
            waited += 1.0
            if waited >= IDLE_S:
                raise Broken(f"no chunk for {IDLE_S:.0f} s") from None


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("split", "join"):
        _say("usage: split|join PIPE...")
        return 2
    if argv[0] == "split":
        return split(argv[1:], sys.stdin.buffer)
    return join(argv[1:], sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
