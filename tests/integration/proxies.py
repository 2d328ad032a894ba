"""TCP proxies in front of Redis that pass requests at once and hold its
replies back, as a Redis far away or short of bandwidth would."""
import queue
import socket
import threading
import time


class Listener:
    """Accepts on a free port of 127.0.0.1 and hands each connection to
    `take`, on the accepting thread."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                s, _ = self.listener.accept()
            except OSError:
                return          # closed
            self.take(s)

    def take(self, sock):
        raise NotImplementedError

    def close(self):
        # close() alone leaves the port listening while accept() blocks on
        # it (the call holds the socket): a later connection would land here
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


class ReplyProxy(Listener):
    """Each connection gets its own link to Redis, requests go through at
    once and replies through `replies` (one thread per direction)."""

    def __init__(self, redis_port):
        self.redis_port = redis_port
        super().__init__()

    def take(self, client):
        try:
            server = socket.create_connection(("127.0.0.1", self.redis_port))
        except OSError:
            client.close()  # Redis is gone: so is the link
            return
        self.socks += [client, server]
        threading.Thread(target=self.requests, args=(client, server), daemon=True).start()
        self.replies(server, client)

    @staticmethod
    def received(src):
        """Each chunk src sends, until it closes (or fails)."""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    return
                yield data
        except OSError:
            return

    @classmethod
    def requests(cls, src, dst):
        try:
            for data in cls.received(src):
                dst.sendall(data)
        except OSError:
            pass

    def replies(self, src, dst):
        raise NotImplementedError


class SlowReplies(ReplyProxy):
    """Holds every reply `delay` seconds, as a Redis across a network would."""

    def __init__(self, redis_port, delay):
        self.delay = delay
        super().__init__(redis_port)

    def replies(self, src, dst):
        held = queue.Queue()
        threading.Thread(target=self.hold, args=(src, held), daemon=True).start()
        threading.Thread(target=self.release, args=(held, dst), daemon=True).start()

    def hold(self, src, held):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            held.put((time.monotonic() + self.delay, data))
            if not data:
                return

    @staticmethod
    def release(held, dst):
        while True:
            at, data = held.get()
            time.sleep(max(0.0, at - time.monotonic()))
            if not data:
                dst.close()
                return
            try:
                dst.sendall(data)
            except OSError:
                return


class TrickledReplies(ReplyProxy):
    """Passes replies at `rate` bytes a second (after the link's first 4 KiB,
    its handshake): a Redis that answers, but slower than checks arrive."""

    def __init__(self, redis_port, rate):
        self.rate = rate
        super().__init__(redis_port)

    def replies(self, src, dst):
        buf, lock = bytearray(), threading.Lock()
        threading.Thread(target=self.gather, args=(src, buf, lock), daemon=True).start()
        threading.Thread(target=self.release, args=(buf, lock, dst), daemon=True).start()

    @staticmethod
    def gather(src, buf, lock):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    return
                with lock:
                    buf.extend(data)
        except OSError:
            pass

    def release(self, buf, lock, dst):
        free, tick = 4096, 0.02
        try:
            while True:
                time.sleep(tick)
                with lock:
                    n = int(self.rate * tick) + free
                    out = bytes(buf[:n])
                    del buf[:n]
                free = 0
                if out:
                    dst.sendall(out)
        except OSError:
            pass


class SilentAfterHandshake(ReplyProxy):
    """The first link's replies stop after its handshake (the SCRIPT LOAD
    reply, a 40-byte SHA): a link gone silent with its socket open, as
    behind a network partition. Later links pass everything."""

    def __init__(self, redis_port):
        self.links = 0
        super().__init__(redis_port)

    def replies(self, src, dst):
        self.links += 1
        silent_after_sha = self.links == 1
        threading.Thread(target=self.forward, args=(src, dst, silent_after_sha),
                         daemon=True).start()

    def forward(self, src, dst, silent_after_sha):
        seen = b""
        try:
            for data in self.received(src):
                if silent_after_sha:
                    seen += data
                    at = seen.find(b"$40\r\n")
                    if at >= 0 and len(seen) >= at + 47:
                        dst.sendall(data[:len(data) - (len(seen) - (at + 47))])
                        for _ in self.received(src):
                            pass            # swallowed
                        return
                dst.sendall(data)
            dst.close()
        except OSError:
            pass


class StrayReply(ReplyProxy):
    """Passes replies, until `hold()`: then keeps them, and `release()`
    sends what it kept behind one reply no command asked for (`+OK`), as a
    broken middlebox would. Replies behind it are each one call late."""

    def __init__(self, redis_port):
        self.lock = threading.Lock()
        self.kept = None        # None: passing
        self.dst = None
        super().__init__(redis_port)

    def replies(self, src, dst):
        self.dst = dst
        threading.Thread(target=self.forward, args=(src, dst), daemon=True).start()

    def forward(self, src, dst):
        try:
            for data in self.received(src):
                with self.lock:
                    if self.kept is not None:
                        self.kept += data
                        continue
                dst.sendall(data)
            dst.close()
        except OSError:
            pass

    def hold(self):
        with self.lock:
            self.kept = b""

    def release(self):
        with self.lock:
            out, self.kept = b"+OK\r\n" + self.kept, None
            self.dst.sendall(out)


class FakeRedis(Listener):
    """Speaks enough RESP to pass the daemon's handshake (AUTH, SELECT,
    INFO of a primary, SCRIPT LOAD, the zero-check probe), then answers
    each script call with `keyed` (bytes, or None for no answer): a
    server that is not quite Redis, or a proxy that garbles replies.
    `greeting`, when set, is all it sends, at the first request."""

    SHA = b"0123456789abcdef0123456789abcdef01234567"

    def __init__(self, keyed, greeting=None):
        self.keyed = keyed
        self.greeting = greeting
        self.links = 0
        super().__init__()

    def take(self, sock):
        self.links += 1
        self.socks.append(sock)
        threading.Thread(target=self.serve, args=(sock,), daemon=True).start()

    @staticmethod
    def commands(buf):
        """The complete commands at the head of buf, and what is left."""
        out = []
        while buf.startswith(b"*"):
            end = buf.find(b"\r\n")
            if end < 0:
                break
            n, at, args = int(buf[1:end]), end + 2, []
            for _ in range(n):
                end = buf.find(b"\r\n", at)
                if end < 0:
                    return out, buf
                size = int(buf[at + 1:end])
                if len(buf) < end + 2 + size + 2:
                    return out, buf
                args.append(buf[end + 2:end + 2 + size])
                at = end + 2 + size + 2
            out.append(args)
            buf = buf[at:]
        return out, buf

    def answer(self, args):
        cmd = args[0].upper()
        if cmd in (b"AUTH", b"SELECT"):
            return b"+OK\r\n"
        if cmd == b"INFO":
            info = b"# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n" \
                   b"# Replication\r\nrole:master\r\n"
            return b"$%d\r\n%s\r\n" % (len(info), info)
        if cmd == b"SCRIPT":
            return b"$40\r\n%s\r\n" % self.SHA
        if cmd == b"EVALSHA" and args[2] == b"0":
            return b"*0\r\n"    # the probe: zero checks
        return self.keyed

    def serve(self, s):
        buf = b""
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    return
                if self.greeting is not None:
                    s.sendall(self.greeting)
                    continue
                cmds, buf = self.commands(buf + data)
                for args in cmds:
                    reply = self.answer(args)
                    if reply:
                        s.sendall(reply)
        except OSError:
            pass
