"""GSM8K 5-shot, strict match, as InferenceX runs it against a server, and its pass mark.

InferenceX (utils/evals/gsm8k.yaml, run by benchmarks/benchmark_lib.sh `run_lm_eval`) runs
lm-eval's gsm8k task through `local-chat-completions --apply_chat_template`, at temperature
0, with the question's text changed to ask for the answer as `#### [number]` on the last
line. Five shots from the train split go before each question in one user message
(`Question: ...\\nAnswer: <worked answer ending #### N>`, separated by a blank line).
Strict match takes the last `#### (-?[0-9.,]+)` of the reply (its `group_select: -1`;
lm-eval's own yaml takes the first) and compares it with the reference after both lose
`,`, `$`, everything up to `#### `, and one trailing `.`, case ignored. Its pass mark for
GLM-5 is 0.94 (utils/evals/thresholds.yaml). Here thinking is off, as for every qualify
check: a reply is an answer, not a reasoning trace.

The data: the Hugging Face hub's openai/gsm8k (config main) through the dataset viewer's
rows API, JSON at most 100 rows a call (stdlib HTTP, no `datasets`; the hub's own files are
parquet): the test split's 1,319 questions and the train split's first 100 rows to draw the
shots from. Or a jsonl file in the data set's own shape (`question`, `answer` ending
`#### N`), whose other items are then the shots; or the file `builder qualify --gsm8k-save
FILE` writes on a machine that reaches the hub: the same test questions, and the same train
rows marked `"shot": true`, so an offline GPU VM asks exactly what the hub run asks.
"""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from builder.core import http_client, progress
from builder.core.cache import atomic_write_text
from builder.core.errors import BuilderError, Unreachable

ROWS_API = "https://datasets-server.huggingface.co/rows"
DATASET = "openai/gsm8k"
PAGE = 100  # the rows API's most rows per call
SHOT_POOL = 100  # train rows fetched to draw the shots from
SHOTS = 5
PASS_MARK = 0.94
MARK_SOURCE = "InferenceX utils/evals/thresholds.yaml, glm5: 0.94 (GSM8K 5-shot strict-match)"
MAX_TOKENS = 1024
CONCURRENCY = 64  # requests in flight, as an eval client keeps the server busy
INSTRUCTION = "End your response with the answer on the last line, formatted as: #### [number]"
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_IGNORED = tuple(re.compile(pattern) for pattern in (",", r"\$", r"(?s).*#### ", r"\.$"))
_KEPT_WRONG = 20  # wrong answers the receipt shows


@dataclass(frozen=True)
class Item:
    question: str
    answer: str  # the worked answer, ending `#### N`


@dataclass(frozen=True)
class Dataset:
    items: list[Item]  # the questions asked
    shots: list[Item]  # what each question's 5 shots are drawn from (not itself)
    source: str


def _normalised(text: str) -> str:
    for pattern in _IGNORED:
        text = pattern.sub("", text)
    return text.lower()


def extract(reply: str) -> str | None:
    """The strict-match answer of a reply: its last `#### number`, or None."""
    found = STRICT.findall(reply)
    return found[-1].strip() if found else None


def correct(reply: str, answer: str) -> bool:
    """Strict match: the reply's `#### number` equals the reference's, as lm-eval compares."""
    got = extract(reply)
    return got is not None and _normalised(got) == _normalised(answer)


def _question(question: str) -> str:
    return f"Question: {question}\n{INSTRUCTION}\nAnswer:"


def prompt(item: Item, shots: list[Item]) -> str:
    """The one user message: five worked examples, then the question."""
    context = "".join(f"{_question(shot.question)} {shot.answer}\n\n" for shot in shots)
    return context + _question(item.question)


def shots_for(index: int, item: Item, pool: list[Item], seed: int) -> list[Item]:
    """Five shots for question `index`, drawn from the seed (never the question itself)."""
    others = [shot for shot in pool if shot != item]
    return random.Random(f"{seed}:gsm8k:{index}").sample(others, SHOTS)


def _item(record: object, where: str) -> Item:
    if not isinstance(record, dict):
        raise BuilderError(f"{where}: not a JSON object with question and answer")
    question, answer = record.get("question"), record.get("answer")
    if not (isinstance(question, str) and question.strip()):
        raise BuilderError(f"{where}: no question (a string)")
    if not (isinstance(answer, str) and extract(answer) is not None):
        raise BuilderError(f"{where}: the answer must end '#### N', as GSM8K's do")
    return Item(question, answer)


