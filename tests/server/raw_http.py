"""Raw-socket HTTP/1.x for the server tests: exact bytes out, responses parsed by hand, so the
tests see what a hostile or unusual client sees (framing, pipelining, closes, timing)."""
import socket
import time


class Raw:
    """One TCP connection to 127.0.0.1:port with a receive buffer."""

    def __init__(self, port, timeout=10, rcvbuf=None):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.settimeout(timeout)
        self.s.connect(("127.0.0.1", port))
        self.buf = b""

    def send(self, data):
        self.s.sendall(data.encode() if isinstance(data, str) else data)

    def close(self, reset=False):
        if reset:  # RST instead of FIN
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.s.close()

    def _fill(self):
        chunk = self.s.recv(65536)
        if not chunk:
            raise EOFError("the server closed the connection")
        self.buf += chunk

    def _until(self, sep):
        while sep not in self.buf:
            self._fill()
        i = self.buf.index(sep) + len(sep)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head=False):
        """(status, headers with lower-case names, body bytes, version) of the next response;
        interim 1xx responses are returned too (the caller reads on)."""
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        version, status = lines[0].split(" ")[0], int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                k, v = line.split(":", 1)
                k = k.strip().lower()
                headers[k] = headers[k] + ", " + v.strip() if k in headers else v.strip()
        if head or status < 200 or status in (204, 304):
            return status, headers, b"", version
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    self._until(b"\r\n")
                    break
                body += self._take(size)
                self._take(2)
            return status, headers, body, version
        if "content-length" in headers:
            return status, headers, self._take(int(headers["content-length"])), version
        body = self.buf  # close-delimited
        self.buf = b""
        while True:
            try:
                chunk = self.s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            body += chunk
        return status, headers, body, version

    def closed_within(self, seconds):
        """True when the server closes (EOF or reset) within `seconds`; data is drained."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.s.settimeout(max(0.01, deadline - time.time()))
            try:
                if not self.s.recv(65536):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True
            except socket.timeout:
                return False
        return False

    def silent_for(self, seconds):
        """True when nothing arrives (and the connection stays open) for `seconds`."""
        if self.buf:
            return False
        self.s.settimeout(seconds)
        try:
            data = self.s.recv(65536)
        except socket.timeout:
            return True
        self.buf += data
        return False


def request(method, path, body=b"", headers=None, version="HTTP/1.1"):
    """The bytes of one request; Content-Length from the body unless headers name framing."""
    if isinstance(body, str):
        body = body.encode()
    h = {"Host": "localhost"}
    h.update(headers or {})
    if body and "Content-Length" not in h and "Transfer-Encoding" not in h:
        h["Content-Length"] = str(len(body))
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
    return head.encode() + b"\r\n" + body
