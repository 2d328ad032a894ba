"""TCP proxies in front of Redis that pass requests at once and hold its
replies back, as a Redis far away or short of bandwidth would."""
import queue
import socket
import threading
import time


class ReplyProxy:
    """Accepts on a free port; each connection gets its own link to Redis,
    requests go through at once and replies through `replies` (one thread
    per direction)."""

    def __init__(self, redis_port):
        self.redis_port = redis_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return          # closed
            try:
                server = socket.create_connection(("127.0.0.1", self.redis_port))
            except OSError:
                client.close()  # Redis is gone: so is the link
                continue
            self.socks += [client, server]
            threading.Thread(target=self.requests, args=(client, server), daemon=True).start()
            self.replies(server, client)

    @staticmethod
    def requests(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    return
                dst.sendall(data)
        except OSError:
            pass

    def replies(self, src, dst):
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

    @staticmethod
    def forward(src, dst, silent_after_sha):
        seen = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    dst.close()
                    return
                if silent_after_sha:
                    seen += data
                    at = seen.find(b"$40\r\n")
                    if at >= 0 and len(seen) >= at + 47:
                        dst.sendall(data[:len(data) - (len(seen) - (at + 47))])
                        while src.recv(65536):
                            pass            # swallowed
                        return
                dst.sendall(data)
        except OSError:
            pass
