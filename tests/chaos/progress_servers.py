"""The /progress servers of the abuse case, as scripts for `python3 -c` in the base image.

ABUSIVE answers every other request with a valid report (so the operator keeps polling the
group at the full rate) and the others with the next of many abuses (each worker starts at
its own place in the cycle): bodies without end (chunked, or a Content-Length of 10 GB), a drip of a
byte every 0.2 s, no answer at all, a megabyte of headers, JSON nested 10,000 deep, bytes
that are not UTF-8, the wrong types, a 20,000-digit step, NaN and negative numbers, a gzip
bomb, a body shorter than its Content-Length, and a report from another worker.

HONEST serves valid reports whose step follows a heartbeat the pacemaker worker writes to a
volume all workers share: when the pacemaker is stopped (SIGSTOP), it stops answering and the
others keep answering with a frozen step, as workers blocked in a collective do.
"""

from __future__ import annotations

ABUSIVE = r'''
import gzip, itertools, json, os, socket, socketserver, time
PORT = int(os.environ["MWJ_PROGRESS_PORT"])
INDEX = int(os.environ["MWJ_WORKER_INDEX"])
GEN = int(os.environ["MWJ_RESTART_COUNT"])
BLOCK = b"7" * (1 << 20)
BOMB = gzip.compress(b"0" * (60 << 20), 9)

def head(s, length=None, extra=b""):
    size = b"Content-Length: %d\r\n" % length if length is not None else \
        b"Transfer-Encoding: chunked\r\n"
    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + size + extra + b"\r\n")

def body(s, data, extra=b""):
    head(s, len(data), extra)
    s.sendall(data)

def endless_chunked(s):
    head(s)
    chunk = b"%x\r\n" % len(BLOCK) + BLOCK + b"\r\n"
    while True:
        s.sendall(chunk)

def endless_length(s):
    head(s, 10 ** 10)
    while True:
        s.sendall(BLOCK)

def drip(s):
    head(s, 10 ** 6)
    while True:
        s.sendall(b"[")
        time.sleep(0.2)

def silent(s):
    s.recv(1)  # until the poller gives up and closes

def huge_headers(s):
    s.sendall(b"HTTP/1.1 200 OK\r\nX-Junk: " + b"a" * (1 << 20) + b"\r\n\r\n{}")

def nested_objects(s):
    body(s, b'{"a":' * 10000 + b"1" + b"}" * 10000)

def nested_lists(s):
    body(s, b"[" * 30000 + b"]" * 30000)

def not_utf8(s):
    body(s, b'{"workerIndex": 0, "phase": "\xff\xfe\xfd", "generation": \x00\x01}')

def wrong_types(s):
    body(s, json.dumps({"workerIndex": str(INDEX), "generation": [GEN], "phase": {"x": 1},
                        "step": "a lot"}).encode())

def huge_step(s):
    body(s, b'{"workerIndex": %d, "generation": %d, "phase": "training", "step": 1%s}'
         % (INDEX, GEN, b"0" * 20000))

def nan_and_negative(s):
    body(s, b'{"workerIndex": %d, "generation": %d, "phase": "training", "step": -5, '
            b'"loss": NaN, "stepsPerSecond": Infinity}' % (INDEX, GEN))

def gzip_bomb(s):
    body(s, BOMB, b"Content-Encoding: gzip\r\n")

def short_body(s):
    head(s, 1000)
    s.sendall(b'{"workerIndex": ')

def another_worker(s):
    body(s, json.dumps({"workerIndex": INDEX + 1, "generation": GEN, "phase": "training",
                        "step": 1}).encode())

def honest(s, n):
    body(s, json.dumps({"workerIndex": INDEX, "generation": GEN, "phase": "training",
                        "step": n}).encode())

ABUSES = [endless_chunked, endless_length, drip, silent, huge_headers, nested_objects,
          nested_lists, not_utf8, wrong_types, huge_step, nan_and_negative, gzip_bomb,
          short_body, another_worker]
turn = itertools.count(2 * INDEX + 1)

class Abuse(socketserver.BaseRequestHandler):
    def handle(self):
        s, data = self.request, b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return
            data += chunk
        n = next(turn)
        try:
            # Every other answer is a valid report with a growing step: the group counts as
            # serving progress, so it is polled at the full rate (and not hung).
            ABUSES[n // 2 % len(ABUSES)](s) if n % 2 else honest(s, n)
        except OSError:
            pass

socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.daemon_threads = True
socketserver.ThreadingTCPServer(("", PORT), Abuse).serve_forever()
'''

HONEST = r'''
import json, os, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
PORT = int(os.environ["MWJ_PROGRESS_PORT"])
INDEX = int(os.environ["MWJ_WORKER_INDEX"])
GEN = int(os.environ["MWJ_RESTART_COUNT"])
PACEMAKER = int(os.environ["PACEMAKER"])
BEAT = "/shared/%s-beat-%d" % (os.environ["MWJ_JOB_NAME"], GEN)

def beat():
    while True:
        with open(BEAT + ".tmp", "w") as f:
            f.write(repr(time.time()))
        os.replace(BEAT + ".tmp", BEAT)
        time.sleep(0.2)

def step():
    try:
        with open(BEAT) as f:
            last = float(f.read())
    except (OSError, ValueError):
        return 0
    return int((min(time.time(), last) - 1.7e9) * 5)

class Progress(BaseHTTPRequestHandler):
    def do_GET(self):
        data = json.dumps({"workerIndex": INDEX, "generation": GEN, "phase": "training",
                           "step": step(), "updatedAt": time.time()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

if INDEX == PACEMAKER:
    threading.Thread(target=beat, daemon=True).start()
ThreadingHTTPServer(("", PORT), Progress).serve_forever()
'''
