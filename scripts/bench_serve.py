#!/usr/bin/env python3
"""Serving benchmark for a running `smolrt serve` (python3 stdlib only).

For each concurrency level C (default 1,8,64,256) it sends max(4*C, 16) streaming
/v1/completions requests from C clients (threads spread over up to 64 processes; each client
keeps its HTTP connection alive between its requests), after one
unrecorded warm-up round of other prompts: ~100-word text prompts (the text differs per request
and from the warm-up's, so the prefix cache holds none of it; ~100 tokens on the SmolLM2
vocabulary), or with --prompt-ids N prompts of exactly N token ids (the same length
on every vocabulary), 128 generated tokens each (ignore_eos, temperature 0 unless
--temperature). It measures the time to the first streamed token and the whole request time, and
prints and appends one JSON line per level to --out: device (from /health), commit (--commit,
else the server's), date, C, aggregate generated and prompt tok/s, TTFT p50/p99, request time
p50/p99 (seconds), prompt tokens the prefix cache served per request, and "server": smolrt's own
view of the level from its /metrics (mean TTFT from arrival to the first token's sampling and its
two parts, queue (to the request's first step) and prefill (from there), mean step time, steps,
rows and tokens per step, the share of the wall time spent in steps, the share of steps launched
ahead, the step graphs recorded), null for a server without them.

Workload options (recorded in each line):
  --shared-prefix N      every prompt starts with the same N tokens (natural text from the server's
                         /tokenize, sent as ids) followed by the request's own --prompt-ids ids
                         (default 50): a shared system prompt, what the prefix cache is for.
  --response-format F    the JSON schema in file F goes with every request as response_format
                         {"type": "json_schema", ...} (structured output; requests end when the
                         schema's value is complete, so generated tokens come from usage).
  --n N                  N choices per request (the prompt prefilled once, N samples).
  --gen-tokens-min N     each request's length drawn for its id from [N, --gen-tokens]: closed-loop
                         clients whose requests all have one length finish, and so arrive, in groups.

    build/smolrt serve --parallel 64 &
    python3 scripts/bench_serve.py --port 8080 --out bench/results/serve.jsonl
    python3 scripts/bench_serve.py --concurrency 64 --shared-prefix 1000 --prompt-ids 50
"""
import argparse
import datetime
import http.client
import json
import multiprocessing
import random
import sys
import threading
import time

WORDS = ("the a little girl boy dog cat tree house ran jumped played found happy sad big small "
         "sun day night park friend mom dad ball red blue green toy box water bird fish flower "
         "garden school book car road hill river sky cloud rain wind snow apple cake").split()


def prompt_text(i, n_words=99):
    # ~100 tokens of story-like text drawn for request id i: two ids share a first page of tokens
    # (which the server's prefix cache would serve instead of prefilling them) with negligible odds.
    r = random.Random(i)
    return " ".join(r.choice(WORDS) for _ in range(n_words)) + "."


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def prompt_ids(i, n):
    # n ids in [100, 1100) drawn for request id i (in every vocabulary of the presets).
    r = random.Random(i)
    return [r.randrange(100, 1100) for _ in range(n)]


def gen_tokens(a, i):
    """Request i's max_tokens: --gen-tokens, or with --gen-tokens-min drawn for the request id
    (the same for every server and run) uniformly from [--gen-tokens-min, --gen-tokens]."""
    if a.gen_tokens_min is None:
        return a.gen_tokens
    return random.Random(i * 7919 + 17).randint(a.gen_tokens_min, a.gen_tokens)


def request_body(a, i):
    """The /v1/completions body of request i under the workload options."""
    if a.prefix_ids:
        prompt = a.prefix_ids + prompt_ids(i, a.prompt_ids or 50)
    else:
        prompt = prompt_ids(i, a.prompt_ids) if a.prompt_ids > 0 else prompt_text(i)
    body = {"prompt": prompt, "max_tokens": gen_tokens(a, i), "temperature": a.temperature,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if a.model:
        body["model"] = a.model
    if a.n > 1:
        body["n"] = a.n
    if a.top_p is not None:
        body["top_p"] = a.top_p
    if a.top_k is not None:
        body["top_k"] = a.top_k
    if a.schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "bench", "schema": a.schema}}
    return body


