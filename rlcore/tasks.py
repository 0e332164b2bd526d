"""Verifiable-reward tasks: prompts, held-out prompts and the reward of a completion. `arithmetic`
is synthetic and seeded (the built-in demo); `jsonl` reads GSM8k-style files and scores a numeric
exact match, optionally with the paper's ±0.1 format term. Train and eval prompts never overlap;
a task's memory is bounded whatever its config."""

from __future__ import annotations

import bisect
import hashlib
import json
import random
import re
import string
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch

from rlcore.config import ArithmeticTask, JsonlTask, template_fields

FORMAT_BONUS = 0.1
# Up to this many operand combinations the arithmetic split is a shuffled list of indices
# (~10 MB); beyond it, held-out problems are drawn straight from the seed.
MATERIALISE_LIMIT = 250_000
MAX_DATASET_BYTES = 2**30
MAX_PROMPT_CHARS = 32_768
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_FINAL = re.compile(r"####\s*(-?\d[\d,]*(?:\.\d+)?)")


class DatasetError(ValueError):
    """A dataset file is malformed; the message names the file, the line and the reason."""


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str  # the canonical final answer, e.g. "57"
    solution: str  # the full target completion used for supervised warm starts


@dataclass(frozen=True)
class Score:
    reward: float
    correct: bool


class Task(ABC):
    """Training problems drawn by a generator, a fixed held-out list, and a scorer."""

    def __init__(self, held_out: list[Problem], train_size: int):
        if train_size < 1:
            raise DatasetError("the task has no training problems")
        if not held_out:
            raise DatasetError("the task has no held-out problems")
        self.held_out = held_out
        self.train_size = train_size

    @abstractmethod
    def train_problem(self, index: int) -> Problem:
        """Training problem `index` (0 <= index < train_size), in the task's own fixed order."""

    def train_problems(self, n: int) -> list[Problem]:
        """The first `n` training problems (all of them if there are fewer)."""
        return [self.train_problem(i) for i in range(min(n, self.train_size))]

    def sample(self, n: int, generator: torch.Generator) -> list[Problem]:
        """n training problems drawn uniformly (with replacement) by `generator`."""
        idx = torch.randint(self.train_size, (n,), generator=generator).tolist()
        return [self.train_problem(i) for i in idx]

    def eval_problems(self, n: int) -> list[Problem]:
        return self.held_out[:n]

    @abstractmethod
    def score(self, problem: Problem, completion: str, finished: bool) -> Score:
        """The reward of `completion`; `finished` says whether it ended with EOS."""


_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class Arithmetic(Task):
    """`ab+cd=` prompts; reward 1 iff the completion is exactly the result and then EOS.

    Problem i of the `len(operators) × W²` operand combinations (W operands per side) is
    operator i // W², a = min + (i // W) % W, b = min + i % W. Up to `MATERIALISE_LIMIT`
    combinations the seeded RNG shuffles the list of indices and the first `held_out` are held
    out (the split every run has used); beyond it the RNG samples the held-out indices from
    the range and training index j is the j-th index not held out. Either way the split is
    disjoint, a function of `split_seed` alone, and memory is O(held_out), not O(W²).
    """

    def __init__(self, cfg: ArithmeticTask):
        self.operators = list(cfg.operators)
        self.low = cfg.min_operand
        self.width = cfg.max_operand - cfg.min_operand + 1
        size = len(self.operators) * self.width**2
        held = min(cfg.held_out, size // 2)
        rng = random.Random(cfg.split_seed)
        if size <= MATERIALISE_LIMIT:
            order = list(range(size))
            rng.shuffle(order)
            held_idx, self._train_idx = order[:held], order[held:]
        else:
            held_idx, self._train_idx = rng.sample(range(size), held), None
            self._held_sorted = sorted(held_idx)
        super().__init__(held_out=[self.problem(i) for i in held_idx], train_size=size - held)

    def problem(self, index: int) -> Problem:
        """Operand combination `index`."""
        op, rest = divmod(index, self.width**2)
        a, b = (self.low + k for k in divmod(rest, self.width))
        operator = self.operators[op]
        result = str(_OPS[operator](a, b))
        return Problem(prompt=f"{a}{operator}{b}=", answer=result, solution=result)

    def train_problem(self, index: int) -> Problem:
        if not 0 <= index < self.train_size:
            raise IndexError(f"training problem {index} of {self.train_size}")
        if self._train_idx is not None:
            return self.problem(self._train_idx[index])
        # The index-th combination that is not held out: skip the held-out ones at or below it.
        found = index
        while True:
            moved = index + bisect.bisect_right(self._held_sorted, found)
            if moved == found:
                return self.problem(found)
            found = moved

    def score(self, problem: Problem, completion: str, finished: bool) -> Score:
        correct = finished and completion == problem.answer
        return Score(reward=float(correct), correct=correct)


def _parse_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def final_answer(completion: str) -> str | None:
    """The answer after `####`, else the last number in the text."""
    marked = _FINAL.findall(completion)
    if marked:
        return marked[-1]
    numbers = _NUMBER.findall(completion)
    return numbers[-1] if numbers else None


def render_prompt(template: str, row: dict, question_field: str) -> str:
    """`template` with `{question}` replaced by the row's question and any other `{name}` by the
    row's field `name`; nothing else of Python's format language applies (validated by
    `rlcore.config.template_fields`). KeyError names a missing field; ValueError a field that
    is not text or a number."""
    template_fields(template)
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        if name is None:
            continue
        value = row[question_field] if name == "question" else row[name]
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"field {name!r} of prompt_template is not text or a number")
        parts.append(str(value))
    return "".join(parts)


