"""One byte stream over several connections, in order: a bulk transfer no single ssh
stream can carry at the link's speed (one stream's cipher runs on one core). Run on a
node's host python3 (stdlib only; 3.9 or later where it receives) by lib/bulk.sh stripe
(the head's image stream and weights copy, each image relay hop) and by the weights
copy's `take` on the target:

    python3 -c SRC split PIPE...
        the sender: stdin cut into chunks sent round robin to the named pipes, each one
        connection's stdin. A regular file goes from the page cache into the pipes
        (sendfile), never through this process.
    python3 -c SRC hand FOLDER I N
        the receiving node's end of connection I of N: its stdin (the connection's bytes)
        handed to the joiner listening in FOLDER (the file descriptor itself, passed over
        a unix socket: the bytes never go through this process); then it waits for the
        joiner's word and exits with it.
    python3 -c SRC join SOURCE [--into FILE --at N]
        the receiver: the connections handed in the folder SOURCE read back in order, or
        (SOURCE `-`) its own stdin as it comes; to stdout, or into FILE after its first N
        bytes, then the sha256 of the whole of FILE printed (the N bytes kept hashed
        while the rest arrives, the rest as it is written: no second read, no pipe).

Each chunk goes as an 8-byte big-endian length and its bytes; a zero length ends a
connection. Every connection must end with that zero, so a cut one is an error (exit 1),
never a short stream passed on as whole: what FILE holds then is still a prefix of the
stream (its bytes are written in order), which a next copy resumes from. Each
connection has a thread of its own on both ends and a few chunks of room, so they move
at once, not in turn.

`join` removes its socket and the folder once every connection is handed in: nothing
stays on the node. It gives up (exit 1) after IDLE_S seconds without a byte, or at once
when any connection breaks; a `hand` whose joiner is gone exits 1. Exit 2 on bad
arguments.
"""

from __future__ import annotations

# What this probe does (sparkvllm.probes.revision): bump it when that changes, not for
# wording, comments or layout; a step that runs it re-runs then.
# revision: 2
import contextlib
import errno
import hashlib
import os
import queue
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable

CHUNK = 1 << 20  # bytes a chunk carries at most
# Bytes one write moves at most. Measured on this kernel (6.18, overlayfs on ext4), a GB
# read from an ssh stream and written to a file in writes of 1 MiB took 5.4-5.7 s (6.4-7.3
# core-s) beside a deployed model, and in writes of 256 KiB 3.5-3.7 s (4.2-4.5 core-s):
# perf puts the time in the copy into the page cache (copy_folio_from_iter_atomic), and
# writes of 4 MiB cost 3 to 10 times more again.
WRITE = 256 << 10
DEPTH = 8  # chunks waiting per connection, at most: memory is about N x (DEPTH + 3) x CHUNK
IDLE_S = 300.0  # how long a receiver waits for a byte (or a connection) before it gives up
OPEN_S = 30.0  # how long the sender waits for a connection to open its pipe
HEADER = struct.Struct(">Q")
SOCKET = "s"  # the joiner's unix socket, in its folder (a relative name: no path limit)

# A chunk on its way: its buffer, how many bytes of it count, and where the buffer goes
# back once they are written (and hashed).
Item = tuple[bytearray, int, "queue.Queue[bytearray]"]
Reader = Callable[[int, int, "queue.Queue[Item | None]"], None]  # connection, fd, its chunks


class Broken(Exception):
    """A connection failed: the transfer is not whole."""


def _say(message: str) -> None:
    print(f"stripe: {message}", file=sys.stderr, flush=True)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data[:WRITE]) :]


# ---- the sender ----


def _open_pipe(path: str) -> int:
    """The named pipe, opened to write once its connection has it open to read. Never a
    wait for good: a connection that ended before it opened it is an error after OPEN_S."""
    deadline = time.monotonic() + OPEN_S
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            if e.errno != errno.ENXIO or time.monotonic() > deadline:  # ENXIO: no reader yet
                raise OSError(e.errno, f"no connection opened it in {OPEN_S:.0f} s") from None
            time.sleep(0.05)
    os.set_blocking(fd, True)
    return fd


def split(paths: list[str], fd: int) -> int:
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return _split_file(paths, fd, os.lseek(fd, 0, os.SEEK_CUR), os.fstat(fd).st_size)
    return _split_stream(paths, fd)


def _give_up(path: str, e: OSError) -> None:
    """One connection failed: the whole transfer has. Exit at once, so that every pipe
    closes (the other connections' threads may be blocked writing into pipes the far
    joiner no longer reads)."""
    _say(f"{path}: {e}")
    os._exit(1)


