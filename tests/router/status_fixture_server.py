#!/usr/bin/env python3
"""Serves the status page and a fixed /v2/status answer, standing in for hiber-router.

GET / answers the page's bytes (the ones hiber-router embeds, dumped by hiber_status_page_dump);
GET /v2/status answers the fixture JSON, read again on each request. With --unreachable,
/v2/status closes the connection without an answer, as a router that went away would; with
--fail_after=N it does so after N answers (a router lost while the page is open).
The server listens on 127.0.0.1 at a free port and writes the port to --port_file once it
accepts connections. Standard library only.
"""
import argparse
import http.server
import os
import sys
import threading


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--page", required=True, help="file with the page's bytes, served at /")
    parser.add_argument("--status", help="JSON file served at /v2/status")
    parser.add_argument("--unreachable", action="store_true",
                        help="close /v2/status connections without answering")
    parser.add_argument("--fail_after", type=int, default=None,
                        help="answer /v2/status this many times, then as --unreachable")
    parser.add_argument("--port_file", required=True, help="where to write the port")
    args = parser.parse_args()
    if not args.unreachable and not args.status:
        parser.error("--status is required unless --unreachable")

    answered = [0]
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, body, content_type):
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/":
                with open(args.page, "rb") as f:
                    self._answer(f.read(), "text/html; charset=utf-8")
            elif path == "/v2/status":
                with lock:
                    lost = args.unreachable or (args.fail_after is not None and
                                                answered[0] >= args.fail_after)
                    answered[0] += 0 if lost else 1
                if lost:
                    self.close_connection = True
                    return
                with open(args.status, "rb") as f:
                    self._answer(f.read(), "application/json")
            else:
                self.send_error(404)

        def log_message(self, fmt, *a):
            sys.stderr.write("fixture server: " + (fmt % a) + "\n")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, args.port_file)  # the test waits for the file: write it whole
    server.serve_forever()


if __name__ == "__main__":
    main()