def shared_prefix_ids(a, headers):
    """a.shared_prefix ids of story-like text on the served vocabulary (BOS first if it has one)."""
    text = " ".join(prompt_text(k) for k in range(a.shared_prefix // 50 + 2))
    c = http.client.HTTPConnection(a.host, a.port, timeout=60)
    c.request("POST", "/tokenize", body=json.dumps({"content": text, "add_special": True}),
              headers={"Content-Type": "application/json", **headers})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"bench_serve: POST /tokenize answered {r.status}: {r.read()[:300]!r}")
    ids = json.loads(r.read())["tokens"]
    c.close()
    if len(ids) < a.shared_prefix:
        sys.exit(f"bench_serve: the prefix text has only {len(ids)} tokens")
    return ids[:a.shared_prefix]


def one_request(a, i, headers, c):
    """Request i on the client's connection c (kept alive between its requests, as API clients'
    connection pools do: the time measured is the request's, not a TCP handshake's)."""
    body = request_body(a, i)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json", **headers})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft = None
    generated = prompt_tokens = cached = 0
    for raw in r:
        # Only the events that matter are parsed (the first text of any choice, the usage): at
        # hundreds of thousands of events a second the client must not be what is measured.
        if ttft is None and raw.startswith(b"data: {"):
            ev = json.loads(raw[6:])
            if ev.get("choices") and ev["choices"][0].get("text"):
                ttft = time.perf_counter() - t0
        if b'"usage"' in raw and raw.startswith(b"data: {"):
            ev = json.loads(raw[6:])
            if ev.get("usage"):
                u = ev["usage"]
                generated = u["completion_tokens"]
                prompt_tokens = u["prompt_tokens"]
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    t = time.perf_counter() - t0
    return ttft if ttft is not None else t, t, generated, prompt_tokens, cached


def client_process(a, ids, conc, headers, q):
    """conc threads of one process work through the request ids `ids`; results go to q."""
    results, errors = [], []
    lock = threading.Lock()
    todo = list(ids)

    def worker():
        c = None
        while True:
            with lock:
                if not todo:
                    break
                i = todo.pop(0)
            if c is None:
                c = http.client.HTTPConnection(a.host, a.port, timeout=600)
            try:
                res = one_request(a, i, headers, c)
                with lock:
                    results.append(res)
            except Exception as e:  # noqa: BLE001 (counted and reported)
                with lock:
                    errors.append(str(e))
                c.close()  # a fresh connection for the next request
                c = None
        if c is not None:
            c.close()

    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.put((results, errors))


# The server's own counters (`smolrt serve`'s /metrics): their change over a level gives its view
# of the run, none of the client's time in it.
SERVER_SERIES = ("smolrt_time_to_first_token_seconds_sum", "smolrt_time_to_first_token_seconds_count",
                 "smolrt_step_seconds_sum", "smolrt_step_seconds_count",
                 "smolrt_batch_tokens_sum", "smolrt_batch_sequences_sum", "smolrt_steps_ahead_total")
# Series of servers from 2026-11-29 on (taken where present): TTFT's two parts (arrival -> first
# step, first step -> first token), the rows that took cascade attention, the step graphs recorded.
NEWER_SERIES = ("smolrt_request_queue_seconds_sum", "smolrt_request_queue_seconds_count",
                "smolrt_request_prefill_seconds_sum", "smolrt_request_prefill_seconds_count",
                "smolrt_shared_prefix_rows_total", "smolrt_step_graph_captures_total")


def server_counters(a, headers):
    """The SERVER_SERIES values now, or None where the server has no /metrics (llama-server)."""
    try:
        c = http.client.HTTPConnection(a.host, a.port, timeout=30)
        c.request("GET", "/metrics", headers=headers)
        r = c.getresponse()
        body = r.read().decode()
        c.close()
    except (OSError, http.client.HTTPException):
        return None
    if r.status != 200:
        return None
    v = {}
    for line in body.splitlines():
        parts = line.split()
        if len(parts) == 2 and (parts[0] in SERVER_SERIES or parts[0] in NEWER_SERIES):
            v[parts[0]] = float(parts[1])
    return v if all(k in v for k in SERVER_SERIES) else None


def server_view(before, after, wall):
    """Means over the level: TTFT from arrival to the first token's sampling (and its queue and
    prefill parts where the server has them), the backend step, rows and tokens per step, the share
    of the wall time the scheduler spent in steps, and the share of steps the engine launched ahead
    (speculated)."""
    if before is None or after is None:
        return None
    d = {k: after[k] - before[k] for k in SERVER_SERIES + NEWER_SERIES if k in after and k in before}
    steps = d["smolrt_step_seconds_count"]
    firsts = d["smolrt_time_to_first_token_seconds_count"]
    if steps <= 0:
        return None
    return {
        "ttft_mean_ms": round(1e3 * d["smolrt_time_to_first_token_seconds_sum"] / firsts, 3)
        if firsts > 0 else None,
        "step_mean_ms": round(1e3 * d["smolrt_step_seconds_sum"] / steps, 3),
        "steps": int(steps),
        "rows_per_step": round(d["smolrt_batch_sequences_sum"] / steps, 1),
        "tokens_per_step": round(d["smolrt_batch_tokens_sum"] / steps, 1),
        "step_share": round(d["smolrt_step_seconds_sum"] / wall, 3) if wall > 0 else None,
        "steps_ahead_share": round(d["smolrt_steps_ahead_total"] / steps, 3),
        **{f"{part}_mean_ms": round(1e3 * d[f"smolrt_request_{part}_seconds_sum"] /
                                    d[f"smolrt_request_{part}_seconds_count"], 3)
           for part in ("queue", "prefill")
           if d.get(f"smolrt_request_{part}_seconds_count", 0) > 0},
        # Step graphs recorded during the level (each one's step took milliseconds longer).
        **({"graph_captures": int(d["smolrt_step_graph_captures_total"])}
           if "smolrt_step_graph_captures_total" in d else {}),
        # The share of step rows that took cascade attention (servers from 2026-11-29 on).
        **({"shared_prefix_rows_share": round(d["smolrt_shared_prefix_rows_total"] /
                                              d["smolrt_batch_tokens_sum"], 3)}
           if "smolrt_shared_prefix_rows_total" in d and d["smolrt_batch_tokens_sum"] > 0 else {}),
    }


def run_level(a, conc, info, headers, warmup=False):
    """C clients, spread over up to --procs processes (threads in each), so the GIL of one
    Python process does not cap the request rate; each client sends its requests back to back."""
    n = max(a.requests_per_client * conc, a.min_requests)
    procs = max(1, min(a.procs, conc))
    q = multiprocessing.Queue()
    ps = []
    # Request ids differ across levels and between a level's warm-up and its measured run: the
    # measured prompts are new to the server (their own tokens prefilled, not cache hits).
    base = conc * 1000000 + (500000 if warmup else 0)
    for k in range(procs):
        ids = [base + i for i in range(k, n, procs)]
        cc = conc // procs + (1 if k < conc % procs else 0)
        ps.append(multiprocessing.Process(target=client_process, args=(a, ids, cc, headers, q)))
    before = server_counters(a, headers)
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    results, errors = [], []
    for _ in ps:
        r, e = q.get()
        results += r
        errors += e
    wall = time.perf_counter() - t0
    after = server_counters(a, headers)
    for p in ps:
        p.join()
    ttfts = [r[0] for r in results]
    times = [r[1] for r in results]
    # Time per output token after the first (vLLM's TPOT): a request's decode speed, the figure
    # `smolrt bench`'s decode tok/s compares with (its prompt and the HTTP exchange left out).
    tpots = [(r[1] - r[0]) / (r[2] - 1) for r in results if r[2] > 1]
    gen = sum(r[2] for r in results)
    prompt = sum(r[3] for r in results)
    cached = sum(r[4] for r in results)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": info.get("device"), "backend": info.get("backend"),
        "commit": a.commit or info.get("commit"), "model": info.get("model_path"),
        "kv_type": info.get("kv_type"),
        "kv_ring_rows": info.get("kv_ring_rows"),
        "concurrency": conc, "requests": n, "errors": len(errors),
        "shared_prefix": a.shared_prefix, "n": a.n, "temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k, "response_format": a.response_format or None,
        "gen_tokens_per_request": a.gen_tokens,
        "gen_tokens_min": a.gen_tokens_min, "wall_s": round(wall, 3),
        "gen_tok_s": round(gen / wall, 1) if wall > 0 else None,
        "prompt_tokens_per_request": round(prompt / max(len(results), 1), 1),
        "prompt_tok_s": round(prompt / wall, 1) if wall > 0 else None,
        "cached_tokens_per_request": round(cached / max(len(results), 1), 1),
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "request_p50_s": percentile(times, 50), "request_p99_s": percentile(times, 99),
        "tpot_p50_s": percentile(tpots, 50),
        "first_error": errors[0] if errors else None,
        # The server's counters over the level (None without smolrt's /metrics); the wall time
        # includes starting the client processes.
        "server": server_view(before, after, wall),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--model", default="", help="the 'model' field (default: none)")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--concurrency", default="1,8,64,256", help="comma-separated levels")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens-min", type=int, default=None, metavar="N",
                    help="each request's max_tokens drawn uniformly from [N, --gen-tokens] "
                         "(default: all --gen-tokens; equal lengths make closed-loop clients "
                         "finish, and so arrive, in groups)")
    ap.add_argument("--prompt-ids", type=int, default=0,
                    help="prompts of exactly this many token ids (default: ~100-word text)")
    ap.add_argument("--shared-prefix", type=int, default=0, metavar="N",
                    help="every prompt starts with the same N tokens, then its own --prompt-ids "
                         "ids (default 50)")
    ap.add_argument("--response-format", default="", metavar="FILE",
                    help="a JSON schema file sent as response_format json_schema")
    ap.add_argument("--n", type=int, default=1, help="choices per request")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature (0: greedy; above 0 the server's sampler runs, "
                         "its other settings at their defaults)")
    ap.add_argument("--top-p", type=float, default=None,
                    help="top_p sent with each request (default: none, the server's default)")
    ap.add_argument("--top-k", type=int, default=None,
                    help="top_k sent with each request (default: none, the server's default)")
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--requests-per-client", type=int, default=4,
                    help="requests each client sends back to back (the level sends max(this*C, "
                         "--min-requests))")
    # A process's client threads share one GIL: a thread whose first event has arrived waits for
    # the others' event parsing, which shows up as time to first token. One process per client,
    # up to 64, keeps that out of the measurement.
    ap.add_argument("--procs", type=int, default=64, help="client processes at most")
    ap.add_argument("--warmup", type=int, default=1,
                    help="first run each level once unrecorded (CUDA graph captures, caches)")
    ap.add_argument("--commit", default="", help="recorded as the commit (default: the server's)")
    ap.add_argument("--out", default="", help="append the JSON lines to this file")
    a = ap.parse_args()
    if a.gen_tokens_min is not None and not 1 <= a.gen_tokens_min <= a.gen_tokens:
        ap.error("--gen-tokens-min must be in [1, --gen-tokens]")
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    c = http.client.HTTPConnection(a.host, a.port, timeout=30)
    c.request("GET", "/health", headers=headers)  # with --api-key, details need the key
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"bench_serve: GET /health answered {r.status}; is `smolrt serve` running?")
    info = json.loads(r.read())
    c.close()
    a.schema = None
    if a.response_format:
        with open(a.response_format) as f:
            a.schema = json.load(f)
    a.prefix_ids = shared_prefix_ids(a, headers) if a.shared_prefix > 0 else []
    for conc in [int(x) for x in a.concurrency.split(",") if x]:
        if a.warmup:
            run_level(a, conc, info, headers, warmup=True)
        rec = run_level(a, conc, info, headers)
        line = json.dumps(rec)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
