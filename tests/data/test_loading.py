"""Loaders over small local files the tests write (JSON lines, JSON arrays, CSV, Parquet): the public sets'
column conventions, slicing, and errors that name the file, the line (or record) and the field."""

from __future__ import annotations

import csv
import json
import re

import pytest

from dlmrl.data.loading import DataError, load_records
from dlmrl.data.text_examples import (
    CountdownExample,
    GSM8KExample,
    MathExample,
    countdown_examples,
    gsm8k_examples,
    math_examples,
)


@pytest.fixture
def cache(tmp_path):
    return str(tmp_path / "hf-cache")


def write_jsonl(path, rows, blank_after=()):
    with open(path, "w") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps(row) + "\n")
            if i in blank_after:
                f.write("\n")
    return str(path)


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


GSM = [{"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72"},
       {"question": "A big sum?", "answer": "It is large.\n#### 1,234"}]


def test_gsm8k_jsonl(tmp_path, cache):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM)
    examples = gsm8k_examples(load_records(path, cache_dir=cache))
    assert examples == [
        GSM8KExample(GSM[0]["question"], "72", "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72"),
        GSM8KExample("A big sum?", "1234", "It is large."),
    ]


def test_bad_record_names_file_line_and_field(tmp_path, cache):
    rows = GSM + [{"question": "Q?", "answer": "no final answer here"}]
    path = write_jsonl(tmp_path / "gsm8k.jsonl", rows, blank_after=(0,))  # the bad record sits on line 4
    with pytest.raises(DataError, match=re.escape(f"{path} line 4: field 'answer': no numeric final answer")):
        gsm8k_examples(load_records(path, cache_dir=cache))
    path = write_jsonl(tmp_path / "q.jsonl", [GSM[0], {"question": "   ", "answer": "#### 1"}])
    with pytest.raises(DataError, match=re.escape(f"{path} line 2: field 'question': empty")):
        gsm8k_examples(load_records(path, cache_dir=cache))
    path = write_jsonl(tmp_path / "m.jsonl", [GSM[0], {"answer": "#### 1"}])
    with pytest.raises(DataError, match=re.escape(f"{path} line 2: field 'question': missing or null")):
        gsm8k_examples(load_records(path, cache_dir=cache))


