#!/usr/bin/env python3
"""`smolrt serve` end to end for structured output, tool calling, n > 1 and the prefix cache,
with the official `openai` client (CPU backend).

One ctest per --case:
  schemas  SmolLM2: 29 JSON schemas (tests/grammar/schemas.json) sent as response_format
           json_schema; every reply that ends by itself validates with `jsonschema`, and at least
           20 distinct schemas do; n = 4 samples under a schema; the client's parse() with a
           pydantic model; json_object and a GBNF `grammar`.
  tools    SmolLM2: a named tool_choice gives finish_reason "tool_calls" and a call whose
           arguments match the tool's schema; streamed deltas rebuild the same call; the tool's
           result sent back as a role "tool" message gets a plain answer; the repeated tools
           prompt is served from the prefix cache.
  n        stories260K: n = 4 gives 4 choices, distinct seeded samples, repeatable by seed, the
           same text streamed (per-choice deltas by index); usage counts every choice.
  prefix   stories260K: a long prompt twice: cached_tokens > 0 the second time, the same greedy
           text; --no-prefix-cache reports 0 and the same text; a KV pool too small for every
           prefix evicts the least recently used one and keeps every answer the uncached one.
  errors   stories260K: bad response_format / grammar / tools / tool_choice / n are 400s naming
           the field, and the server keeps serving.
Exit 77 (ctest: skipped, the reason printed) without `openai`, `jsonschema`, the fixtures or
SmolLM2.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_server import (SMOLLM2, STORIES, Server, check, concurrent, run_case,  # noqa: E402
                         skip)

SCHEMAS = os.path.join(HERE, "..", "grammar", "schemas.json")
MIN_VALID_SCHEMAS = 20


def client(srv, timeout=60):
    import openai
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none",
                         max_retries=0, timeout=timeout)


def smollm2(binary, *args):
    if not os.path.exists(SMOLLM2):
        skip(f"{SMOLLM2} not found (scripts/fetch_model.sh)")
    return Server(binary, SMOLLM2, *args)


def validator():
    try:
        import jsonschema
    except ImportError:
        skip("the `jsonschema` package is missing (pip install -r scripts/test-requirements.txt)")
    return jsonschema


# --- schemas -------------------------------------------------------------------------------------

def case_schemas(binary):
    jsonschema = validator()
    with open(SCHEMAS) as f:
        schemas = json.load(f)
    check(len(schemas) >= MIN_VALID_SCHEMAS, f"{len(schemas)} schemas in {SCHEMAS}")
    srv = smollm2(binary, "--parallel", "16", "--ctx", "512")
    try:
        oc = client(srv, timeout=600)
        name = oc.models.list().data[0].id

        def ask(s):
            schema = s["schema"]
            r = oc.chat.completions.create(
                model=name, max_tokens=128, temperature=0,
                messages=[{"role": "system", "content": "Reply with a short JSON example only."},
                          {"role": "user",
                           "content": f"An example '{s['name']}' object, please."}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": s["name"], "schema": schema,
                                                 "strict": True}})
            return r.choices[0]

        replies = concurrent(ask, schemas)
        valid = []
        for s, c in zip(schemas, replies):
            text = c.message.content
            if c.finish_reason != "stop":  # cut by max_tokens: a prefix of a valid reply
                check(c.finish_reason == "length", f"{s['name']}: finish {c.finish_reason}")
                continue
            try:
                obj = json.loads(text)
            except ValueError as e:
                raise AssertionError(f"{s['name']}: not JSON ({e}): {text!r}")
            try:
                jsonschema.validate(obj, s["schema"])
            except jsonschema.ValidationError as e:
                raise AssertionError(f"{s['name']}: {text!r} does not validate: {e.message}")
            valid.append(s["name"])
        print(f"{len(valid)}/{len(schemas)} schemas ended by themselves and validate; "
              f"cut by max_tokens: {sorted(set(x['name'] for x in schemas) - set(valid))}")
        check(len(valid) >= MIN_VALID_SCHEMAS, f"only {len(valid)} schemas validated: {valid}")

        # n = 4 seeded samples under one schema: 4 choices, each its own valid object.
        person = schemas[0]
        check(person["name"] == "person", f"schemas.json starts with {person['name']}")
        r = oc.chat.completions.create(
            model=name, max_tokens=100, temperature=0.8, seed=3, n=4,
            messages=[{"role": "user", "content": "Invent a person as JSON."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": person["schema"]}})
        check([c.index for c in r.choices] == [0, 1, 2, 3], f"n = 4: {r.choices}")
        for c in r.choices:
            if c.finish_reason == "stop":
                jsonschema.validate(json.loads(c.message.content), person["schema"])
        check(len(set(c.message.content for c in r.choices)) > 1, f"n = 4 samples: {r.choices}")

        # The client's own structured-output helper with a pydantic model.
        try:
            import pydantic
        except ImportError:
            pydantic = None
        if pydantic is not None:
            class City(pydantic.BaseModel):
                name: str
                country: str
                population: int

            p = oc.chat.completions.parse(
                model=name, max_tokens=80, temperature=0, response_format=City,
                messages=[{"role": "user", "content": "Describe Paris as JSON."}])
            check(p.choices[0].finish_reason != "stop" or
                  isinstance(p.choices[0].message.parsed, City), f"parse(): {p.choices[0]}")

        # json_object: any JSON object.
        r = oc.chat.completions.create(
            model=name, max_tokens=120, temperature=0,
            messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
            response_format={"type": "json_object"})
        c = r.choices[0]
        if c.finish_reason == "stop":
            check(isinstance(json.loads(c.message.content), dict), f"json_object: {c}")
        # llama.cpp's GBNF grammar field (an extension the openai client passes in extra_body).
        r = oc.chat.completions.create(
            model=name, max_tokens=8, temperature=0,
            messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
            extra_body={"grammar": 'root ::= ("yes" | "no") "."'})
        check(r.choices[0].message.content in ("yes.", "no.") and
              r.choices[0].finish_reason == "stop", f"GBNF: {r.choices[0]}")
    finally:
        check(srv.stop() == 0, "exit code after SIGTERM")


# --- tools ---------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                   "required": ["zone"]}}}


def case_tools(binary):
    jsonschema = validator()
    srv = smollm2(binary, "--parallel", "2", "--ctx", "1024")
    try:
        oc = client(srv, timeout=600)
        name = oc.models.list().data[0].id
        msgs = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
        kw = dict(model=name, messages=msgs, tools=[WEATHER, TIME], max_tokens=60, temperature=0,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
        r = oc.chat.completions.create(**kw)
        c = r.choices[0]
        check(c.finish_reason == "tool_calls", f"finish_reason: {c}")
        calls = c.message.tool_calls
        check(len(calls) == 1 and calls[0].type == "function" and
              calls[0].function.name == "get_weather" and calls[0].id.startswith("call_"),
              f"tool_calls: {calls}")
        args = json.loads(calls[0].function.arguments)  # arguments: a JSON string
        jsonschema.validate(args, WEATHER["function"]["parameters"])

        # Streamed: the same call from delta.tool_calls (id and name first, then fragments), and
        # the tools prompt comes from the prefix cache.
        chunks = list(oc.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True}, **kw))
        sid, sname, sargs, finish = None, None, "", None
        for ch in chunks:
            if not ch.choices:
                continue
            d = ch.choices[0].delta
            for t in d.tool_calls or []:
                check(t.index == 0, f"one call: {t}")
                if t.id:
                    check(sid is None, f"the id comes once: {t}")
                    sid, sname = t.id, t.function.name
                sargs += t.function.arguments or ""
            finish = ch.choices[0].finish_reason or finish
        check(sname == "get_weather" and sid and sargs == calls[0].function.arguments and
              finish == "tool_calls", f"streamed call {sname} {sargs!r} {finish}")
        usage = chunks[-1].usage
        check(usage.prompt_tokens == r.usage.prompt_tokens and
              usage.prompt_tokens_details.cached_tokens > 0, f"cached tools prompt: {usage}")

        # "required" without parallel calls: exactly one call of some tool.
        r2 = oc.chat.completions.create(**{**kw, "tool_choice": "required",
                                           "parallel_tool_calls": False})
        c2 = r2.choices[0]
        check(c2.finish_reason == "tool_calls" and len(c2.message.tool_calls) == 1 and
              c2.message.tool_calls[0].function.name in ("get_weather", "get_time"),
              f"required: {c2}")

        # The result goes back as a role "tool" message; the model answers in text.
        # The assistant message goes back as the client returned it.
        follow = msgs + [
            c.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": calls[0].id,
             "content": json.dumps({"temperature": 21, "sky": "sunny"})}]
        a = oc.chat.completions.create(model=name, messages=follow, tools=[WEATHER, TIME],
                                       tool_choice="none", max_tokens=40, temperature=0)
        ca = a.choices[0]
        check(ca.message.tool_calls is None and ca.message.content and
              ca.finish_reason in ("stop", "length"), f"answer after the tool result: {ca}")
        check(a.usage.prompt_tokens > r.usage.prompt_tokens - 200, f"usage {a.usage}")
        print(f"answer: {ca.message.content!r}")
    finally:
        check(srv.stop() == 0, "exit code after SIGTERM")


# --- n -------------------------------------------------------------------------------------------

def case_n(binary):
    srv = Server(binary, STORIES, "--parallel", "4", "--ctx", "256")
    try:
        oc = client(srv)
        kw = dict(model="stories260K", prompt="Once upon a time", max_tokens=24, n=4, seed=7,
                  temperature=1.0, extra_body={"ignore_eos": True})
        r = oc.completions.create(**kw)
        check([c.index for c in r.choices] == [0, 1, 2, 3], f"indices {r.choices}")
        texts = [c.text for c in r.choices]
        check(len(set(texts)) == 4, f"4 distinct samples: {texts}")
        check(r.usage.completion_tokens == 4 * 24 and
              all(c.finish_reason == "length" for c in r.choices), f"usage {r.usage}")
        _, _, tok = srv.request("POST", "/tokenize", {"content": kw["prompt"],
                                                      "add_special": True})
        check(r.usage.prompt_tokens == len(tok["tokens"]), f"prompt counted once: {r.usage}")
        again = oc.completions.create(**kw)
        check([c.text for c in again.choices] == texts, "same seed, different samples")
        # Streamed: per-choice deltas by index rebuild the same texts; one usage chunk at the end.
        parts = ["", "", "", ""]
        finishes = [None] * 4
        chunks = list(oc.completions.create(stream=True, stream_options={"include_usage": True},
                                            **kw))
        for ch in chunks:
            for c in ch.choices:
                parts[c.index] += c.text
                finishes[c.index] = c.finish_reason or finishes[c.index]
        check(parts == texts, f"streamed {parts} vs {texts}")
        check(finishes == ["length"] * 4, f"finishes {finishes}")
        check(chunks[-1].usage is not None and not chunks[-1].choices and
              chunks[-1].usage.completion_tokens == r.usage.completion_tokens,
              f"usage chunk {chunks[-1]}")
        # Greedy n = 2: both choices follow the same path.
        g = oc.completions.create(model="stories260K", prompt="The little dog", max_tokens=16,
                                  n=2, temperature=0)
        check(g.choices[0].text == g.choices[1].text, f"greedy choices differ: {g.choices}")
    finally:
        check(srv.stop() == 0, "exit code after SIGTERM")


# --- prefix --------------------------------------------------------------------------------------

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
         "park with her friends. One day, she saw a big red ball under a tree. She ran to the "
         "ball and picked it up. Her friend Ben came to play with her. They threw the ball high "
         "in the sky and laughed. The sun was warm and the birds were singing. ")


def greedy_usage(srv, prompt, n=16):
    st, _, b = srv.request("POST", "/v1/completions",
                           {"prompt": prompt, "max_tokens": n, "temperature": 0,
                            "ignore_eos": True})
    check(st == 200, f"{st} {b}")
    return b["choices"][0]["text"], b["usage"]["prompt_tokens_details"]["cached_tokens"]


def case_prefix(binary):
    long_prompt = STORY * 2 + "Then"
    # Prompts whose first tokens differ: no two share a cached page.
    distinct = [f"{who} told this story. {STORY}Then" for who in ("Tom", "Sue", "Max", "Ann")]
    uncached = Server(binary, STORIES, "--parallel", "2", "--ctx", "512", "--no-prefix-cache")
    try:
        want, c0 = greedy_usage(uncached, long_prompt)
        check(c0 == 0, f"--no-prefix-cache reported {c0} cached tokens")
        again, c1 = greedy_usage(uncached, long_prompt)
        check(c1 == 0 and again == want, f"--no-prefix-cache second: {c1} {again!r}")
        want_distinct = [greedy_usage(uncached, p)[0] for p in distinct]
    finally:
        check(uncached.stop() == 0, "exit code after SIGTERM")

    srv = Server(binary, STORIES, "--parallel", "2", "--ctx", "512")
    try:
        first, f0 = greedy_usage(srv, long_prompt)
        second, f1 = greedy_usage(srv, long_prompt)
        check(first == want and second == want, f"cached text {second!r} vs {want!r}")
        check(f0 == 0 and f1 > 0, f"cached tokens: first {f0}, second {f1}")
        oc = client(srv)
        r = oc.completions.create(model="stories260K", prompt=long_prompt, max_tokens=16,
                                  temperature=0, extra_body={"ignore_eos": True})
        check(r.usage.prompt_tokens_details.cached_tokens == f1 and r.choices[0].text == want,
              f"openai client usage {r.usage}")
    finally:
        check(srv.stop() == 0, "exit code after SIGTERM")

    # A pool of 320 tokens (20 pages) keeps about two of these ~140-token prompts: taken in turn
    # they evict each other least recently used first, concurrently they also preempt; every
    # answer stays the uncached one.
    small = Server(binary, STORIES, "--parallel", "2", "--ctx", "256", "--kv-size", "320")
    try:
        for rnd in range(2):
            got = [greedy_usage(small, p) for p in distinct]
            check([g[0] for g in got] == want_distinct,
                  f"eviction, round {rnd}: {got} vs {want_distinct}")
        check(got[0][1] == 0, f"the oldest prefix was not evicted: {got}")
        got = concurrent(lambda p: greedy_usage(small, p)[0], distinct + distinct)
        check(got == want_distinct * 2, f"eviction concurrently: {got} vs {want_distinct}")
    finally:
        check(small.stop() == 0, "exit code after SIGTERM")


# --- errors --------------------------------------------------------------------------------------

def case_errors(binary):
    srv = Server(binary, STORIES, "--parallel", "2", "--ctx", "256", "--chat-template", "chatml")
    try:
        msgs = [{"role": "user", "content": "hi"}]

        def expect(param, body, path="/v1/chat/completions", word=None):
            st, _, b = srv.request("POST", path, body)
            check(st == 400, f"{body!r:.200}: status {st}, want 400: {b!r:.300}")
            err = b["error"]
            check(err["param"] == param and err["type"] == "invalid_request_error",
                  f"{body!r:.200}: error {err}, want param {param}")
            check(word is None or word in err["message"], f"{err['message']!r} lacks {word!r}")

        def rf(schema):
            return {"messages": msgs, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}

        at = "response_format.json_schema.schema"
        expect(at, rf({"type": "string", "pattern": "^a$"}), word="pattern")
        expect(at, rf({"oneOf": [{"type": "string"}, {"type": "integer"}]}), word="oneOf")
        expect(at, rf({"$ref": "#/$defs/nowhere"}), word="nowhere")
        expect(at, rf({"type": "object", "properties": {"a": {"type": "strin"}}}),
               word="strin")
        expect(at, {"messages": msgs, "response_format": {"type": "json_schema",
                                                          "json_schema": {"name": "x"}}})
        expect("response_format.type", {"messages": msgs, "response_format": {"type": "yaml"}},
               word="yaml")
        expect("response_format", {"messages": msgs, "response_format": "json"})
        expect("response_format.json_schema",
               {"messages": msgs, "response_format": {"type": "json_schema",
                                                      "json_schema": "s"}})
        expect("grammar", {"prompt": "a", "grammar": "root ::= (\"a\""}, path="/v1/completions")
        expect("grammar", {"prompt": "a", "grammar": "root ::= undefined_rule"},
               path="/v1/completions", word="undefined_rule")
        # A grammar whose stacks multiply with every byte: past the matcher's work limit within a
        # few dozen bytes, a 400 for its request alone (the requests after it are served).
        expect(None, {"prompt": "a", "max_tokens": 200, "temperature": 0,
                      "grammar": 'root ::= a "."\na ::= | "x" a a | . a a | ""'},
               path="/v1/completions", word="too ambiguous")
        expect("tools", {"messages": msgs, "tools": "get_weather"})
        expect("tools[0].type", {"messages": msgs, "tools": [{"type": "retrieval"}]})
        expect("tools[0].function.name",
               {"messages": msgs, "tools": [{"type": "function", "function": {"name": "a b"}}]})
        bad_params = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}}
        expect("tools[0].function.parameters",
               {"messages": msgs, "tools": [bad_params], "tool_choice": "required"},
               word="pattern")
        expect("tool_choice", {"messages": msgs, "tools": [WEATHER], "tool_choice": "often"})
        expect("tool_choice", {"messages": msgs, "tools": [WEATHER],
                               "tool_choice": {"type": "function",
                                               "function": {"name": "nope"}}}, word="nope")
        expect("tool_choice", {"messages": msgs, "tool_choice": "required"})
        expect("messages", {"messages": [{"role": "tool", "content": "x"}]}, word="tool_call_id")
        expect("messages", {"messages": [{"role": "assistant", "tool_calls": [{"x": 1}]}]})
        expect("n", {"prompt": "a", "n": 0}, path="/v1/completions")
        expect("n", {"prompt": "a", "n": 1000}, path="/v1/completions")
        expect("best_of", {"prompt": "a", "n": 2, "best_of": 3}, path="/v1/completions")
        # The openai client sees a BadRequestError; the server keeps serving.
        import openai
        oc = client(srv)
        try:
            oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=4,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": {"not": {}}}})
            check(False, "a refused schema was accepted")
        except openai.BadRequestError as e:
            check("not" in str(e), f"error names the keyword: {e}")
        r = oc.chat.completions.create(model="stories260K", messages=msgs, max_tokens=4,
                                       temperature=0)
        check(r.choices[0].finish_reason in ("stop", "length"), f"after the errors: {r}")
        r = oc.completions.create(model="stories260K", prompt="Once", max_tokens=40,
                                  temperature=0, extra_body={"grammar": 'root ::= [a-z ]+ "."'})
        text = r.choices[0].text
        check(r.choices[0].finish_reason == "length" or (text.endswith(".") and all(
            ch.islower() or ch == " " for ch in text[:-1])), f"GBNF on stories260K: {text!r}")
        check(srv.metric('smolrt_requests_total{endpoint="/v1/chat/completions",status="400"}')
              >= 15, "400s counted")
    finally:
        check(srv.stop() == 0, "exit code after SIGTERM")


CASES = {"schemas": case_schemas, "tools": case_tools, "n": case_n, "prefix": case_prefix,
         "errors": case_errors}

if __name__ == "__main__":
    run_case(CASES, needs_openai=True)
