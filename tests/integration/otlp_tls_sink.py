#!/usr/bin/env python3
"""An OTLP/HTTP collector over TLS for the tests: answers every POST with
200 and writes its body, one line each, to stderr ("OTLP <json>"), where the
test's Process::log() reads it. Announces its port on stdout as the other
test processes do.

usage: otlp_tls_sink.py CERT KEY
"""
import http.server
import ssl
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        # The gateway's batches are small; a bound keeps a test bug from
        # filling the memory.
        body = self.rfile.read(min(n, 16 << 20))
        sys.stderr.write("OTLP " + body.decode("utf-8", "replace").replace("\n", " ") + "\n")
        sys.stderr.flush()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def main():
    cert, key = sys.argv[1], sys.argv[2]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print("otlp sink listening on https://127.0.0.1:%d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