def test_empty_and_byte_order_marked_json_files_get_clear_errors(tmp_path, cache):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match=re.escape(f"{empty}: empty file (no records)")):
        load_records(str(empty), cache_dir=cache)
    bom = tmp_path / "bom.jsonl"
    bom.write_text("\ufeff" + json.dumps(GSM[0]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{bom} line 1: the file starts with a UTF-8 byte-order mark")):
        load_records(str(bom), cache_dir=cache)


def test_invalid_json_line_and_missing_column(tmp_path, cache):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(GSM[0]) + "\n" + '{"question": "x", "answer": \n')
    with pytest.raises(DataError, match=re.escape(f"{path} line 2: invalid JSON")):
        load_records(str(path), cache_dir=cache)
    path = write_jsonl(tmp_path / "cols.jsonl", [{"question": "x", "solution": "#### 1"}])
    with pytest.raises(DataError, match=re.escape(f"{path}: needs columns ('question', 'answer')")):
        gsm8k_examples(load_records(path, cache_dir=cache))


def test_csv_lines_follow_quoted_newlines_and_keep_text(tmp_path, cache):
    # header line 1; record 1 spans lines 2-4 (quoted newlines); record 2 on line 5 is bad
    path = write_csv(tmp_path / "gsm8k.csv", ["question", "answer"],
                     [["Q1?", "step\nstep\n#### 0012"], ["Q2?", "#### twelve"]])
    with pytest.raises(DataError, match=re.escape(f"{path} line 5: field 'answer'")):
        gsm8k_examples(load_records(path, cache_dir=cache))
    path = write_csv(tmp_path / "ok.csv", ["question", "answer"], [["Q1?", "step\n#### 0012"]])
    assert gsm8k_examples(load_records(path, cache_dir=cache))[0].answer == "0012"  # read as text


def test_a_csv_with_a_byte_order_mark_reads_its_first_column(tmp_path, cache):
    """Spreadsheets write a UTF-8 BOM; it must not become part of the first column's name (KeyError '\ufeffquestion')."""
    path = tmp_path / "bom.csv"
    path.write_text("\ufeffquestion,answer\nQ1?,#### 12\nQ2?,#### twelve\n", encoding="utf-8")
    records = load_records(str(path), cache_dir=cache)
    assert set(records.columns) == {"question", "answer"}
    with pytest.raises(DataError, match=re.escape(f"{path} line 3: field 'answer'")):  # (lines still counted)
        gsm8k_examples(records)


def test_parquet_and_json_array_name_records(tmp_path, cache):
    import datasets

    rows = [{"problem": "p1", "solution": "so $\\boxed{\\frac{1}{2}}$"}, {"problem": "p2", "solution": "no box"}]
    path = str(tmp_path / "math.parquet")
    datasets.Dataset.from_list(rows).to_parquet(path)
    with pytest.raises(DataError, match=re.escape(f"{path} record 2: field 'solution': no final \\boxed{{...}}")):
        math_examples(load_records(path, cache_dir=cache))
    path = tmp_path / "math.json"
    path.write_text(json.dumps([{"problem": "p1", "answer": "\\frac{14}{3}", "solution": "..."},
                                {"problem": "p2", "answer": 5}]))
    assert math_examples(load_records(str(path), cache_dir=cache)) == [
        MathExample("p1", "\\frac{14}{3}", "..."), MathExample("p2", "5", "")]


def test_math_gold_from_answer_or_solution(tmp_path, cache):
    path = write_jsonl(tmp_path / "m.jsonl", [
        {"problem": "p", "solution": "We find $\\boxed{(3, \\frac{\\pi}{2})}$.", "answer": "(3, \\frac{\\pi}{2})"},
        {"problem": "q", "solution": "Thus \\boxed{\\dfrac{9}{7}}."}])
    assert [e.answer for e in math_examples(load_records(path, cache_dir=cache))] == [
        "(3, \\frac{\\pi}{2})", "\\dfrac{9}{7}"]


def test_countdown_both_conventions(tmp_path, cache):
    hub = write_jsonl(tmp_path / "cd.jsonl", [{"nums": [44, 19, 35], "target": 98}, {"nums": [1, 2, 3, 4], "target": 10}])
    d1 = write_jsonl(tmp_path / "countdown_cd3_test.jsonl", [{"input": "30,100,93", "output": "23"}])
    text = write_csv(tmp_path / "cd.csv", ["nums", "target"], [["[44, 19, 35]", "98"], ["1,2,3", "6"]])
    assert countdown_examples(load_records(hub, cache_dir=cache)) == [
        CountdownExample((44, 19, 35), 98), CountdownExample((1, 2, 3, 4), 10)]
    assert countdown_examples(load_records(d1, cache_dir=cache), "test") == [
        CountdownExample((30, 100, 93), 23, "test")]
    assert [e.nums for e in countdown_examples(load_records(text, cache_dir=cache))] == [(44, 19, 35), (1, 2, 3)]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"input": "30,100,93", "output": "23"}, {"input": "3,x", "output": "1"}])
    with pytest.raises(DataError, match=re.escape(f"{bad} line 2: field 'input': expected an integer, got 'x'")):
        countdown_examples(load_records(bad, cache_dir=cache))
    bad = write_jsonl(tmp_path / "bad2.jsonl", [{"nums": [1, 2], "target": 1.5}])
    with pytest.raises(DataError, match=re.escape(f"{bad} line 1: field 'target': expected an integer, got 1.5")):
        countdown_examples(load_records(bad, cache_dir=cache))


def test_slicing_keeps_line_numbers(tmp_path, cache):
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(5)]
    rows[4]["answer"] = "nothing"
    path = write_jsonl(tmp_path / "g.jsonl", rows)
    head = load_records(path, "train[:-2]", cache_dir=cache)
    assert [e.question for e in gsm8k_examples(head)] == ["q0", "q1", "q2"]
    tail = load_records(path, "train[-2:]", cache_dir=cache)
    assert tail.locations == [f"{path} line 4", f"{path} line 5"]
    with pytest.raises(DataError, match=re.escape(f"{path} line 5: field 'answer'")):
        gsm8k_examples(tail)


def test_source_errors(tmp_path, cache):
    with pytest.raises(DataError, match="does not exist"):
        load_records(str(tmp_path / "missing.jsonl"), cache_dir=cache)
    txt = tmp_path / "data.txt"
    txt.write_text("x")
    with pytest.raises(DataError, match="unsupported file type '.txt'"):
        load_records(str(txt), cache_dir=cache)
    path = write_jsonl(tmp_path / "g.jsonl", GSM)
    with pytest.raises(DataError, match="only split|one split"):
        load_records(path, "test", cache_dir=cache)
    with pytest.raises(DataError, match="no such file or folder"):
        load_records("./not/here", cache_dir=cache)  # (a path, never a hub download)


