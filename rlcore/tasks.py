"""Verifiable-reward tasks: prompts, held-out prompts, and the reward of a completion.

`arithmetic` is synthetic and seeded (the built-in demo); `jsonl` reads GSM8k-style files
(`question`, `answer` ending in `#### N`) and scores a numeric exact match, optionally with
the paper's ±0.1 format term. Train and eval prompts never overlap.
"""

from __future__ import annotations

import json
import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch

from rlcore.config import ArithmeticTask, JsonlTask

FORMAT_BONUS = 0.1
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
    """Train prompts drawn by a generator, a fixed held-out list, and a scorer."""

    def __init__(self, train: list[Problem], held_out: list[Problem]):
        if not train:
            raise DatasetError("the task has no training problems")
        if not held_out:
            raise DatasetError("the task has no held-out problems")
        self.train = train
        self.held_out = held_out

    def sample(self, n: int, generator: torch.Generator) -> list[Problem]:
        """n training problems drawn uniformly (with replacement) by `generator`."""
        idx = torch.randint(len(self.train), (n,), generator=generator).tolist()
        return [self.train[i] for i in idx]

    def eval_problems(self, n: int) -> list[Problem]:
        return self.held_out[:n]

    @abstractmethod
    def score(self, problem: Problem, completion: str, finished: bool) -> Score:
        """The reward of `completion`; `finished` says whether it ended with EOS."""


class Arithmetic(Task):
    """`ab+cd=` prompts; reward 1 iff the completion is exactly the result and then EOS."""

    def __init__(self, cfg: ArithmeticTask):
        rng = random.Random(cfg.split_seed)
        operands = range(cfg.min_operand, cfg.max_operand + 1)
        ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
        problems = [
            Problem(prompt=f"{a}{op}{b}=", answer=str(ops[op](a, b)), solution=str(ops[op](a, b)))
            for op in cfg.operators
            for a in operands
            for b in operands
        ]
        rng.shuffle(problems)
        held = min(cfg.held_out, len(problems) // 2)
        super().__init__(train=problems[held:], held_out=problems[:held])

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


def read_jsonl(
    path: str | Path, question_field: str, answer_field: str, template: str, answer_check: str = "gsm8k"
) -> list[Problem]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    problems = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{where}: expected a JSON object")
            for field in (question_field, answer_field):
                if not isinstance(row.get(field), str) or not row[field].strip():
                    raise DatasetError(f"{where}: field {field!r} is missing or not a non-empty string")
            if answer_check == "math-verify":
                answer = row[answer_field].strip()
            else:
                marked = _FINAL.findall(row[answer_field])
                if not marked:
                    raise DatasetError(f"{where}: field {answer_field!r} must end in '#### <number>'")
                answer = marked[-1].replace(",", "")
            problems.append(
                Problem(
                    prompt=template.format(question=row[question_field]),
                    answer=answer,
                    solution=row[answer_field],
                )
            )
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
        super().__init__(train=train, held_out=held_out)

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


def build(cfg: ArithmeticTask | JsonlTask) -> Task:
    return Arithmetic(cfg) if cfg.name == "arithmetic" else Jsonl(cfg)
