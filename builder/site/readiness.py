"""`builder wait-ready`: tell "still loading" from "crashed" from "ready", in stages.

Stages, as the server's engine answers them (builder/spec/engines): the port opens, then
the engine's probes (sglang: GET /health 200, 503 while loading, then /health_generate, a
real 1-token generation; vLLM: nothing listens until it has loaded, then /health,
/v1/models and a 1-token completion), then what it serves is read (sglang's /server_info;
vLLM's /v1/models, /version, /metrics and, with --container, its start-up log) and held to
the backends the profile asked for. A crash is the container exiting or restarting, read
from the engine's container state (exit code and log tail), never guessed from log words.
Without --container, a server that stops answering is reported as unreachable, not
crashed: only the engine knows. With a container, no new log line for `stall_s` before the
server is ready is "stalled" (NCCL initialisation hangs over PCIe P2P in a VM look like this).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from docker.errors import APIError, NotFound

from builder.core import http_client, progress, validate
from builder.core.errors import EXIT_CODES, BuilderError
from builder.spec import engines
from builder.spec.engines import Engine

LOG_LINES = 20_000  # of a watched container's log, read for what the engine says it runs


@dataclass
class Verdict:
    state: str  # ready | crashed | timeout | mismatch | stalled
    message: str
    stage: str
    elapsed: float
    server_info: dict = field(default_factory=dict)
    log_tail: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.state]

    def to_json(self) -> dict:
        return {
            "state": self.state,
            "message": self.message,
            "stage": self.stage,
            "elapsed_seconds": round(self.elapsed, 1),
            "server_info": self.server_info,
            "log_tail": self.log_tail,
        }


def _get(
    url: str, timeout: float, api_key: str | None = None, data: bytes | None = None
) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if data is not None:
        headers["Content-Type"] = "application/json"
    try:
        answer = http_client.get(
            url, url, headers=headers, timeout=timeout, follow_redirects=False,
            use_store=False, data=data,
        )  # fmt: skip
    except BuilderError:  # no answer (Unreachable) or one too large: not there yet
        return 0, b""
    return answer.status, answer.body


def _port_open(url: str) -> bool:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:  # create_connection picks the address family: IPv6 hosts ([::1]) work too
        with socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def _same(expected: object, actual: object) -> bool:
    if isinstance(actual, bool) or isinstance(expected, bool):
        return str(actual).lower() == str(expected).lower()
    return str(actual) == str(expected)


def _json_object(body: bytes) -> dict | None:
    try:
        value = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def printable(value: object, limit: int = 200) -> str:
    """A value a server or registry handed back, safe for one terminal line: control
    characters (escape sequences, line breaks) shown escaped, and cut at `limit`."""
    text = str(value)
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def check_server_info(info: dict, expect: dict, unread: frozenset[str] = frozenset()) -> list[str]:
    """Every expected key that the server reports differently (or not at all); keys in
    `unread` (what only a log no one read would say) are left out."""
    return [
        f"{key}={printable(info.get(key, '<missing>'))} (asked for {value})"
        for key, value in expect.items()
        if key not in unread and not _same(value, info.get(key))
    ]


class _ContainerWatch:
    """Container state from the engine: exited, dead, removed or restarted means crashed;
    the time of its last log line tells a stalled start."""

    def __init__(self, client, name: str) -> None:
        self.container = client.containers.get(name)
        self.restarts = self.container.attrs["RestartCount"]
        self.last_line = b""
        self.last_change = time.monotonic()

    def crashed(self) -> str | None:
        try:
            self.container.reload()
        except NotFound:
            return f"container {self.container.name} is gone (removed while starting)"
        state = self.container.attrs["State"]
        if state["Status"] in ("exited", "dead", "removing"):
            return f"container {self.container.name} exited with code {state['ExitCode']}"
        restarts = self.container.attrs["RestartCount"]
        if state.get("Restarting") or restarts > self.restarts:
            return (
                f"container {self.container.name} restarted {restarts - self.restarts} time(s) "
                f"(last exit code {state['ExitCode']})"
            )
        return None

    def log_text(self) -> str:
        """The log's last LOG_LINES lines: a start-up's account of what it runs."""
        return self.log_tail(LOG_LINES)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return self.container.logs(tail=lines).decode(errors="replace")
        except APIError:  # removed (404) or being removed (409): no log left to show
            return ""

    def quiet_for(self) -> float:
        """Seconds since the container last wrote a log line."""
        try:
            line = self.container.logs(tail=1, timestamps=True)
        except APIError:  # removed or being removed: crashed() says so on the next round
            return 0.0
        if line != self.last_line:
            self.last_line, self.last_change = line, time.monotonic()
        return time.monotonic() - self.last_change


def wait_ready(
    url: str,
    *,
    deadline_s: float,
    expect: dict | None = None,
    container: str | None = None,
    docker_client=None,
    poll_s: float = 2.0,
    stall_s: float,
    api_key: str | None = None,
    engine: Engine | None = None,
) -> Verdict:
    url = validate.server_url("wait-ready URL", url)
    engine = engine or engines.engine(engines.DEFAULT)
    stages = engine.stages
    probes = {probe.path: probe for probe in engine.probes}
    watch = _ContainerWatch(docker_client, container) if container else None
    started = time.monotonic()
    stage = 0
    detail = "waiting"
    answers: dict[str, bytes] = {}  # each probe's 200 body, for the stages after it
    with progress.task("wait-ready", announce=False) as bar:
        task_id = bar.task_ids[0]
        bar.update(task_id, total=len(stages))
        while True:
            elapsed = time.monotonic() - started
            previous = stage
            if watch:
                crash = watch.crashed()
                if crash:
                    return Verdict(
                        "crashed", crash, stages[stage], elapsed, log_tail=watch.log_tail()
                    )
                quiet = watch.quiet_for()
                if quiet > stall_s:
                    return Verdict(
                        "stalled",
                        f"no new log line for {quiet / 60:.1f} min at stage {stages[stage]} "
                        f"({detail}); the container is running but not progressing (NCCL "
                        "initialisation over PCIe P2P in a VM hangs like this: try "
                        "NCCL_P2P_DISABLE=1)",
                        stages[stage],
                        elapsed,
                        log_tail=watch.log_tail(),
                    )
            if stages[stage] == "port":
                if _port_open(url):
                    stage, detail = 1, "port open"
                else:
                    detail = "port closed (starting)"
            elif stages[stage] in probes:
                probe = probes[stages[stage]]
                data = None
                if probe.body:
                    served = json.dumps(engine.served_name(answers))[1:-1]
                    data = probe.body.replace("{served}", served).encode()
                status, body = _get(f"{url}{probe.path}", probe.timeout_s, api_key, data)
                if status in (401, 403):
                    return _refused(probe.path, status, api_key, time.monotonic() - started)
                if status == 200:
                    answers[probe.path] = body
                    detail = f"{probe.path} 200"
                    stage += 1
                else:
                    detail = f"{probe.path} {status or 'no answer'} ({probe.waiting})"
            else:
                verdict = _identity(url, engine, answers, expect or {}, api_key, watch, started)
                if isinstance(verdict, Verdict):
                    return verdict
                detail = verdict
            bar.update(
                task_id,
                completed=stage,
                description=f"wait-ready {url}: {detail} (deadline {deadline_s / 60:.0f} min)",
            )
            # A stage passed is tried again at once: `--deadline 0` checks every stage once.
            if stage == previous and elapsed >= deadline_s:
                if watch:
                    where = "the container is still running"
                elif stage == 0:
                    where = "nothing is listening there (no --container to tell a crash)"
                else:
                    where = "no container to inspect"
                return Verdict(
                    "timeout",
                    f"not ready after {elapsed / 60:.1f} min, last: {detail}; {where} "
                    "(still loading is not a crash: raise --deadline or look at its log)",
                    stages[stage],
                    elapsed,
                    log_tail=watch.log_tail() if watch else "",
                )
            if stage == previous:
                time.sleep(poll_s)


def _refused(path: str, status: int, api_key: str | None, elapsed: float) -> Verdict:
    return Verdict(
        "mismatch",
        f"server is up but refuses {path} ({status}): "
        + ("the API key is not the server's" if api_key else "it requires an API key; pass "
           "--api-key-file FILE"),
        path,
        elapsed,
    )  # fmt: skip


def _identity(
    url: str,
    engine: Engine,
    answers: dict[str, bytes],
    expect: dict,
    api_key: str | None,
    watch: _ContainerWatch | None,
    started: float,
) -> Verdict | str:
    """What the server says it serves, held to `expect`; while it does not answer, what
    it said instead."""
    stage = engine.stages[-1]
    for path in engine.identity_paths:
        status, body = _get(f"{url}{path}", timeout=30, api_key=api_key)
        if status in (401, 403):
            return _refused(path, status, api_key, time.monotonic() - started)
        if status != 200:
            return f"{path} {status or 'no answer'}"
        answers[path] = body
    log_text = watch.log_text() if watch and engine.log_keys else ""
    served = engine.served(answers, log_text)
    elapsed = time.monotonic() - started
    if isinstance(served, str):
        return Verdict("mismatch", f"server is up but {served}", stage, elapsed)
    unread = engine.log_keys if not log_text else frozenset()
    wrong = check_server_info(served, expect, unread)
    if wrong:
        return Verdict(
            "mismatch",
            f"server is up but {engine.identity_paths[0]} shows " + "; ".join(wrong),
            stage,
            elapsed,
            server_info=served,
        )
    skipped = sorted(set(expect) & unread)
    if not expect:
        checked = "backends not checked (no profile)"
    elif skipped:
        checked = (
            f"backends match; not checked without --container (its log says them): "
            f"{', '.join(skipped)}"
        )
    else:
        checked = "backends match"
    return Verdict(
        "ready", f"ready in {elapsed:.0f} s: generation works, {checked}", stage, elapsed,
        server_info=served,
    )  # fmt: skip
