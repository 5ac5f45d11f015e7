#!/usr/bin/env python3
"""An HTTP/1.1 server (standard library only) that answers each request with a JSON echo of it,
for testing router/http_client.h against a server it shares no code with.

Listens on 127.0.0.1, on an ephemeral port it prints on its first stdout line. Keeps connections
alive. The answer is {"method", "path", "headers": {lower-case name: value}, "body",
"client_port", "request_on_connection"} with status 200, except for these paths:
  /status/NNN  the same echo with status NNN
  /close       the echo, then the server closes the connection (Connection: close)
  /drop        the echo as if the connection stayed open, then the server closes it anyway
  /chunked     the echo sent with Transfer-Encoding: chunked, in several chunks
  /hang        never answers (the connection stays open)
  /log         a JSON array of the echoes of every earlier request, oldest first
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


LOG = []
LOG_LOCK = threading.Lock()


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.requests_seen = 0

    def log_message(self, format, *args):  # quiet: the test reads stdout
        pass

    def handle_any(self):
        self.requests_seen += 1
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length) if length else b""
        if self.path == "/hang":
            threading.Event().wait()
        if self.path == "/log":
            with LOG_LOCK:
                answer = json.dumps(LOG).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            return
        status = 200
        if self.path.startswith("/status/"):
            status = int(self.path[len("/status/"):])
        echo = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode("utf-8", "replace"),
            "client_port": self.client_address[1],
            "request_on_connection": self.requests_seen,
        }
        with LOG_LOCK:
            LOG.append(echo)
        answer = json.dumps(echo).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Echo", "yes")
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(answer), 7):
                piece = answer[i:i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(answer)))
        if self.path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        if self.path == "/drop":
            self.close_connection = True  # without saying so: a keep-alive timeout's effect
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
