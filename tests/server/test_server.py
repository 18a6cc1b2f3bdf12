#!/usr/bin/env python3
"""`smolrt serve` end to end: starts the server on a free loopback port (--port 0) with the CPU
backend on stories260K (and on SmolLM2-135M-Instruct when it is in the cache), and checks it with
the official `openai` client and raw http.client.

One ctest per --case: api, errors, batching, lifecycle, smollm2. Exit 77 (ctest: skipped, the
reason printed) when `openai`, the fixtures or the model are missing.
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.environ.get("SMOLRT_FIXTURES", os.path.join(HERE, "..", "..", "..", "shared"))
STORIES = os.path.join(FIXTURES, "models", "stories260K.gguf")
SMOLLM2 = os.path.expanduser(os.environ.get(
    "SMOLRT_MODEL", "~/.cache/smolrt/SmolLM2-135M-Instruct.Q4_0.gguf"))


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(SKIP)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Server:
    """A `smolrt serve` process; stderr goes to a file (the request log)."""

    def __init__(self, binary, model, *args):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="smolrt_serve_", suffix=".log",
                                               delete=False)
        cmd = [binary, "serve", "-m", model, "--port", "0", "--backend", "cpu", "--threads", "1",
               *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 30
        self.port = None
        self.auth = {}  # headers for metric()
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.text()}")
            m = re.search(r"listening on http://[0-9.]+:(\d+)", self.text())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.05)
        check(self.port, "server did not print 'listening on' within 30 s:\n" + self.text())

    def text(self):
        with open(self.log.name) as f:
            return f.read()

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, headers, parsed JSON or text)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
        try:
            return r.status, dict(r.getheaders()), json.loads(text)
        except ValueError:
            return r.status, dict(r.getheaders()), text

    def metric(self, name):
        _, _, text = self.request("GET", "/metrics", headers=self.auth)
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if os.path.exists(self.log.name):
            os.unlink(self.log.name)

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        os.unlink(self.log.name)
        return rc


def client(srv, key="none"):
    import openai
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key=key, max_retries=0,
                         timeout=60)


# --- cases ---------------------------------------------------------------------------------------

def case_api(binary):
    srv = Server(binary, STORIES, "--parallel", "4", "--ctx", "256", "--chat-template", "chatml")
    try:
        oc = client(srv)
        models = oc.models.list().data
        check([m.id for m in models] == ["stories260K"], f"models: {models}")

        prompt = "Once upon a time"
        r = oc.completions.create(model="stories260K", prompt=prompt, max_tokens=16, temperature=0)
        text = r.choices[0].text
        check(len(text) > 0 and r.choices[0].finish_reason == "length", f"completion: {r}")
        _, _, tok = srv.request("POST", "/tokenize", {"content": prompt, "add_special": True})
        ids = tok["tokens"]
        check(r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 16 and
              r.usage.total_tokens == len(ids) + 16, f"usage {r.usage} vs {len(ids)} prompt ids")
        _, _, detok = srv.request("POST", "/detokenize", {"tokens": ids})
        check(detok["content"] == prompt, f"detokenize: {detok}")
        # The same prompt as token ids gives the same text.
        r2 = oc.completions.create(model="stories260K", prompt=ids, max_tokens=16, temperature=0)
        check(r2.choices[0].text == text, f"ids prompt: {r2.choices[0].text!r} vs {text!r}")

        # logit_bias: 100 on one token keeps only it (sampled at a temperature: it every time);
        # -100 on it as well as on the others the model's greedy text starts with still answers;
        # a bias between is a 400 naming the field.
        t = ids[-1]
        ro = oc.completions.create(model="stories260K", prompt=ids, max_tokens=6, temperature=0.9,
                                   seed=3, logit_bias={str(t): 100})
        _, _, only = srv.request("POST", "/detokenize", {"tokens": [t] * 6})
        check(ro.choices[0].text == only["content"], f"only {t}: {ro.choices[0].text!r}")
        _, _, head = srv.request("POST", "/tokenize", {"content": text, "add_special": False})
        rb = oc.completions.create(model="stories260K", prompt=ids, max_tokens=4, temperature=0,
                                   logit_bias={str(x): -100 for x in head["tokens"]})
        check(rb.choices[0].text and not rb.choices[0].text.startswith(text[:4]),
              f"banned {head['tokens']}: {rb.choices[0].text!r} after greedy {text!r}")
        status, _, body = srv.request("POST", "/v1/completions",
                                      {"prompt": prompt, "max_tokens": 2, "logit_bias": {"5": 3}})
        check(status == 400 and body["error"]["param"] == "logit_bias", f"bias 3: {status} {body}")

        # Streaming with include_usage: the same text, usage in the last chunk.
        chunks = list(oc.completions.create(model="stories260K", prompt=prompt, max_tokens=16,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
        streamed = "".join(c.choices[0].text for c in chunks if c.choices)
        check(streamed == text, f"stream {streamed!r} vs {text!r}")
        check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16,
              f"stream usage: {chunks[-1]}")
        check([c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length",
              "stream finish_reason")

        # Stop strings: cut before the match, finish_reason stop.
        word = text.split()[2]
        cut = text[:text.index(word)]
        r3 = oc.completions.create(model="stories260K", prompt=prompt, max_tokens=16,
                                   temperature=0, stop=["zzzz", word])
        check(r3.choices[0].text == cut and r3.choices[0].finish_reason == "stop",
              f"stop {word!r}: {r3.choices[0].text!r} vs {cut!r}")

        # Logprobs of generated tokens: greedy picks the top alternative.
        r4 = oc.completions.create(model="stories260K", prompt=prompt, max_tokens=8,
                                   temperature=0, logprobs=3)
        lp = r4.choices[0].logprobs
        check(len(lp.token_logprobs) == 8 and len(lp.tokens) == 8, f"logprobs: {lp}")
        check("".join(lp.tokens) == r4.choices[0].text, f"tokens {lp.tokens} vs text")
        for t, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            check(l <= 0 and 1 <= len(top) <= 3, f"logprob {l} top {top}")
            check(abs(max(top.values()) - l) < 1e-4, f"greedy token {t!r} is not the top: {top}")

        # Echo scoring (what lm-eval sends): prompt logprobs, the first null.
        r5 = oc.completions.create(model="stories260K", prompt=prompt + text, max_tokens=0,
                                   temperature=0, echo=True, logprobs=1)
        lp5 = r5.choices[0].logprobs
        check(r5.choices[0].text == prompt + text, f"echo text {r5.choices[0].text!r}")
        check(len(lp5.tokens) == r5.usage.prompt_tokens and lp5.token_logprobs[0] is None and
              lp5.top_logprobs[0] is None, f"echo logprobs: {lp5}")
        check(all(v is not None and v <= 0 for v in lp5.token_logprobs[1:]), "echo values")
        check(r5.usage.completion_tokens == 0, f"echo usage {r5.usage}")
        # The greedy continuation is the top token at each of its positions.
        n_gen = len(lp5.tokens) - len(ids)
        for top, l in zip(lp5.top_logprobs[-n_gen + 1:], lp5.token_logprobs[-n_gen + 1:]):
            check(abs(max(top.values()) - l) < 1e-3, f"echo greedy: {l} vs {top}")
        # echo + generation in one request, raw HTTP.
        st, _, body = srv.request("POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0})
        check(st == 200 and len(body["choices"][0]["logprobs"]["tokens"]) == len(ids) + 1,
              f"echo + 1: {body}")

        # Seeded sampling repeats.
        a = oc.completions.create(model="stories260K", prompt=prompt, max_tokens=12, seed=42)
        b = oc.completions.create(model="stories260K", prompt=prompt, max_tokens=12, seed=42)
        check(a.choices[0].text == b.choices[0].text, "same seed, different text")

        # Chat (the ChatML template forced: stories260K has none) and its streaming + logprobs.
        msgs = [{"role": "user", "content": "Tell me a story."}]
        c1 = oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=8,
                                        temperature=0)
        check(c1.choices[0].message.role == "assistant" and c1.usage.completion_tokens >= 1,
              f"chat: {c1}")
        cs = list(oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=8,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
        content = "".join(c.choices[0].delta.content or "" for c in cs if c.choices)
        check(content == c1.choices[0].message.content, f"chat stream {content!r}")
        check(cs[-1].usage.total_tokens == c1.usage.total_tokens, "chat stream usage")
        c2 = oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=4,
                                        temperature=0, logprobs=True, top_logprobs=2)
        lc = c2.choices[0].logprobs.content
        check(len(lc) == c2.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in lc),
              f"chat logprobs: {lc}")
        cs2 = list(oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=4,
                                              temperature=0, logprobs=True, top_logprobs=2,
                                              stream=True, stream_options={"include_usage": True}))
        n_lp = sum(len(c.choices[0].logprobs.content) for c in cs2
                   if c.choices and c.choices[0].logprobs)
        check(n_lp == cs2[-1].usage.completion_tokens, f"streamed chat logprobs: {n_lp}")

        # A second server on the same port fails to start, naming the port.
        other = subprocess.run([binary, "serve", "-m", STORIES, "--port", str(srv.port),
                                "--backend", "cpu"], capture_output=True, text=True, timeout=30)
        check(other.returncode == 1 and str(srv.port) in other.stderr,
              f"second server on a used port: rc {other.returncode} {other.stderr[-300:]}")

        st, _, h = srv.request("GET", "/health")
        check(st == 200 and h["status"] == "ok" and h["device"], f"health {h}")
        check(srv.metric("smolrt_generation_tokens_total") > 0, "generation counter")
        check(srv.metric('smolrt_requests_total{endpoint="/v1/completions",status="200"}') >= 8,
              "request counter")
    finally:
        check(srv.stop() == 0, "exit code after SIGTERM")


def case_errors(binary):
    srv = Server(binary, STORIES, "--parallel", "2", "--ctx", "128", "--api-key", "sekrit")
    auth = {"Authorization": "Bearer sekrit", "Content-Type": "application/json"}
    srv.auth = auth
    try:
        st, _, _ = srv.request("GET", "/health")
        check(st == 200, "/health needs no key")
        for h in ({}, {"Authorization": "Bearer wrong"}):
            st, _, body = srv.request("GET", "/v1/models", headers=h)
            check(st == 401 and body["error"]["type"] == "authentication_error", f"401: {body}")
        import openai
        try:
            client(srv, "wrong").models.list()
            check(False, "openai client with a wrong key")
        except openai.AuthenticationError:
            pass

        def expect(status, param, body=None, raw=None, path="/v1/completions"):
            st, _, b = srv.request("POST", path, body, headers=auth, raw=raw)
            check(st == status, f"{body or raw!r:.200}: status {st}, want {status}: {b!r:.300}")
            err = b["error"]
            check(set(err) >= {"message", "type", "param", "code"}, f"error object {err}")
            check(err["param"] == param, f"{body or raw!r:.100}: param {err['param']}, want {param}")

        expect(400, None, raw="{not json")
        expect(400, None, raw="[1, 2]")
        expect(400, "prompt", {"max_tokens": 4})
        expect(400, "prompt", {"prompt": ""})
        expect(400, "prompt", {"prompt": []})
        expect(400, "prompt", {"prompt": 42})
        expect(400, "prompt", {"prompt": [1, 2, 99999]})
        expect(400, "prompt", {"prompt": [1, -3]})
        expect(400, "prompt", {"prompt": [5] * 200})  # longer than --ctx 128
        expect(400, "temperature", {"prompt": "a", "temperature": "hot"})
        expect(400, "temperature", {"prompt": "a", "temperature": 9})
        expect(400, "top_p", {"prompt": "a", "top_p": 0})
        expect(400, "top_k", {"prompt": "a", "top_k": 1.5})
        expect(400, "min_p", {"prompt": "a", "min_p": 2})
        expect(400, "max_tokens", {"prompt": "a", "max_tokens": -1})
        expect(400, "max_tokens", {"prompt": "a", "max_tokens": "many"})
        expect(400, "n", {"prompt": "a", "n": 0})
        expect(400, "n", {"prompt": "a", "n": 17})
        expect(400, "logprobs", {"prompt": "a", "logprobs": 21})
        expect(400, "stop", {"prompt": "a", "stop": ["x"] * 17})
        expect(400, "stop", {"prompt": "a", "stop": 5})
        expect(400, "presence_penalty", {"prompt": "a", "presence_penalty": 3})
        expect(400, "repetition_penalty", {"prompt": "a", "repetition_penalty": 0})
        expect(400, "seed", {"prompt": "a", "seed": "x"})
        expect(400, "stream", {"prompt": "a", "stream": "yes"})
        expect(404, "model", {"prompt": "a", "model": "gpt-4"})
        expect(400, "messages", {"messages": [{"role": "user", "content": "hi"}]},
               path="/v1/chat/completions")  # no chat template on stories260K
        expect(400, "content", {"text": "a"}, path="/tokenize")
        expect(400, "tokens", {"tokens": [1, 100000]}, path="/detokenize")
        st, _, b = srv.request("POST", "/v1/completions", raw="x" * (9 << 20), headers=auth)
        check(st in (400, 413), f"9 MiB body: {st}")
        st, _, b = srv.request("GET", "/nope", headers=auth)
        check(st == 404 and "error" in b, f"unknown route {st} {b}")
        # Unknown fields are ignored; the server still serves after all of the above.
        st, _, b = srv.request("POST", "/v1/completions", {
            "prompt": "Once", "max_tokens": 3, "frobnicate": True, "temperature": 0},
            headers=auth)
        check(st == 200 and b["usage"]["completion_tokens"] == 3, f"after errors: {b}")
        check(srv.metric('smolrt_requests_total{endpoint="/v1/completions",status="400"}') >= 20,
              "400s counted")
    finally:
        check(srv.stop() == 0, "exit code after SIGTERM")


PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to", "One day, a bird",
           "Tom had a big red", "The sun was", "Sue liked to play", "In the park there was"]


def greedy(srv, prompt, n=24):
    st, _, b = srv.request("POST", "/v1/completions",
                           {"prompt": prompt, "max_tokens": n, "temperature": 0,
                            "ignore_eos": True})
    check(st == 200, f"{prompt}: {st} {b}")
    return b["choices"][0]["text"]


def concurrent(fn, args):
    out = [None] * len(args)
    errs = []

    def run(i):
        try:
            out[i] = fn(args[i])
        except Exception as e:  # noqa: BLE001 (reported below)
            errs.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(args))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]
    return out


def case_batching(binary):
    # 8 clients at once give the same greedy text as one at a time; with 4 sequences, small
    # prompt chunks and a KV pool too small for all of them (admission waits, preemption).
    srv = Server(binary, STORIES, "--parallel", "4", "--ctx", "128", "--max-step-tokens", "8")
    try:
        alone = [greedy(srv, p, 40) for p in PROMPTS]
        together = concurrent(lambda p: greedy(srv, p, 40), PROMPTS)
        for p, a, t in zip(PROMPTS, alone, together):
            check(a == t, f"{p!r}: alone {a!r} vs concurrent {t!r}")
        check(srv.metric("smolrt_batch_sequences_sum") > srv.metric("smolrt_steps_total"),
              "steps never carried more than one sequence")
        _, _, text = srv.request("GET", "/metrics", headers=srv.auth)
        check("\nsmolrt_steps_ahead_total 0\n" in text,
              "/metrics lacks smolrt_steps_ahead_total, or the CPU backend launched steps ahead")
        check("\nsmolrt_shared_prefix_rows_total 0\n" in text,
              "/metrics lacks smolrt_shared_prefix_rows_total, or the CPU backend counted rows")
        check("\nsmolrt_step_graph_captures_total 0\n" in text,
              "/metrics lacks smolrt_step_graph_captures_total, or the CPU backend counted graphs")
        # Every request's TTFT is its queue time (arrival -> first step) plus its prefill time
        # (-> first token), measured on one clock: the sums agree (the text format's rounding).
        n = len(PROMPTS) * 2
        for part in ("time_to_first_token", "request_queue", "request_prefill"):
            got = srv.metric(f"smolrt_{part}_seconds_count")
            check(got == n, f"smolrt_{part}_seconds_count {got}, expected {n}")
        ttft = srv.metric("smolrt_time_to_first_token_seconds_sum")
        parts = (srv.metric("smolrt_request_queue_seconds_sum") +
                 srv.metric("smolrt_request_prefill_seconds_sum"))
        check(ttft > 0 and abs(ttft - parts) < 1e-6 * n + 1e-9 * ttft,
              f"TTFT sum {ttft} vs queue + prefill {parts}")
    finally:
        check(srv.stop() == 0, "exit code")
    tight = Server(binary, STORIES, "--parallel", "4", "--ctx", "128", "--kv-size", "64")
    try:
        together = concurrent(lambda p: greedy(tight, p, 40), PROMPTS)
        for p, a, t in zip(PROMPTS, alone, together):
            check(a == t, f"tight pool, {p!r}: {a!r} vs {t!r}")
        check(tight.metric("smolrt_preemptions_total") > 0, "no preemption with a 64-token pool")
        wait_for(lambda: tight.metric("smolrt_kv_pages_used") == 0, "the pages back in the pool")
    finally:
        check(tight.stop() == 0, "exit code")


def stream_open(srv, body):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    check(r.status == 200, f"stream status {r.status}")
    return c, r


def wait_for(cond, what, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def case_lifecycle(binary):
    # Slow steps (20 ms) so requests overlap deterministically.
    srv = Server(binary, STORIES, "--parallel", "1", "--queue", "1", "--ctx", "256",
                 "--step-delay-ms", "20")
    try:
        # A client that disconnects mid-stream frees its sequence.
        c, r = stream_open(srv, {"prompt": "Once upon a time", "max_tokens": 200,
                                 "ignore_eos": True})
        r.readline()
        wait_for(lambda: srv.metric("smolrt_requests_running") == 1, "running == 1")
        c.sock.close()
        c.close()
        wait_for(lambda: srv.metric("smolrt_requests_running") == 0, "running back to 0")
        wait_for(lambda: "client disconnected" in srv.text(), "the disconnect in the log")
        wait_for(lambda: srv.metric("smolrt_kv_pages_used") == 0, "pages after the disconnect")

        # The same without streaming: the handler's heartbeat finds the closed socket.
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        c.request("POST", "/v1/completions", body=json.dumps({
            "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True}),
            headers={"Content-Type": "application/json"})
        wait_for(lambda: srv.metric("smolrt_requests_running") == 1, "running == 1")
        c.sock.close()
        c.close()
        wait_for(lambda: srv.metric("smolrt_requests_running") == 0, "non-streaming: running 0")
        check(srv.metric("smolrt_generation_tokens_total") < 400, "the request ran to its end")

        # Queue overflow: one running, one waiting, the third gets 503 + Retry-After.
        c1, r1 = stream_open(srv, {"prompt": "Once", "max_tokens": 100, "ignore_eos": True})
        wait_for(lambda: srv.metric("smolrt_requests_running") == 1, "first running")
        c2, r2 = stream_open(srv, {"prompt": "The dog", "max_tokens": 5, "ignore_eos": True})
        wait_for(lambda: srv.metric("smolrt_requests_waiting") == 1, "second waiting")
        st, hdr, b = srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
        check(st == 503 and "Retry-After" in hdr and b["error"]["code"] == "overloaded",
              f"overflow: {st} {hdr} {b}")
        wait_for(lambda: srv.metric(
            'smolrt_requests_total{endpoint="/v1/completions",status="503"}') == 1, "503 counted")
        c1.close()
        body2 = r2.read().decode()
        check("[DONE]" in body2, "the queued request finished")
        c2.close()
        wait_for(lambda: srv.metric("smolrt_requests_running") == 0, "idle")

        # SIGTERM drains: an in-flight request finishes, then exit 0.
        c3, r3 = stream_open(srv, {"prompt": "Once", "max_tokens": 30, "ignore_eos": True})
        r3.readline()
        srv.proc.send_signal(signal.SIGTERM)
        body3 = r3.read().decode()
        events = [json.loads(l[6:]) for l in body3.splitlines()
                  if l.startswith("data: {")]
        check(events and events[-1]["choices"][0]["finish_reason"] == "length",
              f"drained request: {body3[-300:]}")
        rc = srv.proc.wait(20)
        check(rc == 0, f"exit code {rc} after SIGTERM:\n{srv.text()[-2000:]}")
    finally:
        srv.kill()

    # Past the grace period the rest is cancelled (finish_reason "stop", stop_reason
    # "shutdown"), still exit 0; new requests during the drain get 503.
    srv = Server(binary, STORIES, "--parallel", "1", "--ctx", "256", "--step-delay-ms", "20",
                 "--grace", "1")
    try:
        c4, r4 = stream_open(srv, {"prompt": "Once", "max_tokens": 250, "ignore_eos": True})
        r4.readline()
        t0 = time.time()
        srv.proc.send_signal(signal.SIGINT)
        wait_for(lambda: "shutting down" in srv.text(), "the drain to start")
        st, _, _ = srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
        check(st == 503, f"a request during the drain: {st}")
        body4 = r4.read().decode()
        events = [json.loads(l[6:]) for l in body4.splitlines() if l.startswith("data: {")]
        last = events[-1]["choices"][0] if events else {}
        check(last.get("finish_reason") == "stop" and last.get("stop_reason") == "shutdown",
              f"cancelled request: {body4[-300:]}")
        rc = srv.proc.wait(20)
        check(rc == 0 and time.time() - t0 < 4, f"exit {rc} after {time.time() - t0:.1f} s")
    finally:
        srv.kill()


def case_smollm2(binary):
    if not os.path.exists(SMOLLM2):
        skip(f"{SMOLLM2} not found (scripts/fetch_model.sh)")
    srv = Server(binary, SMOLLM2, "--parallel", "2", "--ctx", "512")
    try:
        oc = client(srv)
        name = oc.models.list().data[0].id
        r = oc.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24, temperature=0)
        text = r.choices[0].message.content
        check("Paris" in text, f"SmolLM2 chat: {text!r}")
        check(r.choices[0].finish_reason in ("stop", "length"), f"finish {r}")
        # Streamed, and 4 at once: the same greedy replies as one at a time.
        questions = ["What is the capital of France?", "Name a color.", "What is 2+2?",
                     "Say hello."]

        def ask(q, stream=False):
            kw = dict(model=name, messages=[{"role": "user", "content": q}], max_tokens=16,
                      temperature=0)
            if not stream:
                return oc.chat.completions.create(**kw).choices[0].message.content
            return "".join(c.choices[0].delta.content or ""
                           for c in oc.chat.completions.create(stream=True, **kw) if c.choices)

        # lm-eval's scoring: echo logprobs of prompt + greedy continuation equal the logprobs
        # the continuation had when it was generated.
        _, _, tk = srv.request("POST", "/tokenize", {"content": "The capital of France is",
                                                      "add_special": True})
        pids = tk["tokens"]
        g = oc.completions.create(model=name, prompt=pids, max_tokens=8, temperature=0,
                                  logprobs=1)
        _, _, gt = srv.request("POST", "/tokenize", {"content": g.choices[0].text})
        gids = gt["tokens"]
        s = oc.completions.create(model=name, prompt=pids + gids, max_tokens=0, echo=True,
                                  logprobs=1)
        scored = s.choices[0].logprobs.token_logprobs[len(pids):]
        generated = g.choices[0].logprobs.token_logprobs
        check(len(gids) == 8 and all(abs(a - b) < 1e-3 for a, b in zip(scored, generated)),
              f"echo scoring {scored} vs generation {generated}")

        alone = [ask(q) for q in questions]
        check(ask(questions[0], stream=True) == alone[0], "SmolLM2 streamed reply differs")
        together = concurrent(ask, questions)
        check(together == alone, f"SmolLM2 concurrent {together} vs alone {alone}")
    finally:
        check(srv.stop() == 0, "exit code")


def case_bench(binary):
    # scripts/bench_serve.py, the benchmark client the GPU figures come from: every request
    # answered, the generated count what was asked (ignore_eos), the server's own view of the
    # level from /metrics consistent with it, and none of the measured prompts served by the
    # prefix cache (they differ from each other and from the warm-up round's).
    srv = Server(binary, STORIES, "--parallel", "4", "--ctx", "512")  # its prompts: ~270 tokens
    out = tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False)
    try:
        script = os.path.join(HERE, "..", "..", "scripts", "bench_serve.py")
        r = subprocess.run([sys.executable, script, "--port", str(srv.port), "--concurrency", "1,4",
                            "--min-requests", "8", "--requests-per-client", "2", "--gen-tokens",
                            "8", "--procs", "2", "--warmup", "1", "--out", out.name],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"bench_serve exited {r.returncode}: {r.stderr[-2000:]}")
        recs = [json.loads(line) for line in open(out.name)]
        check([d["concurrency"] for d in recs] == [1, 4], f"levels: {recs}")
        for d in recs:
            c = d["concurrency"]
            check(d["errors"] == 0 and d["requests"] == 8, f"C={c}: {d}")
            check(d["cached_tokens_per_request"] == 0, f"C={c}: prompts repeated: {d}")
            made = d["gen_tok_s"] * d["wall_s"]
            check(abs(made - 8 * 8) < 1, f"C={c}: {made} tokens generated, 64 asked")
            check(0 < d["ttft_p50_s"] <= d["request_p50_s"], f"C={c}: latencies {d}")
            # 8 tokens: 7 after the first, each at most the request's time
            check(0 < 7 * d["tpot_p50_s"] < d["request_p99_s"], f"C={c}: time per token {d}")
            sv = d["server"]
            check(sv is not None, f"C={c}: no server view (is /metrics read?)")
            # 8 tokens per request, the first from the prompt's step: 7 one-token steps each.
            check(sv["steps"] >= 8 * 8 // c and 1 <= sv["rows_per_step"] <= c,
                  f"C={c}: server view {sv}")
            check(sv["tokens_per_step"] >= sv["rows_per_step"], f"C={c}: {sv}")
            check(0 < sv["step_share"] <= 1 and sv["ttft_mean_ms"] > 0, f"C={c}: {sv}")
        # --gen-tokens-min: each request's length drawn for its id; the tokens generated are the
        # sum of the measured requests' draws (ids C * 1e6 + i, i < 8, as the script numbers them).
        open(out.name, "w").close()
        r = subprocess.run([sys.executable, script, "--port", str(srv.port), "--concurrency", "4",
                            "--min-requests", "8", "--requests-per-client", "2", "--gen-tokens",
                            "12", "--gen-tokens-min", "2", "--procs", "2", "--out", out.name],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"bench_serve exited {r.returncode}: {r.stderr[-2000:]}")
        sys.path.insert(0, os.path.dirname(script))
        import bench_serve
        a = argparse.Namespace(gen_tokens=12, gen_tokens_min=2)
        draws = [bench_serve.gen_tokens(a, 4 * 1000000 + i) for i in range(8)]
        check(len(set(draws)) > 1, f"one length for every request: {draws}")
        d = json.loads(open(out.name).readline())
        made = d["gen_tok_s"] * d["wall_s"]
        check(d["errors"] == 0 and abs(made - sum(draws)) < 1,
              f"{made} tokens generated, the draws {draws} sum to {sum(draws)}: {d}")
    finally:
        os.unlink(out.name)
        check(srv.stop() == 0, "exit code")


CASES = {"api": case_api, "errors": case_errors, "batching": case_batching,
         "lifecycle": case_lifecycle, "smollm2": case_smollm2, "bench": case_bench}


def run_case(cases, needs_openai):
    """The command line of a test script: --smolrt BINARY --case NAME; skips (exit 77) without
    the fixtures (or `openai` when the cases need it)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--smolrt", required=True)
    ap.add_argument("--case", choices=sorted(cases), required=True)
    a = ap.parse_args()
    if needs_openai:
        try:
            import openai  # noqa: F401
        except ImportError:
            skip("the `openai` package is missing (pip install -r scripts/test-requirements.txt)")
    if not os.path.exists(STORIES):
        skip(f"fixtures not found ({STORIES}); set SMOLRT_FIXTURES")
    t0 = time.time()
    cases[a.case](a.smolrt)
    print(f"{a.case}: ok ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    run_case(CASES, needs_openai=True)
