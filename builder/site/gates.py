"""qualify's correctness gates beyond the probes: each with its pass mark and where the mark
comes from, and every gate in the receipt, run or not (a skipped gate says why).

- arithmetic: two-digit products from the seed (the anchors' `37 * 19` -> `703` oracle,
  generated, no data shipped); every reply must be the exact integer.
- identical: the same prompts at temperature 0, one at a time, then 32 at once; every
  reply in the burst must be byte-identical to its prompt's reply alone (the anchors'
  C1-to-C32 oracle: a batch-dependent kernel bug changes text here).
- gsm8k: builder/site/gsm8k.py, InferenceX's 0.94 for GLM-5.
- mtp: for a speculative profile, the draft acceptance the engine reports (sglang: per
  reply and since start; vLLM: its spec-decode counters over the gates), a figure
  recorded without a pass mark (no anchor gives one for this stack).
The probes and the long-context needle (builder/site/qualify.py) are gates of this list too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from builder.core import progress
from builder.site import gsm8k
from builder.site.qualify import QualifyError, normalise

BURST = 32  # the identical gate's concurrency
IDENTICAL_PROMPTS = 8
IDENTICAL_TOKENS = 160
ARITHMETIC_DEFAULT = 20

# name: (mandatory, pass mark, where the mark comes from), in the order they run.
GATES: dict[str, tuple[bool, str | None, str]] = {
    "probes": (True, "every probe exact", "builder: questions with one right answer"),
    "arithmetic": (
        True, "every product exact",
        "deterministic oracles (37 * 19 -> 703): blackwell-llm-docker r11 receipt",
    ),
    "identical": (
        True, f"every reply at concurrency {BURST} byte-identical to concurrency 1",
        "byte-identical greedy output C1 to C32: blackwell-llm-docker r11, rtx6kpro v20",
    ),
    "needle": (
        True, "the code back at every length",
        "past DSA's 2,048-token top-k; InferenceX needle retrieval (GLM-5.2 on sglang)",
    ),
    "gsm8k": (True, f"score >= {gsm8k.PASS_MARK}", gsm8k.MARK_SOURCE),
    "mtp": (
        False, None,
        "recorded figure: no anchor gives a pass mark for sglang MTP on SM120 "
        "(vLLM + B12X MTP3 reports 62-64 % acceptance)",
    ),
}  # fmt: skip


def entry(name: str, status: str, result: str, why: str | None = None, **details) -> dict:
    """One gate in the receipt: status passed, failed, skipped or recorded (a figure)."""
    mandatory, mark, source = GATES[name]
    return {
        "name": name, "mandatory": mandatory, "pass_mark": mark, "mark_source": source,
        "status": status, "result": result, "why": why, **details,
    }  # fmt: skip


def complete(gates: list[dict], failed_at: str | None) -> list[dict]:
    """Every gate listed, in order: those the run did not reach are skipped, saying why."""
    ran = {gate["name"]: gate for gate in gates}
    why = f"not reached: the run stopped at {failed_at}" if failed_at else "not run"
    return [ran.get(name) or entry(name, "skipped", "-", why) for name in GATES]


def not_passed(gates: list[dict]) -> dict | None:
    """The first mandatory gate that did not pass (failed or skipped), or None."""
    return next((g for g in gates if g["mandatory"] and g["status"] != "passed"), None)


# The checks without which a receipt says nothing worth having: the image's bytes (verify),
# the profile's backends at start-up, and throughput. The probes and the needle always run
# when the run gets that far. Left out (`not_checked`), they make the verdict `partial`: not
# `qualified`, and exit 8 unless --allow-partial.
REQUIRED_CHECKS = ("verify", "backends", "throughput")


def verdict(result: dict, not_checked: list[dict]) -> dict:
    """The receipt's result with its verdict: `not qualified` when a check failed,
    `partial` when it passed but a required check did not run (named, with why),
    `qualified` otherwise (only then ok)."""
    if not result["ok"]:
        return {**result, "verdict": "not qualified"}
    gaps = sorted(
        (n for n in not_checked if n["what"] in REQUIRED_CHECKS),
        key=lambda n: REQUIRED_CHECKS.index(n["what"]),
    )
    if not gaps:
        return {**result, "verdict": "qualified"}
    named = "; ".join(f"{n['what']} ({n['why']})" for n in gaps)
    ran = result["message"].replace("every check passed", "every check that ran passed")
    return {
        "ok": False, "failed_at": None, "verdict": "partial",
        "message": f"{ran}; not checked: {named}",
    }  # fmt: skip


# --- arithmetic ----------------------------------------------------------------------------


def arithmetic_cases(seed: int, count: int) -> list[tuple[int, int]]:
    """`count` pairs of two-digit numbers, the same for the same seed."""
    rng = random.Random(f"{seed}:arithmetic")
    return [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(count)]


def arithmetic_prompt(a: int, b: int) -> str:
    return f"What is {a} * {b}? Reply with the number only."


def arithmetic_ok(reply: str, a: int, b: int) -> bool:
    """The exact product, after trimming as the probes do (a thousands comma allowed)."""
    return normalise(reply).replace(",", "") == str(a * b)


def run_arithmetic(server, model: str, seed: int, count: int) -> dict:
    cases = arithmetic_cases(seed, count)
    with progress.task(f"gate arithmetic: {count} products"):
        replies = [server.chat(model, arithmetic_prompt(a, b), 16)[0] for a, b in cases]
    wrong = [
        {"prompt": arithmetic_prompt(a, b), "expected": a * b, "answer": reply.strip()[:40]}
        for (a, b), reply in zip(cases, replies, strict=True)
        if not arithmetic_ok(reply, a, b)
    ]
    right = f"{count - len(wrong)}/{count}"
    if wrong:
        first = wrong[0]
        why = f"{first['prompt']!r}: expected {first['expected']}, got {first['answer']!r}"
        return entry("arithmetic", "failed", right, why, wrong=wrong)
    return entry("arithmetic", "passed", right)


# --- byte-identical at concurrency 1 and 32 ------------------------------------------------


def identical_prompts(seed: int, count: int = IDENTICAL_PROMPTS) -> list[str]:
    rng = random.Random(f"{seed}:identical")
    starts = rng.sample(range(1, 900), count)
    return [f"Count from {n} to {n + 30}, separated by commas." for n in starts]


def burst_order(prompts: int, burst: int = BURST) -> list[int]:
    """Which prompt each of the burst's requests sends: each prompt about burst/prompts
    times, so the same text is served at several batch positions."""
    return [index % prompts for index in range(burst)]


def mismatches(alone: Sequence[str], burst: Sequence[str], order: Sequence[int]) -> list[int]:
    """The burst's requests whose reply is not byte for byte its prompt's reply alone."""
    return [at for at, index in enumerate(order) if burst[at] != alone[index]]


def run_identical(server, model: str, seed: int) -> dict:
    prompts = identical_prompts(seed)
    order = burst_order(len(prompts))
    with progress.task(f"gate identical: {len(prompts)} prompts alone, then {BURST} at once"):
        alone = [server.chat(model, prompt, IDENTICAL_TOKENS)[0] for prompt in prompts]
        with ThreadPoolExecutor(max_workers=BURST) as pool:
            burst = list(
                pool.map(lambda i: server.chat(model, prompts[i], IDENTICAL_TOKENS)[0], order)
            )
    differ = mismatches(alone, burst, order)
    result = f"{BURST - len(differ)}/{BURST}"
    if differ:
        at = differ[0]
        why = (
            f"{prompts[order[at]]!r} at concurrency {BURST}: {burst[at][:60]!r}, alone: "
            f"{alone[order[at]][:60]!r}"
        )
        return entry("identical", "failed", result, why, differing=len(differ))
    return entry("identical", "passed", result)


# --- MTP acceptance ------------------------------------------------------------------------


def _texts(server, paths: Sequence[str]) -> dict[str, str | None]:
    return {path: server.text(path) for path in paths}


def run_mtp(server, is_speculative: bool, before: dict[str, str | None]) -> dict:
    """The draft acceptance the server's engine reports (builder/spec/engines), read after
    the gates (and, for figures that count, before them: `before`)."""
    engine = server.engine
    if not is_speculative:
        return entry(
            "mtp", "skipped", "-", f"not a speculative profile (no {engine.speculative_flag})"
        )
    found = engine.acceptance(
        server.spec_details or [], before, _texts(server, engine.acceptance_paths)
    )
    if found.length is None:
        return entry("mtp", "recorded", "-", found.missing, figures=found.figures)
    rate = found.rate
    result = f"accept length {found.length}" + (f", rate {rate:.1%}" if rate is not None else "")
    return entry("mtp", "recorded", result, figures=found.figures)


def run_all(
    server, model: str, *, seed: int, arithmetic: int, data, is_speculative: bool
) -> list[dict]:
    """The gates after the probes and needles, each run whatever the others gave (a
    receipt then shows every result), each HTTP failure its own gate's failure."""
    gates = []
    server.spec_details = [] if is_speculative else None
    before = _texts(server, server.engine.acceptance_paths) if is_speculative else {}
    for name, run in (
        ("arithmetic", lambda: run_arithmetic(server, model, seed, arithmetic)),
        ("identical", lambda: run_identical(server, model, seed)),
        ("gsm8k", lambda: _run_gsm8k(server, model, data, seed)),
    ):
        try:
            gates.append(run())
        except QualifyError as exc:
            gates.append(entry(name, "failed", "-", str(exc)))
    gates.append(run_mtp(server, is_speculative, before))
    return gates


def _run_gsm8k(server, model: str, data, seed: int) -> dict:
    if data is None:
        return entry("gsm8k", "skipped", "-", "--gsm8k none")
    with progress.task(f"gate gsm8k: {len(data.items)} questions, 5-shot"):
        scored = gsm8k.run(server, model, data, seed)
    result = f"{scored['score']:.4f} ({scored['correct']}/{scored['questions']})"
    if scored["score"] >= gsm8k.PASS_MARK:
        return entry("gsm8k", "passed", result, **scored)
    why = f"{scored['score']:.4f} is below the pass mark {gsm8k.PASS_MARK}"
    return entry("gsm8k", "failed", result, why, **scored)