def read_jsonl(
    path: str | Path, question_field: str, answer_field: str, template: str, answer_check: str = "gsm8k"
) -> list[Problem]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    size = path.stat().st_size
    if size > MAX_DATASET_BYTES:
        raise DatasetError(
            f"{path}: the file is {size:,} bytes, more than the {MAX_DATASET_BYTES:,} bytes a task reads; "
            "split it or hold out an evaluation file"
        )
    problems = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            if lineno == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise DatasetError(
                    f"{where}: the file is UTF-16 (it starts with a UTF-16 byte-order mark); save it as UTF-8"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(
                    f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
                    "a dataset is JSON lines in UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON ({exc.msg})") from exc
            except RecursionError:
                raise DatasetError(f"{where}: the JSON is nested too deeply to read") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{where}: expected a JSON object")
            for field in (question_field, answer_field):
                if not isinstance(row.get(field), str) or not row[field].strip():
                    raise DatasetError(f"{where}: field {field!r} is missing or not a non-empty string")
            for field in (question_field, answer_field, *template_fields(template)):
                if isinstance(row.get(field), str) and "\x00" in row[field]:
                    raise DatasetError(
                        f"{where}: field {field!r} contains a NUL character (\\u0000), which the lab's "
                        "database cannot store; remove it"
                    )
            if answer_check == "math-verify":
                answer = row[answer_field].strip()
            else:
                marked = _FINAL.findall(row[answer_field])
                if not marked:
                    raise DatasetError(f"{where}: field {answer_field!r} must end in '#### <number>'")
                answer = marked[-1].replace(",", "")
            try:
                prompt = render_prompt(template, row, question_field)
            except KeyError as exc:
                raise DatasetError(f"{where}: field {exc.args[0]!r} of prompt_template is missing") from exc
            except ValueError as exc:
                raise DatasetError(f"{where}: {exc}") from exc
            if len(prompt) > MAX_PROMPT_CHARS:
                raise DatasetError(
                    f"{where}: the prompt is {len(prompt):,} characters, more than {MAX_PROMPT_CHARS:,}"
                )
            problems.append(Problem(prompt=prompt, answer=answer, solution=row[answer_field]))
    if not problems:
        raise DatasetError(f"{path}: the file has no problems")
    return problems


class Jsonl(Task):
    """GSM8k-format question/answer pairs with a numeric exact-match reward."""

    def __init__(self, cfg: JsonlTask):
        self.format_reward = cfg.format_reward
        self.answer_check = cfg.answer_check
        fields = (cfg.question_field, cfg.answer_field, cfg.prompt_template, cfg.answer_check)
        problems = read_jsonl(cfg.path, *fields)
        if cfg.eval_path:
            held_out = read_jsonl(cfg.eval_path, *fields)
            train = problems
        else:
            random.Random(cfg.split_seed).shuffle(problems)
            held = min(cfg.held_out, len(problems) // 2)
            train, held_out = problems[held:], problems[:held]
        self.train = train
        super().__init__(held_out=held_out, train_size=len(train))

    def train_problem(self, index: int) -> Problem:
        return self.train[index]

    def score(self, problem: Problem, completion: str, finished: bool) -> Score:
        if self.answer_check == "math-verify":
            correct = math_equal(problem.answer, completion)
        else:
            given = final_answer(completion)
            value = _parse_number(given) if given is not None else None
            correct = value is not None and value == _parse_number(problem.answer)
        reward = float(correct)
        if self.format_reward:
            reward += FORMAT_BONUS if _FINAL.search(completion) else -FORMAT_BONUS
        return Score(reward=reward, correct=correct)


def math_equal(answer: str, completion: str) -> bool:
    """Whether the completion's final answer (`\\boxed{}` or LaTeX) equals `answer` (LaTeX)
    mathematically, as math-verify judges it (1/2 = 0.5 = \\frac{1}{2})."""
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise RuntimeError(
            "task.answer_check 'math-verify' needs the math-verify package: pip install math-verify"
        ) from exc
    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$")
    return bool(gold) and bool(verify(gold, parse(completion)))


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dataset_sha256s(cfg: ArithmeticTask | JsonlTask) -> dict[str, str]:
    """The sha256 of each file the task reads, by path (none for the synthetic task): the
    dataset's version, in the tiny model's cache key, the run's provenance and its experiment's pin."""
    if cfg.name != "jsonl":
        return {}
    return {path: file_sha256(path) for path in (cfg.path, cfg.eval_path) if path}


def build(cfg: ArithmeticTask | JsonlTask) -> Task:
    return Arithmetic(cfg) if cfg.name == "arithmetic" else Jsonl(cfg)
