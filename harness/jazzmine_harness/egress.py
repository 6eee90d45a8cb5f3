"""The egress relay. A sandbox with an allowlist has no network: its only way out is the
egress proxy's Unix socket, $JAZZMINE_EGRESS_SOCKET, in a volume mounted read-only (a
script can connect to it, not replace it). HTTP clients need a TCP proxy, so every
child relays 127.0.0.1:$JAZZMINE_EGRESS_PORT to that socket, in a daemon thread of its
own: the relay lives and dies with the execution, and the next child binds the port
again (the last child is dead by then). It grants nothing: a script may as well
connect to the socket itself, and the proxy decides what the sandbox reaches."""

import errno
import os
import select
import socket
import threading
import time

DEFAULT_EGRESS_PORT = 3128

# Bytes a relayed connection holds for one direction before it stops reading that way.
RELAY_BUFFER = 64 * 1024

# Tries at binding the relay's port, a millisecond apart, should the last child's
# socket not be released yet.
RELAY_BIND_TRIES = 200


def start_relay():
    """Starts the relay if the container has an egress socket, and returns it. A relay
    that cannot start says why on the script's stderr; the script runs without it."""
    path = os.environ.get("JAZZMINE_EGRESS_SOCKET")
    if not path:
        return None
    port = os.environ.get("JAZZMINE_EGRESS_PORT") or str(DEFAULT_EGRESS_PORT)
    try:
        relay = Relay(path, int(port))
    except (OSError, ValueError, OverflowError) as e:
        try:
            os.write(2, ("jazzmine: no egress relay on 127.0.0.1:%s: %s\n" % (port, e)).encode())
        except OSError:
            pass
        return None
    threading.Thread(target=relay.serve, name="jazzmine-egress-relay", daemon=True).start()
    return relay


class Relay:
    """Accepts connections on 127.0.0.1:port and relays each to the Unix socket at path,
    both ways, with one poll loop for all of them."""

    def __init__(self, path, port):
        self.path = path
        self.poll = select.poll()
        self.socks = {}  # fd -> (socket, its Flow, or None for the listener)
        self.masks = {}  # fd -> the events it is registered for
        ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            for attempt in range(RELAY_BIND_TRIES):
                try:
                    ln.bind(("127.0.0.1", port))
                    break
                except OSError as e:
                    if e.errno != errno.EADDRINUSE or attempt == RELAY_BIND_TRIES - 1:
                        raise
                    time.sleep(0.001)
            ln.listen(64)
            ln.setblocking(False)
        except BaseException:
            ln.close()
            raise
        self.listener = ln
        self.socks[ln.fileno()] = (ln, None)
        self.watch(ln, select.POLLIN)

    def watch(self, sock, mask):
        """Polls sock for mask; 0 stops polling it (so that its hang-up wakes nobody)."""
        fd = sock.fileno()
        if self.masks.get(fd, 0) == mask:
            return
        if mask:
            self.poll.register(fd, mask)
            self.masks[fd] = mask
        else:
            self.poll.unregister(fd)
            del self.masks[fd]

    def forget(self, sock):
        fd = sock.fileno()
        if fd in self.masks:
            self.watch(sock, 0)
        self.socks.pop(fd, None)
        sock.close()

    def serve(self):
        while True:
            for fd, events in self.poll.poll():
                entry = self.socks.get(fd)
                if entry is None:
                    continue
                sock, flow = entry
                if flow is None:
                    self._accept()
                else:
                    flow.pump(sock, events)

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # none waiting (EAGAIN), or out of descriptors: it waits
                return
            client.setblocking(False)
            proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            proxy.setblocking(False)  # a Unix socket connects at once, or fails at once
            try:
                proxy.connect(self.path)
            except OSError as e:
                proxy.close()
                self._refuse(client, e)
                continue
            Flow(self, client, proxy)

    def _refuse(self, client, err):
        """Answers a client whose proxy connection failed with a 502 and closes it."""
        body = "jazzmine relay: the egress proxy at %s is unreachable: %s\n" % (self.path, os.strerror(err.errno) if err.errno else err)
        answer = "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body.encode()), body)
        try:
            while client.recv(RELAY_BUFFER):  # what the client sent already: unread, closing would reset
                pass
        except OSError:
            pass
        try:
            client.send(answer.encode())
            client.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        client.close()


class Flow:
    """One relayed connection: bytes both ways between a client and the proxy, at most
    RELAY_BUFFER held each way; an end of stream is passed on as a half-close."""

    def __init__(self, relay, client, proxy):
        self.relay = relay
        self.peer = {client: proxy, proxy: client}
        self.pending = {client: bytearray(), proxy: bytearray()}  # to be written to the key
        self.reading = {client: True, proxy: True}  # its end of stream not yet read
        self.shut = {client: False, proxy: False}  # written to its end
        for s in (client, proxy):
            relay.socks[s.fileno()] = (s, self)
            relay.watch(s, select.POLLIN)

    def pump(self, sock, events):
        peer = self.peer[sock]
        try:
            if self.reading[sock] and len(self.pending[peer]) < RELAY_BUFFER and events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    data = sock.recv(RELAY_BUFFER)
                except BlockingIOError:  # a wake-up with nothing to read after all
                    data = None
                if data:
                    self.pending[peer] += data
                elif data is not None:
                    self.reading[sock] = False
            self._flush(peer)
            self._flush(sock)
        except OSError:
            self.close()
            return
        if not any(self.reading.values()) and not any(self.pending.values()):
            self.close()
            return
        for s in (sock, peer):
            mask = 0
            if self.reading[s] and len(self.pending[self.peer[s]]) < RELAY_BUFFER:
                mask |= select.POLLIN
            if self.pending[s]:
                mask |= select.POLLOUT
            self.relay.watch(s, mask)

    def _flush(self, sock):
        buf = self.pending[sock]
        if buf:
            try:
                del buf[: sock.send(buf)]
            except BlockingIOError:
                pass
        if not buf and not self.reading[self.peer[sock]] and not self.shut[sock]:
            sock.shutdown(socket.SHUT_WR)
            self.shut[sock] = True

    def close(self):
        for s in self.peer:
            self.relay.forget(s)