def test_records_the_fuzzer_broke_are_refused_with_a_data_error(tmp_path, cache):
    """Found by benchmarks/reliability.py: an answer whose box holds nothing, and a 5000-digit number, raised a
    bare ValueError (no file, line or field) from deep inside the converters."""
    empty_box = write_jsonl(tmp_path / "m.jsonl", [{"problem": "p", "answer": "\\boxed{ }"}])
    with pytest.raises(DataError, match=re.escape(f"{empty_box} line 1: field 'answer': empty gold answer")):
        math_examples(load_records(empty_box, cache_dir=cache))
    huge = write_jsonl(tmp_path / "cd.jsonl", [{"nums": [1, 2], "target": "9" * 5000}])
    with pytest.raises(DataError, match=re.escape(f"{huge} line 1: field 'target': an integer of 5000 digits")):
        countdown_examples(load_records(huge, cache_dir=cache))
    signs = write_jsonl(tmp_path / "signs.jsonl", [{"nums": [1, 2], "target": "-" * 40 + "5"}])  # (int() raised)
    with pytest.raises(DataError, match="field 'target': expected an integer"):
        countdown_examples(load_records(signs, cache_dir=cache))
    d1_style = write_jsonl(tmp_path / "countdown_cd3_test.jsonl", [{"input": "1," + "9" * 5000, "output": "3"}])
    with pytest.raises(DataError, match="field 'input': an integer of 5000 digits"):
        countdown_examples(load_records(d1_style, cache_dir=cache), "test")


def test_a_file_that_is_not_utf8_names_the_file_the_byte_offset_and_the_encoding(tmp_path, cache):
    """A Latin-1 export (é = 0xE9): the loader names the data file and where the byte is, not the config."""
    jsonl = tmp_path / "latin1.jsonl"
    jsonl.write_bytes(b'{"question": "ok", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n')
    offset = jsonl.read_bytes().index(b"\xe9")
    with pytest.raises(DataError, match=rf"^{re.escape(str(jsonl))}: not UTF-8 text: byte 0xE9 at byte offset "
                                        rf"{offset} \(line 2, column 18\).*read as UTF-8"):
        load_records(str(jsonl), cache_dir=cache)
    csv_file = tmp_path / "latin1.csv"
    csv_file.write_bytes(b"question,answer\n" + b"caf\xe9,1\n")
    with pytest.raises(DataError, match=rf"{re.escape(str(csv_file))}: not UTF-8 text: byte 0xE9 at byte offset 19 "
                                        r"\(line 2, column 4\)"):
        load_records(str(csv_file), cache_dir=cache)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_utf16_file_is_named_utf16_not_given_latin1_advice(encoding, tmp_path, cache):
    """Windows editors' "Unicode" (UTF-16, with its byte-order mark or without): the advice was to convert from
    latin-1 (with the mark), or the file read as text full of NULs (without)."""
    path = tmp_path / "data.jsonl"
    path.write_text('{"question": "ok", "answer": "1"}\n', encoding=encoding)
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: UTF-16 text \(.*\); data files are read as UTF-8: "
                                        r"save it as UTF-8 \(e.g. iconv -f utf-16 -t utf-8 IN > OUT\)$") as err:
        load_records(str(path), cache_dir=cache)
    assert "latin" not in str(err.value)
    assert ("byte-order mark 0xFF 0xFE" in str(err.value)) == (encoding == "utf-16")  # (Python writes it LE)


@pytest.mark.parametrize("task", ["gsm8k", "dataset", "sudoku"])
def test_the_cli_blames_a_non_utf8_data_file_on_the_key_that_names_it(task, tmp_path, capsys):
    from dlmrl.cli import main

    if task == "sudoku":
        path = tmp_path / "puzzles.csv"
        path.write_bytes(b"Puzzle,Solution\n12\xe9,1\n")
    else:
        path = tmp_path / "data.jsonl"
        path.write_bytes(b'{"question": "caf\xe9", "prompt": "caf\xe9", "answer": "1"}\n')
    extra = ["train.reward_funcs=[dlmrl.rewards.math_reward]"] if task == "dataset" else []
    code = main(["train", f"task.name={task}", f"task.train_file={path}", f"output_dir={tmp_path / 'run'}",
                 "--dry-run", *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert f"command-line override 'task.train_file={path}': config key 'task.train_file': {path}: not UTF-8" in err
    assert "recipes" not in err  # (not blamed on the packaged recipe the run starts from)


def test_a_folder_with_a_file_that_is_not_utf8_names_that_file(tmp_path, cache):
    folder = tmp_path / "fold"
    folder.mkdir()
    (folder / "train.jsonl").write_bytes(b'{"question": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(DataError, match=rf"{re.escape(str(folder / 'train.jsonl'))}: not UTF-8 text: byte 0xE9 at "
                                        r"byte offset 17"):
        load_records(str(folder), cache_dir=cache)
