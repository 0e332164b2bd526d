"""Tasks: disjoint splits, exact rewards, and dataset errors that name the file and line."""

import json
import re
from pathlib import Path

import pytest
import torch

from rlcore import tasks
from rlcore.config import ArithmeticTask, JsonlTask


def test_arithmetic_prompts_answers_and_disjoint_split():
    task = tasks.build(ArithmeticTask())
    assert len(task.held_out) == 200
    assert task.train_size == 90 * 90 - 200
    train = task.train_problems(task.train_size)
    assert not {p.prompt for p in train} & {p.prompt for p in task.held_out}
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
    for p in task.train_problems(task.train_size):
        a, op, b = p.prompt[0], p.prompt[1], p.prompt[2]
        assert op in "-*" and p.prompt[3] == "="
        assert p.answer == str(int(a) - int(b) if op == "-" else int(a) * int(b))


def test_small_ranges_keep_the_split_and_the_samples_every_run_has_used():
    # The shuffled list of operand combinations of the built-in demo, as before sampling became lazy:
    # its shipped θ0 and its curves depend on these exact problems.
    task = tasks.build(ArithmeticTask())
    assert [p.prompt for p in task.held_out[:3]] == ["25+60=", "31+51=", "53+98="]
    assert [p.prompt for p in task.sample(3, torch.Generator().manual_seed(0))] == [
        "86+88=",
        "33+24=",
        "29+21=",
    ]


def test_a_huge_operand_range_is_sampled_lazily_with_a_disjoint_deterministic_split():
    import tracemalloc

    cfg = ArithmeticTask(min_operand=0, max_operand=10**6, operators=["+", "-", "*"], held_out=2000)
    tracemalloc.start()
    try:
        task = tasks.build(cfg)
        drawn = task.sample(20_000, torch.Generator().manual_seed(1))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MiB: the ~3·10^12 combinations were listed"
    assert task.train_size == 3 * (10**6 + 1) ** 2 - 2000 and len(task.held_out) == 2000
    held = {p.prompt for p in task.held_out}
    assert len(held) == 2000 and not held & {p.prompt for p in drawn}
    assert len({p.prompt for p in drawn}) > 19_900, "drawn from the whole range"
    again = tasks.build(cfg)
    assert again.held_out == task.held_out
    assert again.sample(50, torch.Generator().manual_seed(1)) == drawn[:50]
    assert tasks.build(cfg.model_copy(update={"split_seed": 1})).held_out != task.held_out
    for p in drawn[:200]:
        a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", p.prompt).groups()
        assert p.answer == str(eval(f"{a}{op}{b}"))  # noqa: S307 (digits and one operator)


def test_lazy_training_indices_are_exactly_the_combinations_not_held_out(monkeypatch):
    monkeypatch.setattr(tasks, "MATERIALISE_LIMIT", 0)
    task = tasks.build(ArithmeticTask(min_operand=0, max_operand=40, operators=["+", "*"], held_out=500))
    train = [p.prompt for p in task.train_problems(task.train_size)]
    held = [p.prompt for p in task.held_out]
    every = [task.problem(i).prompt for i in range(2 * 41 * 41)]
    assert len(set(train)) == len(train) == len(every) - 500
    assert sorted(train + held) == sorted(every)
    with pytest.raises(IndexError):
        task.train_problem(task.train_size)


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
    assert task.train_size == 7 and len(task.held_out) == 3
    p = task.train_problem(0)
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
    assert task.train_size == 6 and len(task.held_out) == 4
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


def test_prompt_templates_substitute_named_fields_of_the_line(tmp_path):
    rows = [{**r, "topic": "apples", "n": i} for i, r in enumerate(GSM)]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    template = "[{topic} #{n}] {{literal}} {question}\n"
    task = tasks.build(JsonlTask(path=str(path), prompt_template=template, held_out=2))
    prompts = {p.prompt for p in task.train_problems(task.train_size) + task.held_out}
    assert f"[apples #3] {{literal}} {GSM[3]['question']}\n" in prompts


@pytest.mark.parametrize(
    "row,reason",
    [
        ({"question": "q", "answer": "#### 1"}, "field 'topic' of prompt_template is missing"),
        (
            {"question": "q", "answer": "#### 1", "topic": ["a"]},
            "field 'topic' of prompt_template is not text",
        ),
    ],
)
def test_a_template_field_the_line_lacks_names_the_file_and_line(tmp_path, row, reason):
    path = write_jsonl(tmp_path / "train.jsonl", [{**GSM[0], "topic": "t"}, row])
    with pytest.raises(tasks.DatasetError) as err:
        tasks.build(JsonlTask(path=str(path), prompt_template="{topic}: {question}"))
    assert f"{path}:2:" in str(err.value) and reason in str(err.value)


def test_prompts_and_files_over_the_budget_are_refused(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "train.jsonl", GSM)
    monkeypatch.setattr(tasks, "MAX_PROMPT_CHARS", 60)
    with pytest.raises(
        tasks.DatasetError, match=r"train.jsonl:1: the prompt is \d+ characters, more than 60"
    ):
        tasks.build(JsonlTask(path=str(path), prompt_template="{question} {question}"))
    monkeypatch.setattr(tasks, "MAX_DATASET_BYTES", 100)
    size = path.stat().st_size
    with pytest.raises(
        tasks.DatasetError, match=f"the file is {size:,} bytes, more than the 100 bytes a task reads"
    ):
        tasks.build(JsonlTask(path=str(path)))


def write_lines(path, lines: list[bytes]):
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


GOOD_LINE = json.dumps(GSM[0]).encode()


@pytest.mark.parametrize(
    "second_line,reason",
    [
        # Valid JSON that PostgreSQL cannot store as text: refused here, with the field.
        (
            json.dumps({"question": "What is 12\u0000+34?", "answer": "#### 46"}).encode(),
            "field 'question' contains a NUL character (\\u0000), which the lab's database cannot store",
        ),
        (bytes(range(0x80, 0xC0)), "not UTF-8 text (byte 0x80 at byte 1 of the line)"),
        (b"[" * 200_000 + b"]" * 200_000, "the JSON is nested too deeply to read"),
    ],
)
def test_a_hostile_line_is_refused_naming_the_file_and_line(tmp_path, second_line, reason):
    path = write_lines(tmp_path / "train.jsonl", [GOOD_LINE, second_line])
    with pytest.raises(tasks.DatasetError) as err:
        tasks.build(JsonlTask(path=str(path)))
    assert str(err.value).startswith(f"{path}:2: {reason}")


def test_a_utf16_file_is_refused_saying_so(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes((json.dumps(GSM[0]) + "\n").encode("utf-16"))
    with pytest.raises(tasks.DatasetError, match=r"train.jsonl:1: the file is UTF-16 .*save it as UTF-8"):
        tasks.build(JsonlTask(path=str(path)))


MATH_SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data" / "math-sample.jsonl"


def test_math_verify_reward_judges_latex_answers_by_value():
    task = tasks.build(
        JsonlTask(
            path=str(MATH_SAMPLE), question_field="problem", answer_field="answer", answer_check="math-verify"
        )
    )
    by_answer = {p.answer: p for p in task.train_problems(task.train_size) + task.held_out}
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
