#!/usr/bin/env python3
"""`smolrt serve`'s HTTP layer under hostile and unusual clients, on loopback with raw sockets
(tests/server/raw_http.py) against the CPU backend on stories260K: framing, deadlines, limits,
disconnects, back-pressure, shutdown, CORS and /health, special tokens in chat content, and a
load test of 1,000 connections.

One ctest per --case. Exit 77 (ctest: skipped, the reason printed) when the fixtures are missing.
"""
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from raw_http import Raw, request  # noqa: E402
from test_server import STORIES, Server, check, run_case, wait_for  # noqa: E402

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


def completion(prompt, n, **kw):
    return json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                       **kw})


def ask(port, body, path="/v1/completions", headers=None, timeout=30):
    c = Raw(port, timeout=timeout)
    c.send(request("POST", path, body, {"Content-Type": "application/json", **(headers or {})}))
    st, h, b, _ = c.response()
    c.close()
    return st, h, json.loads(b) if b.startswith(b"{") else b


def error_code(body):
    return json.loads(body)["error"]["code"]


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        check(hard == resource.RLIM_INFINITY or hard >= need,
              f"this test needs {need} file descriptors; the hard limit is {hard} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY
                                                    else hard, hard))


# --- framing -------------------------------------------------------------------------------------

def case_framing(binary):
    srv = Server(binary, STORIES, "--parallel", "2", "--ctx", "128", "--api-key", KEY)
    srv.auth = AUTH
    try:
        port = srv.port
        # Pipelining: three requests in one packet, three answers in order on one connection;
        # two generations pipelined too.
        c = Raw(port)
        c.send(request("GET", "/v1/models", headers=AUTH) +
               request("POST", "/tokenize", '{"content": "Once upon"}', AUTH) +
               request("GET", "/health", headers=AUTH))
        st1, _, b1, _ = c.response()
        st2, _, b2, _ = c.response()
        st3, _, b3, _ = c.response()
        check(st1 == 200 and json.loads(b1)["object"] == "list", f"pipelined 1: {st1} {b1[:100]}")
        check(st2 == 200 and "tokens" in json.loads(b2), f"pipelined 2: {st2} {b2[:100]}")
        check(st3 == 200 and json.loads(b3)["status"] == "ok", f"pipelined 3: {st3} {b3[:100]}")
        _, _, alone_a = ask(port, completion("Once upon a time", 12), headers=AUTH)
        _, _, alone_b = ask(port, completion("The little dog", 12), headers=AUTH)
        c.send(request("POST", "/v1/completions", completion("Once upon a time", 12), AUTH) +
               request("POST", "/v1/completions", completion("The little dog", 12), AUTH))
        _, _, ga, _ = c.response()
        _, _, gb, _ = c.response()
        check(json.loads(ga)["choices"][0]["text"] == alone_a["choices"][0]["text"] and
              json.loads(gb)["choices"][0]["text"] == alone_b["choices"][0]["text"],
              "pipelined generations out of order or wrong")
        check(c.silent_for(0.3), "an extra response after the pipelined ones")
        c.close()

        # A rejected request's body is read, never parsed as the next request (smuggling): the
        # 401's body is a whole GET /health request sent in a second packet.
        c = Raw(port)
        inner = request("GET", "/health")
        c.send(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(inner)}\r\n"
               "Content-Type: application/json\r\n\r\n")
        time.sleep(0.2)
        c.send(inner)
        st, _, b, _ = c.response()
        check(st == 401, f"no key: {st}")
        c.send(request("GET", "/v1/models", headers=AUTH))
        st, _, b, _ = c.response()
        check(st == 200 and json.loads(b)["object"] == "list",
              f"the request after the 401 was answered as another: {st} {b[:200]}")
        check(c.silent_for(0.3), "the 401's body was answered as a request")
        c.close()

        # Content-Length and Transfer-Encoding: refused at once, the connection closed.
        bad = [("Content-Length: -5", 400), ("Content-Length: +30", 400),
               ("Content-Length: 9223372036854775807", 413),
               ("Content-Length: 99999999999999999999999", 400),
               ("Content-Length: 5\r\nContent-Length: 6", 400),
               ("Transfer-Encoding: gzip, chunked", 501), ("Transfer-Encoding: gzip", 501),
               ("Transfer-Encoding: chunked\r\nContent-Length: 5", 400),
               ("Content-Length: 9437184", 413)]  # 9 MiB announced: no need to send it
        for header, want in bad:
            c = Raw(port)
            t0 = time.time()
            c.send(f"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   f"{header}\r\n\r\n")
            st, h, b, _ = c.response()
            dt = time.time() - t0
            check(st == want and dt < 1.5, f"{header!r}: {st} after {dt:.2f} s, want {want}")
            check(h.get("connection", "").lower() == "close" and c.closed_within(5),
                  f"{header!r}: the connection stays open")
            c.close()

        # Chunked bodies work; one growing past 8 MiB gets 413.
        c = Raw(port)
        body = json.dumps({"content": "Once upon a time"}).encode()
        c.send(f"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
               "Transfer-Encoding: chunked\r\n\r\n")
        for k in range(0, len(body), 7):
            part = body[k:k + 7]
            c.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        c.send("0\r\n\r\n")
        st, _, b, _ = c.response()
        check(st == 200 and len(json.loads(b)["tokens"]) > 0, f"chunked body: {st} {b[:200]}")
        big = b"x" * (1 << 20)
        c.send(f"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(9):
                c.send(f"{len(big):x}\r\n".encode() + big + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        st, _, b, _ = c.response()
        check(st == 413, f"9 MiB chunked body: {st}")
        c.close()

        # Any content type up to 8 MiB: a 2 MiB form-encoded body (curl -d's default) is read.
        text = "once upon a time " * (2 << 16)
        st, _, b = ask(port, json.dumps({"content": text}), "/tokenize",
                       {"Content-Type": "application/x-www-form-urlencoded", **AUTH}, timeout=60)
        check(st == 200 and len(b["tokens"]) > 1000, f"2 MiB form-encoded body: {st}")

        # HTTP/1.0: Content-Length, no chunking, closed after; a stream is close-delimited.
        c = Raw(port)
        c.send(request("POST", "/v1/completions", completion("Once upon a time", 12), AUTH,
                       version="HTTP/1.0"))
        st, h, b, v = c.response()
        check(st == 200 and v == "HTTP/1.0" and "content-length" in h and
              "transfer-encoding" not in h, f"HTTP/1.0: {v} {st} {h}")
        check(json.loads(b)["choices"][0]["text"] == alone_a["choices"][0]["text"], "1.0 text")
        check(c.closed_within(5), "HTTP/1.0 without keep-alive stays open")
        c = Raw(port)
        c.send(request("POST", "/v1/completions", completion("Once upon a time", 12, stream=True),
                       AUTH, version="HTTP/1.0"))
        st, h, b, v = c.response()
        check(st == 200 and "transfer-encoding" not in h and b.rstrip().endswith(b"[DONE]"),
              f"HTTP/1.0 stream: {st} {h} {b[-100:]!r}")
        c = Raw(port)
        c.send(request("GET", "/v1/models", headers={**AUTH, "Connection": "keep-alive"},
                       version="HTTP/1.0") * 2)
        check(c.response()[0] == 200 and c.response()[0] == 200, "HTTP/1.0 keep-alive")
        c.close()

        # No Range handling on POST; Expect: 100-continue; unknown routes and methods; HEAD.
        c = Raw(port)
        c.send(request("POST", "/v1/completions", completion("Once", 4),
                       {**AUTH, "Range": "bytes=0-10"}))
        st, h, b, _ = c.response()
        check(st == 200 and h["content-type"] == "application/json", f"Range on POST: {st} {h}")
        body = json.dumps({"content": "hello"})
        c.send(f"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
               f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n")
        st, _, _, _ = c.response()
        check(st == 100, f"Expect: 100-continue: {st}")
        c.send(body)
        check(c.response()[0] == 200, "after 100 Continue")
        c.send(request("GET", "/nope", headers=AUTH))
        st, _, b, _ = c.response()
        check(st == 404 and error_code(b) == "not_found", f"unknown route: {st}")
        c.send(request("GET", "/v1/completions", headers=AUTH))
        st, h, b, _ = c.response()
        check(st == 405 and "POST" in h.get("allow", ""), f"GET on a POST route: {st} {h}")
        c.send(request("HEAD", "/health"))
        st, h, b, _ = c.response(head=True)
        check(st == 200 and int(h["content-length"]) > 0, f"HEAD /health: {st} {h}")
        c.send(request("GET", "/v1/models?x=1", headers=AUTH))
        check(c.response()[0] == 200, "a query string")
        c.close()
        for raw, want in [("GET /health HTTP/1.1\r\n\r\n", 400),  # no Host
                          ("GET /health HTTP/1.2\r\nHost: x\r\n\r\n", 505),
                          ("GET /health HTTP/1.1\r\nHost: x\r\nX: " + "y" * 40000 + "\r\n\r\n",
                           431),
                          ("GET /health HTTP/1.1\r\nHost: x\r\nExpect: tea\r\n\r\n", 417)]:
            c = Raw(port)
            c.send(raw)
            st = c.response()[0]
            check(st == want, f"{raw[:40]!r}: {st}, want {want}")
            c.close()
        check(srv.metric("smolrt_http_connections") >= 1, "connections gauge")
    finally:
        check(srv.stop() == 0, "exit code after SIGTERM")


# --- deadlines -----------------------------------------------------------------------------------

def dribble(conns, stop, period):
    """Sends one header byte per connection every `period` seconds until stop is set."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000
    i = 0
    while not stop.is_set() and i < len(head):
        for c in conns:
            try:
                c.send(head[i:i + 1])
            except OSError:
                pass
        i += 1
        stop.wait(period)


def case_deadlines(binary):
    srv = Server(binary, STORIES, "--parallel", "4", "--ctx", "128", "--header-timeout", "4",
                 "--body-timeout", "2", "--idle-timeout", "3")
    try:
        port = srv.port
        _, _, ref = ask(port, completion("Once upon a time", 16))
        # Slowloris: 64 connections, a header byte each every 0.5 s; normal requests meanwhile
        # are answered as fast as without them.
        slow = [Raw(port) for _ in range(64)]
        stop = threading.Event()
        t = threading.Thread(target=dribble, args=(slow, stop, 0.5))
        t.start()
        t0 = time.time()
        worst = 0.0
        try:
            while time.time() - t0 < 3:
                t1 = time.time()
                st, _, b = ask(port, completion("Once upon a time", 16))
                worst = max(worst, time.time() - t1)
                check(st == 200 and b["choices"][0]["text"] == ref["choices"][0]["text"],
                      f"a normal request beside slowloris: {st}")
        finally:
            stop.set()
            t.join()
        check(worst < 1.5, f"a normal request took {worst:.2f} s beside 64 slowloris connections")
        # The slow ones got a 408 and were closed by the 4 s header deadline.
        for c in slow:
            st, _, b, _ = c.response()
            check(st == 408 and error_code(b) == "timeout", f"slowloris answer {st}")
            check(c.closed_within(5), "slowloris connection left open")
            c.close()
        check(time.time() - t0 < 12, f"slowloris connections closed after {time.time() - t0:.1f} s")
        check(srv.metric('smolrt_http_timeouts_total{phase="header"}') >= 64, "header timeouts")

        # A body that stops coming: 408 after the body deadline.
        c = Raw(port)
        t0 = time.time()
        c.send("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"content\":")
        st, _, b, _ = c.response()
        dt = time.time() - t0
        check(st == 408 and 1.5 < dt < 6, f"stalled body: {st} after {dt:.1f} s")
        c.close()
        # Idle keep-alive connections, and ones that never send anything, are closed.
        c = Raw(port)
        quiet = Raw(port)
        c.send(request("GET", "/health"))
        check(c.response()[0] == 200, "health")
        t0 = time.time()
        check(c.closed_within(9) and quiet.closed_within(2), "idle connections left open")
        check(time.time() - t0 > 2, "the idle connection was closed too early")
    finally:
        check(srv.stop() == 0, "exit code")


# --- limits and flags ----------------------------------------------------------------------------

def case_limits(binary):
    # Bad flag values are refused before the model loads, naming the flag.
    for args in (["--grace", "nan"], ["--grace", "inf"], ["--grace", "-1"],
                 ["--header-timeout", "nan"], ["--idle-timeout", "0"],
                 ["--write-timeout", "1e999"], ["--max-connections", "0"],
                 ["--max-connections", "1e3"], ["--port", "70000"], ["--parallel", "0"],
                 ["--http-threads", "-1"], ["--queue", "nan"], ["--cors-origin", "http://a/b"]):
        r = subprocess.run([binary, "serve", "-m", STORIES, *args], capture_output=True,
                           text=True, timeout=30)
        check(r.returncode != 0 and args[0] in r.stderr and "invalid" in r.stderr,
              f"{args}: rc {r.returncode} {r.stderr[-300:]}")

    raise_fd_limit(1400)
    # Past --max-connections: a 503 naming the limit, then close; served again once below.
    srv = Server(binary, STORIES, "--parallel", "2", "--ctx", "128", "--max-connections", "40")
    try:
        idle = [Raw(srv.port) for _ in range(40)]
        c = idle[0]
        c.send(request("GET", "/health"))
        check(c.response()[0] == 200, "a connection under the limit")
        extra = Raw(srv.port)
        st, h, b, _ = extra.response()
        check(st == 503 and error_code(b) == "too_many_connections" and "retry-after" in h,
              f"past the limit: {st} {b[:200]}")
        check(extra.closed_within(5), "the refused connection stays open")
        for c in idle[:5]:
            c.close()

        def served():
            try:
                st, _, _ = ask(srv.port, completion("Once", 2))
                return st == 200
            except (EOFError, OSError):
                return False
        wait_for(served, "a request once connections were closed", 10)
        check(srv.metric("smolrt_http_connections_rejected_total") >= 1, "rejections counted")
        for c in idle[5:]:
            c.close()
    finally:
        check(srv.stop() == 0, "exit code")

    # 1,100 idle connections (past select()'s 1,024): a normal request is served at once.
    srv = Server(binary, STORIES, "--parallel", "2", "--ctx", "128")
    try:
        idle = [Raw(srv.port) for _ in range(1100)]
        t0 = time.time()
        st, _, b = ask(srv.port, completion("Once upon a time", 8))
        check(st == 200 and b["usage"]["completion_tokens"] == 8 and time.time() - t0 < 3,
              f"beside 1,100 idle connections: {st} in {time.time() - t0:.1f} s")
        wait_for(lambda: srv.metric("smolrt_http_connections") >= 1100, "1,100 connections open")
        for c in idle:
            c.close()
    finally:
        check(srv.stop() == 0, "exit code")


# --- disconnects and back-pressure ---------------------------------------------------------------

def case_disconnect(binary):
    srv = Server(binary, STORIES, "--parallel", "1", "--ctx", "512", "--step-delay-ms", "20",
                 "--write-timeout", "2")
    try:
        port = srv.port
        # A non-streaming client that closes (FIN, then RST) frees its sequence at once.
        for reset in (False, True):
            before = srv.metric("smolrt_generation_tokens_total")
            c = Raw(port)
            c.send(request("POST", "/v1/completions", completion("Once upon a time", 400)))
            wait_for(lambda: srv.metric("smolrt_requests_running") == 1, "running == 1")
            t0 = time.time()
            c.close(reset=reset)
            wait_for(lambda: srv.metric("smolrt_requests_running") == 0, "running 0", 5)
            dt = time.time() - t0
            check(dt < 1.0, f"non-streaming disconnect (reset={reset}) noticed after {dt:.2f} s")
            check(srv.metric("smolrt_kv_pages_used") == 0, "pages after the disconnect")
            check(srv.metric("smolrt_generation_tokens_total") - before < 200,
                  "the abandoned request ran on")
        wait_for(lambda: srv.text().count("client disconnected") >= 2, "disconnects in the log")

        # A streaming reader that takes nothing is cut off after --write-timeout and its request
        # cancelled; the server buffers one pending event for it, not the whole generation.
        before = srv.metric("smolrt_generation_tokens_total")
        c = Raw(port, rcvbuf=2048)
        c.send(request("POST", "/v1/completions",
                       completion("Once upon a time", 480, stream=True, logprobs=20, echo=True)))
        wait_for(lambda: srv.metric("smolrt_requests_running") == 1, "stalled stream running")
        t0 = time.time()
        wait_for(lambda: srv.metric("smolrt_requests_running") == 0, "stalled stream cut off", 15)
        check(srv.metric('smolrt_http_timeouts_total{phase="write"}') >= 1, "write timeout counted")
        check("cut off" in srv.text(), "the cut-off in the log")
        check(srv.metric("smolrt_generation_tokens_total") - before < 480,
              f"the stalled stream ran to its end ({time.time() - t0:.1f} s)")
        c.close()

    finally:
        check(srv.stop() == 0, "exit code")

    # A late reader gets every token in fewer events than tokens: once the socket's buffers are
    # full, the tokens that pile up in its Job go out together.
    srv = Server(binary, STORIES, "--parallel", "1", "--ctx", "512")
    try:
        n = 400
        _, _, ref = ask(srv.port, completion("Once upon a time", n))
        before = srv.metric("smolrt_generation_tokens_total")
        c = Raw(srv.port, rcvbuf=2048)
        c.send(request("POST", "/v1/completions",
                       completion("Once upon a time", n, stream=True, logprobs=20)))
        wait_for(lambda: srv.metric("smolrt_generation_tokens_total") >= before + n,
                 "the generation's end", 30)
        st, _, b, _ = c.response()
        events = [json.loads(l[6:]) for l in b.decode().split("\n")
                  if l.startswith("data: {")]
        text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
        n_lp = sum(len(e["choices"][0]["logprobs"]["tokens"]) for e in events
                   if e["choices"] and e["choices"][0]["logprobs"])
        check(text == ref["choices"][0]["text"] and n_lp == n, f"late reader: {n_lp} tokens")
        check(len(events) < n * 3 // 4, f"{len(events)} events for {n} tokens: none coalesced")
        c.close()
    finally:
        check(srv.stop() == 0, "exit code")


# --- shutdown ------------------------------------------------------------------------------------

def case_shutdown(binary):
    srv = Server(binary, STORIES, "--parallel", "1", "--queue", "4", "--ctx", "512",
                 "--step-delay-ms", "20", "--grace", "2")
    try:
        port = srv.port
        slow = [Raw(port) for _ in range(10)]
        for c in slow:
            c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # a header never finished
        idle = [Raw(port) for _ in range(10)]
        stuck = Raw(port, rcvbuf=2048)  # a stream nobody reads
        stuck.send(request("POST", "/v1/completions",
                           completion("Once upon a time", 480, stream=True, logprobs=20)))
        wait_for(lambda: srv.metric("smolrt_requests_running") == 1, "the stuck stream runs")
        queued = [Raw(port) for _ in range(2)]
        for c in queued:
            c.send(request("POST", "/v1/completions", completion("Once", 50)))
        qs = Raw(port)
        qs.send(request("POST", "/v1/completions", completion("Once", 50, stream=True)))
        wait_for(lambda: srv.metric("smolrt_requests_waiting") == 3, "three queued")
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(10)
        dt = time.time() - t0
        check(rc == 0 and dt < 3.0, f"exit {rc} {dt:.2f} s after SIGTERM with --grace 2")
        for c in queued:
            st, h, b, _ = c.response()
            check(st == 503 and error_code(b) == "shutting_down" and "retry-after" in h,
                  f"a queued request at shutdown: {st} {b[:200]}")
        st, _, b, _ = qs.response()
        check(st == 200 and b'"shutting_down"' in b and b.rstrip().endswith(b"[DONE]"),
              f"a queued stream at shutdown: {b[-300:]!r}")
        for c in slow + idle + queued + [qs, stuck]:
            c.close()
    finally:
        srv.kill()

    # A running request past the grace period ends with finish_reason stop, stop_reason shutdown.
    srv = Server(binary, STORIES, "--parallel", "1", "--ctx", "512", "--step-delay-ms", "20",
                 "--grace", "1")
    try:
        c = Raw(srv.port)
        c.send(request("POST", "/v1/completions", completion("Once upon a time", 400)))
        wait_for(lambda: srv.metric("smolrt_requests_running") == 1, "running")
        srv.proc.send_signal(signal.SIGTERM)
        st, _, b, _ = c.response()
        choice = json.loads(b)["choices"][0]
        check(st == 200 and choice["finish_reason"] == "stop" and
              choice["stop_reason"] == "shutdown" and len(choice["text"]) > 0,
              f"running at shutdown: {st} {choice}")
        check(srv.proc.wait(10) == 0, "exit code")
    finally:
        srv.kill()


# --- CORS and /health ----------------------------------------------------------------------------

def case_cors(binary):
    srv = Server(binary, STORIES, "--ctx", "128", "--api-key", KEY)
    try:
        c = Raw(srv.port)
        c.send(request("GET", "/health"))
        st, _, b, _ = c.response()
        check(st == 200 and json.loads(b) == {"status": "ok"}, f"/health without the key: {b}")
        c.send(request("GET", "/health", headers=AUTH))
        st, _, b, _ = c.response()
        h = json.loads(b)
        check(st == 200 and h["status"] == "ok" and h["device"] and "model_path" in h,
              f"/health with the key: {h}")
        c.send(request("OPTIONS", "/v1/completions",
                       headers={"Origin": "http://app.example",
                                "Access-Control-Request-Method": "POST"}))
        st, hdr, _, _ = c.response()
        check(st == 204 and "allow" in hdr and
              not any(k.startswith("access-control") for k in hdr),
              f"OPTIONS without --cors-origin: {st} {hdr}")
        c.send(request("GET", "/v1/models", headers={**AUTH, "Origin": "http://app.example"}))
        st, hdr, _, _ = c.response()
        check(st == 200 and not any(k.startswith("access-control") for k in hdr),
              f"CORS headers without --cors-origin: {hdr}")
        c.close()
    finally:
        check(srv.stop() == 0, "exit code")

    srv = Server(binary, STORIES, "--ctx", "128", "--api-key", KEY, "--cors-origin",
                 "http://app.example", "--cors-origin", "https://other.example:8443")
    try:
        c = Raw(srv.port)
        c.send(request("OPTIONS", "/v1/chat/completions",
                       headers={"Origin": "http://app.example",
                                "Access-Control-Request-Method": "POST",
                                "Access-Control-Request-Headers": "authorization,content-type"}))
        st, hdr, _, _ = c.response()
        check(st == 204 and hdr.get("access-control-allow-origin") == "http://app.example" and
              "POST" in hdr.get("access-control-allow-methods", "") and
              "authorization" in hdr.get("access-control-allow-headers", "").lower() and
              "Origin" in hdr.get("vary", ""), f"preflight: {st} {hdr}")
        c.send(request("OPTIONS", "/v1/completions",
                       headers={"Origin": "http://evil.example",
                                "Access-Control-Request-Method": "POST"}))
        st, hdr, _, _ = c.response()
        check(st == 204 and "access-control-allow-origin" not in hdr, f"other origin: {hdr}")
        c.send(request("POST", "/v1/completions", completion("Once", 2),
                       {**AUTH, "Origin": "https://other.example:8443"}))
        st, hdr, _, _ = c.response()
        check(st == 200 and hdr.get("access-control-allow-origin") ==
              "https://other.example:8443", f"allowed origin: {hdr}")
        c.send(request("POST", "/v1/completions", completion("Once", 2),
                       {"Origin": "http://app.example"}))
        st, hdr, _, _ = c.response()
        check(st == 401 and hdr.get("access-control-allow-origin") == "http://app.example",
              f"a 401 a page can read: {st} {hdr}")
        c.close()
    finally:
        check(srv.stop() == 0, "exit code")
    srv = Server(binary, STORIES, "--ctx", "128", "--cors-origin", "*")
    try:
        c = Raw(srv.port)
        c.send(request("GET", "/v1/models", headers={"Origin": "http://anything.example"}))
        st, hdr, _, _ = c.response()
        check(st == 200 and hdr.get("access-control-allow-origin") == "*", f"'*': {hdr}")
        c.close()
    finally:
        check(srv.stop() == 0, "exit code")


# --- special tokens in chat content --------------------------------------------------------------

def case_special(binary):
    # The synthetic tiny model's byte vocab has <|im_start|> and <|im_end|> as control tokens.
    model = os.path.join(tempfile.mkdtemp(prefix="smolrt_http_"), "tiny.gguf")
    r = subprocess.run([binary, "synth", "--preset", "tiny", "-o", model], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0, f"synth: {r.stderr[-300:]}")

    def prompt_tokens(srv, content):
        st, _, b = ask(srv.port, json.dumps({"messages": [{"role": "user", "content": content}],
                                             "max_tokens": 1}), "/v1/chat/completions")
        check(st == 200, f"chat: {st} {b}")
        return b["usage"]["prompt_tokens"]

    counts = {}
    for flags in ([], ["--no-special-in-content"]):
        srv = Server(binary, model, "--ctx", "256", "--chat-template", "chatml", *flags)
        try:
            counts[bool(flags)] = [prompt_tokens(srv, c) for c in
                                   ("hello", "<|im_start|>system", "")]
        finally:
            check(srv.stop() == 0, "exit code")
    parsed, plain = counts[False], counts[True]
    check(parsed[0] == plain[0], f"plain content tokenized differently: {parsed} vs {plain}")
    # Parsed: <|im_start|> is one control token; plain: its 12 characters as text.
    check(parsed[1] == parsed[2] + 1 + len("system"), f"special parsed: {parsed}")
    check(plain[1] > parsed[1] + 4, f"--no-special-in-content: {plain} vs {parsed}")
    os.unlink(model)


# --- load ----------------------------------------------------------------------------------------

async def http_exchange(reader, writer, data):
    """Sends a request on an open asyncio connection; (status, body) of the answer."""
    writer.write(data)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":")[1])
    return status, await reader.readexactly(length)


async def load_main(port, refs):
    conns = []
    for _ in range(1000):
        conns.append(await asyncio.open_connection("127.0.0.1", port))
    slow, idle, active = conns[:100], conns[100:200], conns[200:]
    normal, others = active[:64], active[64:]
    stop = asyncio.Event()

    async def slowloris(w):
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        while not stop.is_set():
            w.write(b"X")
            await asyncio.sleep(1)

    async def normal_client(k, rw):
        reader, writer = rw
        prompt = list(refs)[k % len(refs)]
        for _ in range(2):
            st, body = await http_exchange(reader, writer, request(
                "POST", "/v1/completions", completion(prompt, 16)))
            got = json.loads(body)["choices"][0]["text"] if st == 200 else body[:200]
            check(st == 200 and got == refs[prompt], f"normal client {k}: {st} {got!r}")

    async def other_client(k, rw):
        reader, writer = rw
        reqs = [request("GET", "/health"), request("GET", "/v1/models"),
                request("POST", "/tokenize", '{"content": "Once upon a time"}'),
                request("POST", "/v1/completions", completion("The sun was", 4))]
        for j in range(2):
            st, body = await http_exchange(reader, writer, reqs[(k + j) % len(reqs)])
            check(st == 200, f"client {k}: {st} {body[:200]}")

    bg = [asyncio.create_task(slowloris(w)) for _, w in slow]
    # The server accepts asynchronously: a connection the client sees open may not be counted
    # yet, so ask until all are (or 10 s pass).
    reader, writer = idle[0]
    for _ in range(50):
        st, body = await http_exchange(reader, writer, request("GET", "/health"))
        open_now = json.loads(body)["connections"]
        if open_now >= 1000:
            break
        await asyncio.sleep(0.2)
    t0 = time.time()
    await asyncio.gather(*[normal_client(k, rw) for k, rw in enumerate(normal)],
                         *[other_client(k, rw) for k, rw in enumerate(others)])
    elapsed = time.time() - t0
    stop.set()
    await asyncio.gather(*bg)
    for _, w in conns:
        w.close()
    return open_now, elapsed


def case_load(binary):
    raise_fd_limit(1400)
    srv = Server(binary, STORIES, "--parallel", "16", "--queue", "1024", "--ctx", "128",
                 "--header-timeout", "120", "--no-log")
    try:
        prompts = ["Once upon a time", "The little dog", "Lily and Ben went to", "One day, a bird",
                   "Tom had a big red", "The sun was", "Sue liked to play", "In the park"]
        refs = {p: ask(srv.port, completion(p, 16))[2]["choices"][0]["text"] for p in prompts}
        t0 = time.time()
        open_now, elapsed = asyncio.run(load_main(srv.port, refs))
        check(open_now >= 1000, f"{open_now} connections open during the load test")
        print(f"load: 1,000 connections, 864 clients answered in {elapsed:.1f} s "
              f"({time.time() - t0:.1f} s with setup)")
        check(srv.metric('smolrt_requests_total{endpoint="/v1/completions",status="200"}') >=
              64 * 2 + 8, "completions counted")
    finally:
        check(srv.stop() == 0, "exit code")


CASES = {"framing": case_framing, "deadlines": case_deadlines, "limits": case_limits,
         "disconnect": case_disconnect, "shutdown": case_shutdown, "cors": case_cors,
         "special": case_special, "load": case_load}


if __name__ == "__main__":
    run_case(CASES, needs_openai=False)
