"""`builder qualify`'s checks against a running server: right answers, then speed.

Correctness is asked at temperature 0 through the OpenAI chat API: short probes with one
known answer (exact match after trimming case, spaces and end punctuation), then a code
hidden in filler text at lengths past DSA's top-k (2048 tokens), where sparse attention
first differs from dense: an FP8 KV pool read the wrong way, or an indexer that drops the
needle, fails here. Throughput follows the engine's own client's definitions (sglang's
`bench_serving` with its `sglang` backend and tokenized random prompts; `vllm bench
serve`'s completions client): each request streams random token ids with `ignore_eos`
from the engine's endpoint (sglang's /generate, vLLM's /v1/completions); output tok/s is
the output tokens of completed requests over the level's wall time, TTFT the time to the
first streamed token, TPOT (latency - TTFT) / (tokens - 1).
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import string
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from builder.core.http_client import NO_REDIRECTS
from builder.core.untrusted import printable
from builder.spec import engines
from builder.spec.engines import Engine

DSA_TOP_K = 2048  # GLM-5's sparse attention keeps this many tokens per query
# Random prompt tokens are drawn from ids every tokenizer of this family has (GLM-5: 151k).
TOKEN_IDS = (1000, 30000)


class QualifyError(Exception):
    """A check that failed; the message names it, `partial` holds what ran before it."""

    def __init__(self, message: str, partial: list | None = None) -> None:
        super().__init__(message)
        self.partial = partial or []


@dataclass(frozen=True)
class Probe:
    name: str
    prompt: str
    answers: tuple[str, ...]  # accepted, after normalise()


PROBES = (
    Probe("add", "What is 17 + 25? Reply with the number only.", ("42",)),
    Probe("multiply", "What is 12 times 12? Reply with the number only.", ("144",)),
    Probe("subtract", "What is 1000 minus 1? Reply with the number only.", ("999",)),
    Probe("capital", "What is the capital of France? Reply with one word.", ("paris",)),
    Probe("planet", "Which planet is called the Red Planet? Reply with one word.", ("mars",)),
    Probe("water", "What is the chemical formula of water? Reply with it only.", ("h2o",)),
)

_FILLER = (
    "the river ran past the old mill while farmers counted sacks of grain and the clerk "
    "wrote each number twice in a ledger that nobody read until the spring audit came "
    "round again with its lists of barrels tools carts and the names of every horse"
)


def normalise(text: str) -> str:
    return text.strip().strip(" \t\r\n.*\"'`!").lower().replace(" ", "")


class Server:
    """A server's HTTP API: bearer key if given, redirects never followed. With
    `spec_details` a list, each chat asks for the speculative-decoding figures of its
    reply where its engine gives them (sglang's `return_spec_tokens_details`) and adds
    them there."""

    def __init__(
        self, url: str, api_key: str | None, timeout: float = 600, engine: Engine | None = None
    ) -> None:
        self.url, self.api_key, self.timeout = url, api_key, timeout
        self.engine = engine or engines.engine(engines.DEFAULT)
        self.spec_details: list[dict] | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def get(self, path: str) -> dict:
        return self._call(urllib.request.Request(self.url + path, headers=self._headers()))

    def post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        return self._call(urllib.request.Request(self.url + path, data, self._headers()))

    def text(self, path: str) -> str | None:
        """A GET's text (/metrics), or None when it does not answer 200."""
        request = urllib.request.Request(self.url + path, headers=self._headers())
        try:
            with NO_REDIRECTS.open(request, timeout=60) as response:
                return response.read().decode(errors="replace")
        except (urllib.error.URLError, http.client.HTTPException, OSError):
            return None

    def _call(self, request: urllib.request.Request) -> dict:
        what = f"{request.get_method()} {request.full_url.removeprefix(self.url)}"
        try:
            with NO_REDIRECTS.open(request, timeout=self.timeout) as response:
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                key = "the API key is not the server's" if self.api_key else "pass --api-key-file"
                message = f"{what}: {exc.code}, the server wants an API key ({key})"
                raise QualifyError(message) from None
            raise QualifyError(f"{what}: HTTP {exc.code}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = printable(getattr(exc, "reason", exc))  # a broken status line, say
            raise QualifyError(f"{what}: no answer from {self.url} ({reason})") from None
        except json.JSONDecodeError:
            raise QualifyError(f"{what}: the answer is not JSON") from None
        if not isinstance(answer, dict):
            raise QualifyError(f"{what}: the answer is not a JSON object")
        return answer

    def chat(self, model: str, prompt: str, max_tokens: int) -> tuple[str, int]:
        """The reply's text at temperature 0 (thinking off), and the prompt's token count."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        if self.spec_details is not None:
            body.update(self.engine.spec_reply_request)
        answer = self.post("/v1/chat/completions", body)
        try:
            text = answer["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise QualifyError("POST /v1/chat/completions: no choices in the answer") from None
        if not isinstance(text, str):
            raise QualifyError("POST /v1/chat/completions: the answer's content is not text")
        details = self.engine.spec_reply(answer) if self.spec_details is not None else None
        if self.spec_details is not None and details is not None:
            self.spec_details.append(details)  # list.append: safe from the gates' threads
        usage = answer.get("usage")
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else 0
        numeric = isinstance(prompt_tokens, int | float) and not isinstance(prompt_tokens, bool)
        return text, int(prompt_tokens) if numeric and prompt_tokens >= 0 else 0


def served_model(server: Server) -> tuple[str, int | None]:
    """The model id /v1/models lists first, and its context length when it says."""
    models = server.get("/v1/models").get("data") or []
    if not models:
        raise QualifyError("GET /v1/models: the server lists no model")
    first = models[0]
    return first["id"], first.get("max_model_len")


# --- correctness ---------------------------------------------------------------------------


def run_probes(server: Server, model: str) -> list[dict]:
    """Each probe's answer; raises at the first wrong one, naming it."""
    results = []
    for probe in PROBES:
        text, _ = server.chat(model, probe.prompt, max_tokens=16)
        ok = normalise(text) in probe.answers
        results.append({"name": probe.name, "prompt": probe.prompt, "answer": text, "ok": ok})
        if not ok:
            raise QualifyError(
                f"probe {probe.name} ({probe.prompt!r}): expected {probe.answers[0]!r}, "
                f"got {text.strip()[:80]!r}",
                results,
            )
    return results


def needle_prompt(tokens: int, seed: int, chars_per_token: float) -> tuple[str, str]:
    """Filler of about `tokens` tokens with a code at a seeded depth, and the code."""
    rng = random.Random(f"{seed}:{tokens}")
    code = "-".join(
        "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(4))
        for _ in range(2)
    )
    vocabulary = _FILLER.split()
    words, length = [], 0
    while length < tokens * chars_per_token:
        word = rng.choice(vocabulary)
        words.append(word)
        length += len(word) + 1
    needle = f" The access code is {code}. Remember it. "
    depth = int(len(words) * rng.uniform(0.2, 0.8))
    filler = " ".join(words[:depth]) + needle + " ".join(words[depth:])
    question = "\n\nWhat is the access code given in the text above? Reply with the code only."
    return filler + question, code


def run_needles(
    server: Server, model: str, lengths: list[int], context: int | None, seed: int
) -> list[dict]:
    """The hidden code must come back at each length (clamped to the served context)."""
    results = []
    # Measured on a short prompt first, so a prompt clamped to the context fits it.
    chars_per_token = _chars_per_token(server, model, seed, 4.0)
    for wanted in lengths:
        tokens = min(wanted, context - 256) if context else wanted
        if tokens <= 0:
            continue
        prompt, code = needle_prompt(tokens, seed, chars_per_token)
        text, prompt_tokens = server.chat(model, prompt, max_tokens=24)
        if prompt_tokens and prompt_tokens < 0.8 * tokens:
            # The tokenizer packs more text per token than guessed: build it to length.
            chars_per_token *= tokens / prompt_tokens
            prompt, code = needle_prompt(tokens, seed, chars_per_token)
            text, prompt_tokens = server.chat(model, prompt, max_tokens=24)
        ok = code.lower() in text.lower()
        entry = {
            "asked_tokens": wanted,
            "target_tokens": tokens,
            "prompt_tokens": prompt_tokens or None,
            "past_top_k": (prompt_tokens or tokens) > DSA_TOP_K,
            "code": code,
            "answer": text.strip()[:80],
            "ok": ok,
        }
        results.append(entry)
        if not ok:
            raise QualifyError(
                f"needle at {prompt_tokens or tokens} tokens: expected {code}, "
                f"got {text.strip()[:80]!r} (long context is wrong past the sparse top-k)",
                results,
            )
    if not results:
        raise QualifyError(f"no needle fits the served context ({context} tokens)", results)
    return results


def _chars_per_token(server: Server, model: str, seed: int, guess: float) -> float:
    """Characters per token of this tokenizer on the filler, from a 1,000-token probe
    (the chat template's own tokens make it a slight underestimate: the safe side)."""
    probe, _ = needle_prompt(1000, seed, guess)
    _, tokens = server.chat(model, probe, max_tokens=1)
    return len(probe) / tokens if tokens else guess


# --- throughput ----------------------------------------------------------------------------


@dataclass
class RequestResult:
    ok: bool
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    error: str = ""


def _stream(server: Server, model: str, input_ids: list[int], output_len: int) -> RequestResult:
    """One request streamed from the engine's endpoint: TTFT at the first chunk with
    output, the tokens as the chunks count them."""
    parts = urlsplit(server.url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=server.timeout)
    path, body = server.engine.stream_request(model, input_ids, output_len)
    started = time.perf_counter()
    ttft, tokens, first = 0.0, 0, False
    try:
        connection.request("POST", path, json.dumps(body), server._headers())
        response = connection.getresponse()
        if response.status != 200:
            return RequestResult(False, error=f"HTTP {response.status}")
        while line := response.readline():
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            output, count = server.engine.stream_progress(json.loads(line[5:]))
            if output and not first:
                ttft, first = time.perf_counter() - started, True
            tokens = max(tokens, count or 0)
        return RequestResult(tokens > 0, tokens, ttft, time.perf_counter() - started)
    except (OSError, http.client.HTTPException, ValueError, TypeError, AttributeError) as exc:
        # One request's odd answer is that request's failure, never the run's.
        return RequestResult(False, error=f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    ordered = sorted(values)

    def at(q: float) -> float:  # linear interpolation, as numpy.percentile (bench_serving)
        position = q * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return {
        "mean": round(statistics.fmean(values) * 1000, 2),
        "p50": round(at(0.50) * 1000, 2),
        "p99": round(at(0.99) * 1000, 2),
    }


def run_level(
    server: Server,
    model: str,
    concurrency: int,
    prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    seconds: float,
    tag: str = "",
) -> dict:
    """One concurrency level: `prompts` requests, at most `concurrency` in flight; no new
    request starts after `seconds`. Each level has prompts of its own (seeded by the seed,
    the level and `tag`), so no level is served from an earlier level's prefix cache."""
    rng = random.Random(f"{seed}:{concurrency}{tag}")
    inputs = [[rng.randrange(*TOKEN_IDS) for _ in range(input_len)] for _ in range(prompts)]
    stop_at = time.monotonic() + seconds
    skipped = threading.Event()

    def one(input_ids: list[int]) -> RequestResult | None:
        if time.monotonic() > stop_at:
            skipped.set()
            return None
        return _stream(server, model, input_ids, output_len)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = [r for r in pool.map(one, inputs) if r is not None]
    duration = time.perf_counter() - started
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    return {
        "concurrency": concurrency,
        "prompts": prompts,
        "sent": len(results),
        "completed": len(done),
        "failed": len(failed),
        "first_error": failed[0].error if failed else None,
        "stopped_by_time": skipped.is_set(),
        "duration_s": round(duration, 3),
        "request_throughput": round(len(done) / duration, 3) if duration else None,
        "output_throughput": round(output_tokens / duration, 2) if duration else None,
        "total_output_tokens": output_tokens,
        "ttft_ms": _percentiles([r.ttft for r in done]),
        "tpot_ms": _percentiles(
            [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
        ),
        "e2e_latency_ms": _percentiles([r.latency for r in done]),
    }


PREFILL_PROMPTS = 4  # after one discarded warm-up request


def run_prefill(server: Server, model: str, length: int, seed: int, seconds: float) -> dict:
    """Prefill at `length` tokens: one request at a time, `length` random token ids, one
    output token; its TTFT is the prefill time. A first request (other prompt) is discarded
    as warm-up; each prompt is the level's own, so none is served from the prefix cache.
    Prefill tok/s is `length` over the median TTFT."""
    run_level(server, model, 1, 1, length, 1, seed, seconds, tag=f":prefill-warmup:{length}")
    level = run_level(
        server, model, 1, PREFILL_PROMPTS, length, 1, seed, seconds, tag=f":prefill:{length}"
    )
    median = level["ttft_ms"]["p50"]
    return {
        "input_len": length,
        "prompts": PREFILL_PROMPTS,
        "completed": level["completed"],
        "failed": level["failed"],
        "first_error": level["first_error"],
        "ttft_ms": level["ttft_ms"],
        "prefill_tok_s": round(length / (median / 1000), 1) if median else None,
    }