def load_file(path: str) -> tuple[list[Item], list[Item]]:
    """(questions, shots) of a jsonl file as GSM8K ships, one {"question", "answer"} object a
    line: every item a question, each other item a shot; or as `--gsm8k-save` writes it, the
    items marked `"shot": true` the shots and only those."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not text"
        raise BuilderError(f"--gsm8k {path}: cannot read it ({reason})") from None
    items, marked = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            raise BuilderError(f"--gsm8k {path} line {number}: not JSON") from None
        item = _item(record, f"--gsm8k {path} line {number}")
        (marked if record.get("shot") is True else items).append(item)
    if marked:
        if len(marked) < SHOTS or not items:
            raise BuilderError(
                f"--gsm8k {path}: {len(items)} questions and {len(marked)} shots; needs a "
                f"question and {SHOTS} or more shots"
            )
        return items, marked
    if len(items) <= SHOTS:
        raise BuilderError(
            f"--gsm8k {path}: {len(items)} items; needs {SHOTS + 1} or more (each question's "
            f"{SHOTS} shots are other items of the file)"
        )
    return items, items


_FIX = "; give --gsm8k FILE (jsonl: question, answer ending '#### N'), or --gsm8k none"


def _rows(split: str, count: int) -> list[Item]:
    """The first `count` rows of a split (all of them when it has fewer)."""
    items: list[Item] = []
    total = count
    while len(items) < min(count, total):
        query = {"dataset": DATASET, "config": "main", "split": split,
                 "offset": len(items), "length": min(PAGE, count - len(items))}  # fmt: skip
        url = f"{ROWS_API}?{urlencode(query)}"
        answer = http_client.get(
            url, "GSM8K from the hub", headers={"User-Agent": "builder-qualify"}, timeout=60,
            max_bytes=16 << 20, hint=_FIX,
        )  # fmt: skip
        if answer.status != 200:
            busy = answer.status >= 500 or answer.status == 429  # the hub's trouble, not ours
            error = Unreachable if busy else BuilderError
            raise error(f"GSM8K from the hub: {url} answered HTTP {answer.status}{_FIX}")
        try:
            page = json.loads(answer.body)
        except (ValueError, RecursionError):
            raise BuilderError(f"GSM8K from the hub: {url} did not answer JSON") from None
        rows = page.get("rows") if isinstance(page, dict) else None
        if not rows:
            raise BuilderError(f"GSM8K from the hub: {url} holds no rows")
        total = int(page.get("num_rows_total") or total)
        for row in rows:
            where = f"GSM8K {split} row {row.get('row_idx')}"
            if row.get("truncated_cells"):
                raise BuilderError(f"{where}: the rows API truncated it")
            items.append(_item(row.get("row"), where))
    return items


def load(source: str, limit: int | None) -> Dataset | None:
    """`hub`, a jsonl FILE, or `none` (the gate is then skipped: None)."""
    if source == "none":
        return None
    if source == "hub":
        items, shots = _from_hub(limit)
        return Dataset(items, shots, HUB_SOURCE)
    items, shots = load_file(source)
    return Dataset(items[:limit] if limit else items, shots, f"file: {source}")


HUB_SOURCE = f"hub: {DATASET} (main), test split; shots: train[:{SHOT_POOL}]"


def _from_hub(limit: int | None) -> tuple[list[Item], list[Item]]:
    with progress.task(f"GSM8K: {DATASET} test split from the Hugging Face hub"):
        return _rows("test", limit or 10_000), _rows("train", SHOT_POOL)


def save(path: Path) -> tuple[int, int]:
    """The hub's questions and shots into `path` (jsonl, shots marked), for a GPU VM that
    cannot reach the hub: (questions, shots) written. Written whole or not at all."""
    items, shots = _from_hub(None)
    lines = [{"question": i.question, "answer": i.answer} for i in items]
    lines += [{"question": i.question, "answer": i.answer, "shot": True} for i in shots]
    atomic_write_text(path, "".join(json.dumps(line) + "\n" for line in lines))
    return len(items), len(shots)


def run(server, model: str, data: Dataset, seed: int) -> dict:
    """Every question at temperature 0, `CONCURRENCY` in flight: the strict-match score and
    the first wrong answers."""

    def ask(indexed: tuple[int, Item]) -> str:
        index, item = indexed
        text, _ = server.chat(
            model, prompt(item, shots_for(index, item, data.shots, seed)), MAX_TOKENS
        )
        return text

    with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        replies = list(pool.map(ask, enumerate(data.items)))
    wrong = [
        {"index": index, "expected": extract(item.answer), "got": extract(reply),
         "reply_end": reply.strip()[-80:]}
        for index, (item, reply) in enumerate(zip(data.items, replies, strict=True))
        if not correct(reply, item.answer)
    ]  # fmt: skip
    right = len(data.items) - len(wrong)
    return {
        "source": data.source,
        "questions": len(data.items),
        "correct": right,
        "score": round(right / len(data.items), 4),
        "wrong": wrong[:_KEPT_WRONG],
    }
