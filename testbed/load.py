"""Load for an OpenAI-compatible address: streamed completions, each timed to its first token and its end, with
what failed and how. Used by the router's traffic test (e2e/test_quickstart.py) and its benchmark
(bench/routing_bench.py), which runs this file inside the cluster (stdlib only):

    python3 load.py HOST PORT MODEL CLIENTS SECONDS SEED [chat]     # prints one JSON outcome per line

`chat`: multi-turn conversations instead (Conversations): each client holds one conversation at a time, a system
prompt every conversation shares and a long first message of its own, then turns that each send the whole
conversation so far; each outcome carries its turn.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import random
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Self


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic() when sent
    seconds: float  # to the stream's end (or the failure)
    first_token: float | None  # seconds to the first streamed token
    error: str | None = None  # None: the stream ended with [DONE] after at least one token
    turn: int = 0  # a conversation's request: 1 for its first, 2 for the next... (0: not a conversation)


@dataclass(frozen=True)
class Request:
    prompt_tokens: int
    max_tokens: int


# The prompt's token: its ids are sent as they are (the completions API takes token ids), so a prompt is exactly
# as long as asked whatever the model's tokenizer; 100 is an ordinary token in every vocabulary the tests serve.
PROMPT_TOKEN = 100


def stream_completion(host: str, port: int, model: str, request: Request, timeout: float = 300) -> Outcome:
    """One streamed completion; any answer but a whole stream (status, reset, cut short) is an error."""
    started = time.monotonic()
    first: float | None = None
    body = {
        "model": model,
        "prompt": [PROMPT_TOKEN] * request.prompt_tokens,
        "max_tokens": request.max_tokens,
        "ignore_eos": True,  # the lengths asked for, not where the model would stop
        "stream": True,
    }
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            return Outcome(
                started, time.monotonic() - started, None, f"HTTP {response.status}: {response.read()[:200]!r}"
            )
        done = False
        for raw in response:
            line = raw.strip()
            if line == b"data: [DONE]":
                done = True
            elif line.startswith(b"data: ") and first is None:
                first = time.monotonic() - started
        error = None if done and first is not None else "the stream ended before [DONE]"
        return Outcome(started, time.monotonic() - started, first, error)
    except (OSError, http.client.HTTPException) as err:
        return Outcome(started, time.monotonic() - started, first, f"{type(err).__name__}: {err}")
    finally:
        connection.close()


def stream_chat(
    host: str, port: int, model: str, messages: list[dict[str, str]], max_tokens: int, timeout: float = 300
) -> tuple[Outcome, str]:
    """One streamed chat completion: its outcome and the reply's text (for the conversation's next turn)."""
    started = time.monotonic()
    first: float | None = None
    reply: list[str] = []
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return Outcome(started, time.monotonic() - started, None, error), ""
        done = False
        for raw in response:
            line = raw.strip()
            if line == b"data: [DONE]":
                done = True
            elif line.startswith(b"data: "):
                first = time.monotonic() - started if first is None else first
                for choice in json.loads(line[6:]).get("choices", []):
                    reply.append((choice.get("delta") or {}).get("content") or "")
        error = None if done and first is not None else "the stream ended before [DONE]"
        return Outcome(started, time.monotonic() - started, first, error), "".join(reply)
    except (OSError, http.client.HTTPException, ValueError) as err:
        return Outcome(started, time.monotonic() - started, first, f"{type(err).__name__}: {err}"), ""
    finally:
        connection.close()


# The conversations' words: plain ones, so that a tokenizer makes about one token of each.
WORDS = (
    "the", "a", "model", "server", "cache", "node", "core", "memory", "token", "prompt", "answer", "question", "turn",
    "time", "thread", "rank", "batch", "queue", "request", "reply", "system", "user", "plan", "speed", "layer",
    "weight", "kernel", "socket", "cluster", "pod", "service", "router", "conversation",
)  # fmt: skip


def words(draw: random.Random, count: int) -> str:
    return " ".join(draw.choice(WORDS) for _ in range(count))


class _Clients:
    """Client threads, each running `_client(index)` until stopped, their outcomes recorded under a lock (the
    dataclasses below give `clients` and `outcomes`)."""

    clients: int
    outcomes: list[Outcome]

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.clients)]

    def _client(self, index: int) -> None:
        raise NotImplementedError

    def _record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    @property
    def failures(self) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.error is not None]

    @contextmanager
    def running(self) -> Iterator[Self]:
        for thread in self._threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join()


@dataclass
class Conversations(_Clients):
    """Clients each holding one multi-turn chat at a time: a system prompt every conversation shares
    (`system_words`), a first user message of its own (`first_words`: what the prefix cache saves on later turns),
    then `turns` - 1 more, each a short message after the reply, with the whole conversation sent every turn."""

    host: str
    port: int
    model: str
    clients: int
    # Sized for a 2,048-token context at ~3.3 tokens a word (the tests' tiny tokenizer): ~1,700 tokens by the last
    # turn, most of them the turns before it.
    turns: int = 7
    system_words: int = 40
    first_words: int = 80
    next_words: int = 40
    max_tokens: int = 24
    seed: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._system = words(random.Random(self.seed), self.system_words)

    def _client(self, index: int) -> None:
        draw = random.Random(self.seed * 1000 + index + 1)
        while not self._stop.is_set():
            messages = [
                {"role": "system", "content": self._system},
                {"role": "user", "content": words(draw, self.first_words)},
            ]
            for turn in range(1, self.turns + 1):
                if self._stop.is_set():
                    return
                outcome, reply = stream_chat(self.host, self.port, self.model, messages, self.max_tokens)
                self._record(dataclasses.replace(outcome, turn=turn))
                if outcome.error is not None:
                    break
                messages += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": words(draw, self.next_words)},
                ]


@dataclass
class Load(_Clients):
    """Clients each sending one request after another (a pause between, drawn from `pauses`), until stopped."""

    host: str
    port: int
    model: str
    clients: int
    requests: Sequence[Request]
    pauses: tuple[float, float] = (0.0, 0.0)
    idle_chance: float = 0.0  # the chance a pause is drawn from `pauses` at all (else none): bursts
    seed: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def _client(self, index: int) -> None:
        draw = random.Random(self.seed * 1000 + index)
        while not self._stop.is_set():
            self._record(stream_completion(self.host, self.port, self.model, draw.choice(self.requests)))
            self._stop.wait(draw.uniform(*self.pauses) if draw.random() < self.idle_chance else 0.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


# Bursty and mixed: short and long prompts and outputs (at most 1,152 tokens in all, within the served context of
# 2,048); a client pauses 2-8 s after a third of its requests and sends the next at once otherwise, so requests
# arrive in bursts.
MIXED = [Request(prompt, tokens) for prompt in (16, 256, 1024) for tokens in (8, 32, 128)]


def main(argv: list[str]) -> int:
    host, port, model, clients, seconds, seed, *mode = argv
    load: Load | Conversations
    if mode == ["chat"]:
        load = Conversations(host, int(port), model, int(clients), seed=int(seed))
    else:
        load = Load(host, int(port), model, int(clients), MIXED, pauses=(2.0, 8.0), idle_chance=1 / 3, seed=int(seed))
    with load.running():
        time.sleep(float(seconds))
    for outcome in load.outcomes:
        print(json.dumps(dataclasses.asdict(outcome)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
