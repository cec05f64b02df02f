"""`builder wait-ready`: tell "still loading" from "crashed" from "ready", in stages.

Stages: the port opens, GET /health answers 200 (503 means still starting), GET
/health_generate answers 200 (a real 1-token generation), GET /server_info shows the
backends the profile asked for. A crash is the container exiting or restarting, read
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

STAGES = ("port", "/health", "/health_generate", "/server_info")
# Endpoints that answer 503 until the server is there: (timeout s, what a 503 means).
# /health_generate runs a real one-token generation, hence its long timeout.
_PROBES = {"/health": (10, "still loading"), "/health_generate": (120, "warming up")}


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


def _get(url: str, timeout: float, api_key: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        answer = http_client.get(
            url, url, headers=headers, timeout=timeout, follow_redirects=False, use_store=False
        )
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


def check_server_info(info: dict, expect: dict) -> list[str]:
    """Every expected key that /server_info reports differently (or not at all)."""
    return [
        f"{key}={printable(info.get(key, '<missing>'))} (asked for {value})"
        for key, value in expect.items()
        if not _same(value, info.get(key))
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
) -> Verdict:
    url = validate.server_url("wait-ready URL", url)
    watch = _ContainerWatch(docker_client, container) if container else None
    started = time.monotonic()
    stage = 0
    detail = "waiting"
    with progress.task("wait-ready", announce=False) as bar:
        task_id = bar.task_ids[0]
        bar.update(task_id, total=len(STAGES))
        while True:
            elapsed = time.monotonic() - started
            previous = stage
            if watch:
                crash = watch.crashed()
                if crash:
                    return Verdict(
                        "crashed", crash, STAGES[stage], elapsed, log_tail=watch.log_tail()
                    )
                quiet = watch.quiet_for()
                if quiet > stall_s:
                    return Verdict(
                        "stalled",
                        f"no new log line for {quiet / 60:.1f} min at stage {STAGES[stage]} "
                        f"({detail}); the container is running but not progressing (NCCL "
                        "initialisation over PCIe P2P in a VM hangs like this: try "
                        "NCCL_P2P_DISABLE=1)",
                        STAGES[stage],
                        elapsed,
                        log_tail=watch.log_tail(),
                    )
            if STAGES[stage] == "port":
                if _port_open(url):
                    stage, detail = 1, "port open"
                else:
                    detail = "port closed (starting)"
            elif STAGES[stage] in _PROBES:
                timeout, waiting = _PROBES[STAGES[stage]]
                status, _ = _get(f"{url}{STAGES[stage]}", timeout=timeout)
                if status == 200:
                    detail = f"{STAGES[stage]} 200"
                    stage += 1
                else:
                    detail = f"{STAGES[stage]} {status or 'no answer'} ({waiting})"
            else:
                status, body = _get(f"{url}/server_info", timeout=30, api_key=api_key)
                if status in (401, 403):
                    return Verdict(
                        "mismatch",
                        f"server is up but refuses /server_info ({status}): "
                        + ("the API key is not the server's" if api_key else "it requires an "
                           "API key; pass --api-key-file FILE"),
                        "/server_info",
                        time.monotonic() - started,
                    )  # fmt: skip
                if status == 200:
                    info = _json_object(body)
                    elapsed = time.monotonic() - started
                    if info is None:
                        return Verdict(
                            "mismatch",
                            "server is up but its /server_info is not a JSON object (not sglang?)",
                            "/server_info",
                            elapsed,
                        )
                    wrong = check_server_info(info, expect or {})
                    if wrong:
                        return Verdict(
                            "mismatch",
                            "server is up but /server_info shows " + "; ".join(wrong),
                            "/server_info",
                            elapsed,
                            server_info=info,
                        )
                    checked = "backends match" if expect else "backends not checked (no profile)"
                    return Verdict(
                        "ready",
                        f"ready in {elapsed:.0f} s: generation works, {checked}",
                        "/server_info",
                        elapsed,
                        server_info=info,
                    )
                detail = f"/server_info {status or 'no answer'}"
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
                    STAGES[stage],
                    elapsed,
                    log_tail=watch.log_tail() if watch else "",
                )
            if stage == previous:
                time.sleep(poll_s)