def _split_file(paths: list[str], fd: int, start: int, end: int) -> int:
    """Chunk k of the file (from `start`) to pipe k mod N, each pipe's thread sending its
    own chunks straight from the page cache."""
    chunks = max(0, -(-(end - start) // CHUNK))

    def send(i: int, path: str) -> None:
        try:
            out = _open_pipe(path)
            for k in range(i, chunks, len(paths)):
                offset = start + k * CHUNK
                size = min(CHUNK, end - offset)
                _write_all(out, memoryview(HEADER.pack(size)))
                while size:
                    sent = os.sendfile(out, fd, offset, size)
                    if not sent:
                        raise OSError("the file ended early")
                    offset, size = offset + sent, size - sent
            _write_all(out, memoryview(HEADER.pack(0)))
            os.close(out)
        except OSError as e:
            _give_up(path, e)

    threads = [threading.Thread(target=send, args=(i, p)) for i, p in enumerate(paths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


def _split_stream(paths: list[str], fd: int) -> int:
    # A pipe's chunks, then None: its end.
    queues: list[queue.Queue[bytes | None]] = [queue.Queue(DEPTH) for _ in paths]

    def send(path: str, chunks: queue.Queue[bytes | None]) -> None:
        try:
            with os.fdopen(_open_pipe(path), "wb") as out:
                while (chunk := chunks.get()) is not None:
                    out.write(HEADER.pack(len(chunk)))
                    out.write(chunk)
                out.write(HEADER.pack(0))
        except OSError as e:
            _give_up(path, e)

    threads = [
        threading.Thread(target=send, args=(path, queues[i]), daemon=True)
        for i, path in enumerate(paths)  # (no zip(strict=): python 3.9 runs this too)
    ]
    for t in threads:
        t.start()
    source = os.fdopen(fd, "rb", closefd=False)
    i = 0
    while chunk := source.read(CHUNK):
        queues[i % len(paths)].put(chunk)
        i += 1
    for q in queues:
        q.put(None)
    for t in threads:
        t.join()
    return 0


# ---- the receiving node: each connection's end ----


def hand(folder: str, index: int, count: int) -> int:
    """This connection's stdin to the joiner in `folder`; then its word."""
    deadline = time.monotonic() + IDLE_S
    folder = os.path.abspath(folder)
    while True:
        link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.chdir(folder)  # (the socket by its relative name, as the joiner binds it)
            link.connect(SOCKET)
            break
        except (FileNotFoundError, ConnectionRefusedError) as e:
            link.close()
            # The joiner is not listening yet; its folder gone means it ended.
            if not os.path.isdir(folder) or time.monotonic() > deadline:
                _say(f"connection {index}: no joiner in {folder} ({e.strerror})")
                return 1
            time.sleep(0.05)
    with link:
        socket.send_fds(link, [f"{index} {count}".encode()], [0])
        os.close(0)
        word = link.recv(1)
    return 0 if word == b"\0" else 1


# ---- the receiver ----


class _Sources:
    """Where the stream comes from: its connections in order, each read by a thread of
    its own into buffers of its own (a few chunks ahead of the writer)."""

    def __init__(self, fds: list[int], framed: bool) -> None:
        self.queues: list[queue.Queue[Item | None]] = [queue.Queue(DEPTH) for _ in fds]
        self.problems: list[str] = []  # a reader's failure, seen by the writer within a second
        self.last = time.monotonic()  # when a byte last came in, on any connection
        for i, fd in enumerate(fds):
            read = self._framed if framed else self._raw
            threading.Thread(target=self._run, args=(read, i, fd), daemon=True).start()

    def _run(self, read: Reader, i: int, fd: int) -> None:
        try:
            read(i, fd, self.queues[i])
        except (OSError, Broken) as e:
            self.problems.append(str(e))

    def _fill(self, fd: int, view: memoryview) -> int:
        """Bytes read into `view` until it is full or the stream ends."""
        n = 0
        while n < len(view):
            got = os.readv(fd, [view[n:]])
            if not got:
                break
            n += got
            self.last = time.monotonic()
        return n

    def _free(self) -> queue.Queue[bytearray]:
        free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(DEPTH + 2):
            free.put(bytearray(CHUNK))
        return free

    def _framed(self, i: int, fd: int, out: queue.Queue[Item | None]) -> None:
        free, header = self._free(), bytearray(HEADER.size)
        while True:
            if self._fill(fd, memoryview(header)) != HEADER.size:
                raise Broken(f"connection {i}: cut off (no end mark)")
            (size,) = HEADER.unpack(header)
            if not size:
                out.put(None)
                return
            if size > CHUNK:
                raise Broken(f"connection {i}: a chunk of {size} bytes (at most {CHUNK})")
            buf = free.get()
            got = self._fill(fd, memoryview(buf)[:size])
            if got != size:
                raise Broken(f"connection {i}: cut off ({got} of {size} bytes)")
            out.put((buf, size, free))

    def _raw(self, i: int, fd: int, out: queue.Queue[Item | None]) -> None:
        free = self._free()
        while True:
            buf = free.get()
            n = self._fill(fd, memoryview(buf))
            if n:
                out.put((buf, n, free))
            if n < CHUNK:
                out.put(None)
                return

    def next(self, i: int) -> Item | None:
        """Connection i's next chunk (None: its end); any failure, or IDLE_S without a
        byte, ends the wait within a second."""
        chunks = self.queues[i]
        while True:
            if self.problems:
                raise Broken(self.problems[0])
            try:
                return chunks.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() - self.last > IDLE_S:
                    raise Broken(f"no byte for {IDLE_S:.0f} s") from None


class _Hasher:
    """The sha256 of FILE's first `at` bytes, then of each chunk written after them, on a
    thread of its own (hashlib lets go of the interpreter while it hashes)."""

    def __init__(self, path: str, at: int) -> None:
        self.sha = hashlib.sha256()
        self.items: queue.Queue[Item | None] = queue.Queue()
        self.problem = ""
        self.thread = threading.Thread(target=self._run, args=(path, at), daemon=True)
        self.thread.start()

    def _run(self, path: str, at: int) -> None:
        try:
            with open(path, "rb", buffering=0) as kept:
                view = memoryview(bytearray(CHUNK))
                while at:
                    got = kept.readinto(view[: min(at, CHUNK)])
                    if not got:
                        raise OSError(f"{path}: shorter than the {at} bytes to keep")
                    self.sha.update(view[:got])
                    at -= got
        except OSError as e:
            self.problem = str(e)
        while (item := self.items.get()) is not None:
            buf, n, free = item
            if not self.problem:
                self.sha.update(memoryview(buf)[:n])
            free.put(buf)

    def digest(self) -> str:
        self.items.put(None)
        self.thread.join()
        if self.problem:
            raise Broken(self.problem)
        return self.sha.hexdigest()


def _accept(folder: str) -> list[int]:
    """The connections' file descriptors, in their order, as each `hand` passes its own."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.settimeout(1.0)
    deadline = time.monotonic() + IDLE_S
    here = os.getcwd()
    os.chdir(folder)
    try:
        server.bind(SOCKET)
    finally:
        os.chdir(here)
    server.listen(64)
    fds: dict[int, int] = {}
    count = None
    try:
        while count is None or len(fds) < count:
            try:
                link, _ = server.accept()
            except socket.timeout:  # noqa: UP041  (python 3.9: not yet TimeoutError)
                # The sender removes the folder when a connection failed on its side.
                if not os.path.isdir(folder):
                    raise Broken(f"the sender gave up ({len(fds)} connections in)") from None
                if time.monotonic() > deadline:
                    raise Broken(f"only {len(fds)} connections came in {IDLE_S:.0f} s") from None
                continue
            message, passed, _, _ = socket.recv_fds(link, 64, 1)
            words = message.split()
            if len(passed) != 1 or len(words) != 2 or not all(w.isdigit() for w in words):
                raise Broken(f"a connection said {message!r}, not `I N` with its stdin")
            i, n = int(words[0]), int(words[1])
            if n < 1 or i >= n or (count is not None and n != count) or i in fds:
                raise Broken(f"connection {i} of {n} does not fit")
            count, fds[i] = n, passed[0]
            _LINKS.append(link)
    finally:
        server.close()
    return [fds[i] for i in range(len(fds))]


_LINKS: list[socket.socket] = []  # each `hand`'s line, to tell it how the join ended


def join(source: str, into: str | None, at: int) -> int:
    hasher = None
    out = 1
    try:
        if source == "-":
            sources = _Sources([0], framed=False)
        else:
            try:
                sources = _Sources(_accept(source), framed=True)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(source, SOCKET))
                with contextlib.suppress(OSError):
                    os.rmdir(source)
        if into is not None:
            out = os.open(into, os.O_WRONLY | os.O_CREAT, 0o644)
            if os.fstat(out).st_size < at:
                raise Broken(f"{into}: shorter than the {at} bytes to keep")
            os.ftruncate(out, at)
            os.lseek(out, at, os.SEEK_SET)
            hasher = _Hasher(into, at)
        i = ended = 0
        n = len(sources.queues)
        while ended < n:
            item = sources.next(i % n)
            i += 1
            if item is None:
                ended += 1
                continue
            if ended:
                raise Broken("a connection went on after another had ended")
            buf, size, free = item
            _write_all(out, memoryview(buf)[:size])
            if hasher:
                hasher.items.put(item)
            else:
                free.put(buf)
        if hasher:
            print(hasher.digest(), flush=True)
        _tell(b"\0")
        return 0
    except (Broken, OSError) as e:
        _say(str(e))
        _tell(b"\1")
        return 1
    finally:
        if out != 1:
            os.close(out)


def _tell(word: bytes) -> None:
    for link in _LINKS:
        with contextlib.suppress(OSError):
            link.sendall(word)
        link.close()


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "split":
        return split(argv[1:], 0)
    if len(argv) == 4 and argv[0] == "hand" and argv[2].isdigit() and argv[3].isdigit():
        return hand(argv[1], int(argv[2]), int(argv[3]))
    if len(argv) == 2 and argv[0] == "join":
        return join(argv[1], None, 0)
    into = len(argv) == 6 and argv[2:5:2] == ["--into", "--at"] and argv[5].isdigit()
    if argv[:1] == ["join"] and into:
        return join(argv[1], argv[3], int(argv[5]))
    _say("usage: split PIPE... | hand FOLDER I N | join SOURCE [--into FILE --at N]")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
