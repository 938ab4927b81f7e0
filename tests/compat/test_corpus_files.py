"""Corpus files as rows (numbers, ids, bad rows) and the part store's manifest, without a model; and a corpus
streamed from a pipe through the whole job in memory that does not grow with the corpus."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compat.corpus.files import CorpusReader, Row
from compat.corpus.groups import Group
from compat.corpus.job import Progress, describe_failure
from compat.corpus.output import PartStore
from compat.settings import SettingsError
from tests.server.harness import ROOT, clean_env

DOCS = [("a1", "first document"), ("a2", ""), ("a3", "third, with a comma"), ("a4", "fourth")]


def rows(path, **kw) -> list[Row]:
    return list(CorpusReader(path, "text", "id", **kw))


def test_jsonl_rows_ids_and_bad_rows(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([json.dumps({"id": "x", "text": "fine"}), "{broken", json.dumps([1, 2]),
                               json.dumps({"id": 7, "text": "int id"}), json.dumps({"text": "no id"}),
                               json.dumps({"id": "y", "text": 3}), json.dumps({"id": "z"}),
                               json.dumps({"id": "w", "text": "  "}), ""]) + "\n")
    got = rows(path)
    assert [(r.number, r.id, r.text) for r in got[:1]] == [(1, "x", "fine")]
    assert got[1].error.startswith("not valid JSON") and got[1].id == 2
    assert got[2].error == "a JSON list, not an object"
    assert (got[3].id, got[3].text, got[3].error) == ("7", "int id", None)  # ids are kept as text
    assert got[4].error == "no 'id' (the other rows have one)"
    assert got[5].error == "'text' is a int, not a string"
    assert got[6].error == "no 'text' field" and got[6].id == "z"
    assert got[7].error == "empty text"
    assert got[8].error.startswith("not valid JSON") and got[8].number == 9  # a blank line is a row too
    assert [r.number for r in rows(path, skip=6)] == [7, 8, 9]


def test_text_csv_and_parquet_rows(tmp_path):
    text = tmp_path / "c.txt"
    text.write_text("".join(f"{t}\n" for _, t in DOCS))
    assert [(r.number, r.id, r.text, r.error) for r in rows(text)] == [
        (1, 1, "first document", None), (2, 2, None, "empty text"), (3, 3, "third, with a comma", None),
        (4, 4, "fourth", None)]
    table = tmp_path / "c.csv"
    with open(table, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerows([(i, t.replace("third", "third\nline")) for i, t in DOCS])  # a quoted newline
    got = rows(table)
    assert [r.id for r in got] == ["a1", "a2", "a3", "a4"] and got[2].text == "third\nline, with a comma"
    assert [r.number for r in got] == [1, 2, 3, 4] and got[1].error == "empty text"
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [10, 11, 12, 13], "text": [t for _, t in DOCS]}), parquet, row_group_size=3)
    got = list(CorpusReader(parquet, "text", "id", skip=1))
    assert [(r.number, r.id) for r in got] == [(2, "11"), (3, "12"), (4, "13")] and got[0].error == "empty text"
    unnamed = list(CorpusReader(parquet, "text", "doc_id"))  # no such column: numbered
    assert [r.id for r in unnamed] == [1, 2, 3, 4]


def test_part_store_resumes_only_the_same_job(tmp_path):
    out = tmp_path / "o.parquet"
    job = {"model": "m", "rows_per_group": 2}
    store = PartStore(out, job, resume=False, notes=io.StringIO())
    group = Group(2, ids=["a"], vectors=[pa.array([1.0, 2.0]).to_numpy()], failures=[(2, "b", "empty text")])
    store.add(group)
    with pytest.raises(SettingsError, match="interrupted run: add --resume"):
        PartStore(out, job, resume=False, notes=io.StringIO())
    with pytest.raises(SettingsError, match="different job .*differs in: rows_per_group"):
        PartStore(out, {**job, "rows_per_group": 3}, resume=True, notes=io.StringIO())
    notes = io.StringIO()
    again = PartStore(out, job, resume=True, notes=notes)
    assert again.rows_done == 2 and again.earlier_failures() == [(2, "b", "empty text")]
    assert "resuming after 2 rows" in notes.getvalue()
    assert again.finish() == (1, 2)
    assert pq.read_table(out).to_pydict() == {"id": ["a"], "embedding": [[1.0, 2.0]]}
    assert not (tmp_path / "o.parquet.parts").exists()


def test_failures_name_the_line_and_the_id(tmp_path):
    assert describe_failure(tmp_path / "c.jsonl", "line", 8, 8, "empty text") == f"{tmp_path}/c.jsonl: line 8: empty text"
    assert describe_failure(tmp_path / "c.csv", "row", 3, "d3", "empty text").endswith("row 3 (id d3): empty text")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_shows_rate_and_eta(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a\n" * 100)  # 200 bytes
    reader = CorpusReader(path, "text", "id")
    stream = _Terminal()
    progress = Progress(stream, reader, enabled=True, rows_before=10)  # resumed after 10 rows
    reader.position = lambda: 50  # a quarter of the file's bytes read
    progress.update(Group(25, ids=list(range(25))), final=True)
    assert stream.getvalue().startswith("\r35 rows, ") and "texts/s, 25.0%" in stream.getvalue()
    reader.position = lambda: 100  # half: 50 bytes in 10 s, 100 bytes left
    progress._first = (progress._first[0] - 10, 50)  # the second group took 10 s
    progress.update(Group(25, ids=list(range(25))), final=True)
    assert stream.getvalue().split("\r")[-1].startswith("60 rows, ") and ", 50.0%, ETA 0:20" in stream.getvalue()


# A job through the real pipeline (reader, row groups, parts, manifest, final file) with an encoder that costs
# nothing, so that the corpus can be far larger than what the process may hold: peak memory must not grow with it.
_STREAM_JOB = textwrap.dedent("""
    import os, sys, threading, json
    import numpy as np
    import engine
    from compat.cli import embed_main
    from engine.offline import EncodedRows

    class HashEncoder:  # 8 values per text, from its length and first byte
        def __init__(self, ref, **options): pass
        def __enter__(self): return self
        def __exit__(self, *exc): pass
        def encode_rows(self, texts, **kw):
            vectors = np.array([[len(t), ord(t[0])] * 4 for t in texts], np.float32)
            return EncodedRows(vectors, [None] * len(texts), [1] * len(texts))

    engine.Encoder = HashEncoder
    rows, folder = int(sys.argv[1]), sys.argv[2]
    fifo = os.path.join(folder, "corpus.jsonl")
    os.mkfifo(fifo)
    def feed():
        with open(fifo, "w") as f:
            for i in range(rows):
                f.write(json.dumps({"id": f"doc{i}", "text": f"{i} " + "lorem ipsum " * 80}) + "\\n")
    threading.Thread(target=feed, daemon=True).start()
    code = embed_main(["--input", fifo, "--output", os.path.join(folder, "out.parquet"), "--quiet"])
    peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]
    print(code, peak)
""")


def _peak_kib(rows: int, folder) -> int:
    done = subprocess.run([sys.executable, "-c", _STREAM_JOB, str(rows), str(folder)], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    code, peak = done.stdout.split()
    assert code == "0"
    assert pq.ParquetFile(folder / "out.parquet").metadata.num_rows == rows
    return int(peak)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak RSS from /proc")
def test_a_piped_corpus_streams_in_memory_independent_of_its_size(tmp_path):
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir()
    large.mkdir()
    small_peak = _peak_kib(5_000, small)  # about 5 MB of JSON lines
    large_peak = _peak_kib(100_000, large)  # about 100 MB: twenty times as much
    assert large_peak - small_peak < 30 * 1024, (small_peak, large_peak)
