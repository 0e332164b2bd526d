"""Tasks: disjoint splits, exact rewards, and dataset errors that name the file and line."""

import json
from pathlib import Path

import pytest
import torch

from rlcore import tasks
from rlcore.config import ArithmeticTask, JsonlTask


def test_arithmetic_prompts_answers_and_disjoint_split():
    task = tasks.build(ArithmeticTask())
    assert len(task.held_out) == 200
    assert len(task.train) == 90 * 90 - 200
    assert not {p.prompt for p in task.train} & {p.prompt for p in task.held_out}
    p = task.held_out[0]
    a, b = p.prompt.rstrip("=").split("+")
    assert p.answer == str(int(a) + int(b)) and 10 <= int(a) <= 99
    again = tasks.build(ArithmeticTask())
    assert [q.prompt for q in again.held_out] == [q.prompt for q in task.held_out]
    other = tasks.build(ArithmeticTask(split_seed=1))
    assert [q.prompt for q in other.held_out] != [q.prompt for q in task.held_out]


def test_arithmetic_reward_needs_the_exact_answer_then_eos():
    task = tasks.build(ArithmeticTask())
    problem = tasks.Problem(prompt="12+34=", answer="46", solution="46")
    assert task.score(problem, "46", finished=True) == tasks.Score(1.0, True)
    assert task.score(problem, "46", finished=False).reward == 0.0
    assert task.score(problem, "461", finished=True).reward == 0.0
    assert task.score(problem, "45", finished=True).reward == 0.0


def test_arithmetic_operators():
    task = tasks.build(ArithmeticTask(min_operand=2, max_operand=9, operators=["-", "*"], held_out=10))
    for p in task.train:
        a, op, b = p.prompt[0], p.prompt[1], p.prompt[2]
        assert op in "-*" and p.prompt[3] == "="
        assert p.answer == str(int(a) - int(b) if op == "-" else int(a) * int(b))


def test_sampling_is_seeded():
    task = tasks.build(ArithmeticTask())
    a = task.sample(16, torch.Generator().manual_seed(3))
    b = task.sample(16, torch.Generator().manual_seed(3))
    assert a == b


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


GSM = [
    {"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
    for i in range(10)
]


def test_jsonl_reads_gsm8k_format(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", GSM)
    task = tasks.build(JsonlTask(path=str(path), held_out=3))
    assert len(task.train) == 7 and len(task.held_out) == 3
    p = task.train[0]
    assert p.prompt.endswith("How many?\n") and p.answer == str(int(p.solution.split("####")[1]))


def test_jsonl_numeric_exact_match_and_format_term(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", GSM)
    plain = tasks.build(JsonlTask(path=str(path)))
    formatted = tasks.build(JsonlTask(path=str(path), format_reward=True))
    problem = tasks.Problem(prompt="q", answer="1234", solution="#### 1,234")
    assert plain.score(problem, "so the answer is 1,234", True) == tasks.Score(1.0, True)
    assert plain.score(problem, "#### 1234.0", True).correct
    assert plain.score(problem, "12 then 1233", True).reward == 0.0
    assert formatted.score(problem, "work\n#### 1234", True).reward == pytest.approx(1.1)
    assert formatted.score(problem, "1234", True).reward == pytest.approx(0.9)
    assert formatted.score(problem, "#### 7", True).reward == pytest.approx(0.1)
    assert formatted.score(problem, "no idea", True).reward == pytest.approx(-0.1)


def test_jsonl_custom_fields_and_eval_file(tmp_path):
    rows = [{"q": r["question"], "a": r["answer"]} for r in GSM]
    train = write_jsonl(tmp_path / "train.jsonl", rows[:6])
    held = write_jsonl(tmp_path / "test.jsonl", rows[6:])
    task = tasks.build(
        JsonlTask(
            path=str(train),
            eval_path=str(held),
            question_field="q",
            answer_field="a",
            prompt_template="Q: {question}\nA:",
        )
    )
    assert len(task.train) == 6 and len(task.held_out) == 4
    assert task.held_out[0].prompt.startswith("Q: Tom has 6 apples")


@pytest.mark.parametrize(
    "bad_line,reason",
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"question": "q"}', "field 'answer' is missing"),
        ('{"question": "q", "answer": "42"}', "must end in '#### <number>'"),
        ('{"question": "", "answer": "#### 1"}', "field 'question' is missing or not a non-empty string"),
    ],
)
def test_malformed_jsonl_names_file_line_and_reason(tmp_path, bad_line, reason):
    path = write_jsonl(tmp_path / "bad.jsonl", [GSM[0], GSM[1], bad_line])
    with pytest.raises(tasks.DatasetError) as err:
        tasks.build(JsonlTask(path=str(path)))
    assert f"{path}:3:" in str(err.value) and reason in str(err.value)


def test_missing_or_empty_file(tmp_path):
    with pytest.raises(tasks.DatasetError, match="no such file"):
        tasks.build(JsonlTask(path=str(tmp_path / "nope.jsonl")))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(tasks.DatasetError, match="has no problems"):
        tasks.build(JsonlTask(path=str(tmp_path / "empty.jsonl")))


MATH_SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data" / "math-sample.jsonl"


def test_math_verify_reward_judges_latex_answers_by_value():
    task = tasks.build(
        JsonlTask(
            path=str(MATH_SAMPLE), question_field="problem", answer_field="answer", answer_check="math-verify"
        )
    )
    by_answer = {p.answer: p for p in task.train + task.held_out}
    assert len(by_answer) == 5 and "\\frac{3}{4}" in by_answer, "LaTeX answers are kept as they are"
    three_quarters, root = by_answer["\\frac{3}{4}"], by_answer["2\\sqrt{2}"]
    assert task.score(three_quarters, "so the sum is \\boxed{0.75}", True).correct
    assert task.score(three_quarters, "the answer is $\\frac{6}{8}$", True).reward == 1.0
    assert not task.score(three_quarters, "\\boxed{\\frac{2}{3}}", True).correct
    assert task.score(root, "\\boxed{\\sqrt{8}}", True).correct
    assert task.score(by_answer["25"], "3^2 + 4^2 = \\boxed{25}", True).reward == 1.0
    assert task.score(by_answer["25"], "I do not know", False).reward == 0.0


def test_the_gsm8k_example_is_the_papers_setting():
    from rlcore.config import load

    config = load(Path(__file__).resolve().parents[2] / "examples" / "gsm8k.yaml")
    assert (config.rollout.prompts_per_step, config.rollout.group_size, config.steps) == (96, 8, 160)
    assert config.optimizer.lr == 1e-6 and config.staleness.sync_interval == 20
    assert (config.task.name, config.model.source, config.queue) == ("jsonl", "local", "gpu")
