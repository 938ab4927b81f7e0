"""mlx-embed's corpus mode on MiniLM: the Parquet vectors equal the server's for the same texts, in every input
format; bad rows are reported and counted; a run killed with SIGKILL resumes to the very file an uninterrupted run
writes, without embedding its finished row groups again; --ray on a local Ray instance writes the same layout with
the same vectors (within 1e-6)."""
from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compat.cli import embed_main
from tests.conftest import minilm_dir
from tests.server.harness import ROOT, ServerProcess, clean_env

TEXTS = [f"Document {i}: {topic}" for i, topic in enumerate(
    ["the cat sits on the mat", "quarterly revenue beat forecasts", "a feline rests on a rug",
     "rain is expected tomorrow", "the central bank raised rates", "a recipe for lemon cake",
     "how to repair a bicycle tyre", "the museum opens at nine"] * 3)]
LONG = "word " * 600  # 602 tokens: over MiniLM's 512


@pytest.fixture(scope="module")
def server():
    with ServerProcess("-m", str(minilm_dir()), "--embedding", "--offline") as srv:
        yield srv


@pytest.fixture(scope="module")
def expected(server) -> dict[str, list[float]]:
    res = server.post("/v1/embeddings", json={"input": TEXTS})
    assert res.status_code == 200, res.text
    return {text: item["embedding"] for text, item in zip(TEXTS, res.json()["data"])}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run(*args: str, capsys) -> tuple[int, str]:
    code = embed_main(["-m", str(minilm_dir()), "--quiet", *args])
    return code, capsys.readouterr().err


def read(path: Path) -> tuple[list, np.ndarray]:
    table = pq.read_table(path)
    return table.column("id").to_pylist(), np.array(table.column("embedding").to_pylist(), dtype=np.float32)


def test_jsonl_corpus_equals_server_and_reports_bad_rows(tmp_path, expected, capsys):
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    records[3:3] = [{"id": "empty", "text": ""}, {"id": "nothing"}, {"id": "long", "text": LONG}]
    source = write_jsonl(tmp_path / "c.jsonl", records)
    with open(source, "a") as f:
        f.write("{not json\n")
    out = tmp_path / "o.parquet"
    code, err = run("--input", str(source), "--output", str(out), "--rows-per-group", "8", capsys=capsys)
    assert code == 1
    assert f"{source}: line 4 (id empty): empty text" in err
    assert f"{source}: line 5 (id nothing): no 'text' field" in err
    assert f"{source}: line 6 (id long): input (602 tokens) exceeds the ubatch limit of 512 tokens" in err
    assert f"{source}: line {len(records) + 1}: not valid JSON" in err
    assert "4 rows failed and are not in" in err
    ids, vectors = read(out)
    assert ids == [f"d{i}" for i in range(len(TEXTS))]
    np.testing.assert_allclose(vectors, [expected[t] for t in TEXTS], rtol=0, atol=1e-6)
    meta = pq.ParquetFile(out)
    assert meta.schema_arrow.field("embedding").type == pa.list_(pa.float32(), 384)
    assert meta.metadata.num_row_groups == 4  # 28 input rows, 8 per group
    info = json.loads(meta.schema_arrow.metadata[b"mlx_embed"])
    assert meta.schema_arrow.metadata[b"model"] == str(minilm_dir()).encode()
    assert (info["dimension"], info["rows"], info["embd_normalize"], info["text_field"]) == (384, 24, 2, "text")


def test_text_csv_and_parquet_inputs_give_the_same_vectors(tmp_path, expected, capsys):
    text = tmp_path / "c.txt"
    text.write_text("".join(t + "\n" for t in TEXTS[:6]))
    code, _ = run("--input", str(text), "--output", str(tmp_path / "t.parquet"), capsys=capsys)
    ids, vectors = read(tmp_path / "t.parquet")
    assert code == 0 and ids == [1, 2, 3, 4, 5, 6]  # numbered by line
    np.testing.assert_allclose(vectors, [expected[t] for t in TEXTS[:6]], rtol=0, atol=1e-6)
    with open(tmp_path / "c.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "body"])
        writer.writerows((f"k{i}", t) for i, t in enumerate(TEXTS[:6]))
    code, _ = run("--input", str(tmp_path / "c.csv"), "--output", str(tmp_path / "c.parquet"),
                  "--text-field", "body", "--id-field", "key", capsys=capsys)
    assert code == 0 and read(tmp_path / "c.parquet")[0] == [f"k{i}" for i in range(6)]
    np.testing.assert_allclose(read(tmp_path / "c.parquet")[1], vectors, rtol=0, atol=1e-6)  # batch invariance
    pq.write_table(pa.table({"id": list(range(100, 106)), "text": TEXTS[:6]}), tmp_path / "in.parquet")
    code, _ = run("--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "p.parquet"), capsys=capsys)
    assert code == 0 and read(tmp_path / "p.parquet")[0] == [str(i) for i in range(100, 106)]
    np.testing.assert_allclose(read(tmp_path / "p.parquet")[1], vectors, rtol=0, atol=1e-6)


def test_options_reach_the_vectors(tmp_path, server, capsys):
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": TEXTS[0]}, {"id": "b", "text": LONG}])
    code, _ = run("--input", str(source), "--output", str(tmp_path / "o.parquet"), "--truncate",
                  "--embd-normalize", "-1", "--dimensions", "64", capsys=capsys)
    assert code == 0
    res = server.post("/v1/embeddings", json={"input": [TEXTS[0], LONG], "truncate": True, "embd_normalize": -1})
    raw = np.array([item["embedding"] for item in res.json()["data"]])
    np.testing.assert_allclose(read(tmp_path / "o.parquet")[1], raw[:, :64], rtol=0, atol=1e-6)


def _manifest_parts(folder: Path) -> int:
    try:
        return len(json.loads((folder / "manifest.json").read_text())["parts"])
    except (OSError, ValueError):
        return 0


def test_a_killed_run_resumes_to_the_same_file(tmp_path, capsys):
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": f"d{i}", "text": f"{TEXTS[i % len(TEXTS)]} ({i})"}
                                                for i in range(240)])
    killed = tmp_path / "killed.parquet"
    argv = ["--input", str(source), "--output", str(killed), "--rows-per-group", "16"]
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from compat.cli import embed_main; "
                             "sys.exit(embed_main())", "-m", str(minilm_dir()), *argv], cwd=ROOT, env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = killed.with_name("killed.parquet.parts")
    deadline = time.monotonic() + 120
    while _manifest_parts(parts) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = _manifest_parts(parts)
    assert 3 <= done < 15 and not killed.exists(), "the run was not killed in the middle"

    code, err = run(*argv, capsys=capsys)
    assert code == 1 and "interrupted run: add --resume" in err  # never silently redone or overwritten
    code, err = run(*argv, "--resume", capsys=capsys)
    assert code == 0 and f"resuming after {16 * done} rows" in err
    assert f"this run embedded {240 - 16 * done} in" in err  # the finished row groups were not recomputed
    clean = tmp_path / "clean.parquet"
    assert run("--input", str(source), "--output", str(clean), "--rows-per-group", "16", capsys=capsys)[0] == 0
    # the same rows in the same order with the same metadata; vectors within batch invariance, since how the
    # engine groups rows into passes follows the timing of a loaded machine (widths differ by a few ULPs' sums)
    resumed, fresh = pq.read_table(killed), pq.read_table(clean)
    assert resumed.schema == fresh.schema and resumed.schema.metadata == fresh.schema.metadata
    assert resumed.column("id").to_pylist() == fresh.column("id").to_pylist()
    np.testing.assert_allclose(read(killed)[1], read(clean)[1], rtol=0, atol=1e-6)


def test_ray_writes_the_single_process_file(tmp_path, expected, capsys):
    ray = pytest.importorskip("ray", reason="the ray extra (pip install .[ray]; scripts/setup.sh --test installs it)")
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    records.insert(5, {"id": "empty", "text": ""})
    source = write_jsonl(tmp_path / "c.jsonl", records)
    single, spread = tmp_path / "single.parquet", tmp_path / "ray.parquet"
    assert run("--input", str(source), "--output", str(single), "--rows-per-group", "8", capsys=capsys)[0] == 1
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        code, err = run("--input", str(source), "--output", str(spread), "--rows-per-group", "8", "--ray",
                        "--ray-actors", "2", capsys=capsys)
        # engine.Encoder itself as a Ray Data callable, as docs/offline.md shows it
        from engine import Encoder

        rows = ray.data.from_items([{"text": t} for t in TEXTS[:4]]).map_batches(
            Encoder, fn_constructor_args=(str(minilm_dir()),), compute=ray.data.ActorPoolStrategy(size=1),
            batch_format="numpy").take_all()
    finally:
        ray.shutdown()
    assert sorted(row["text"] for row in rows) == sorted(TEXTS[:4])
    np.testing.assert_allclose([row["embedding"] for row in rows], [expected[row["text"]] for row in rows],
                               rtol=0, atol=1e-6)
    assert code == 1 and f"{source}: line 6 (id empty): empty text" in err and "1 row failed" in err
    ids, vectors = read(spread)
    assert ids == [f"d{i}" for i in range(len(TEXTS))]
    np.testing.assert_allclose(vectors, [expected[t] for t in TEXTS], rtol=0, atol=1e-6)
    np.testing.assert_allclose(vectors, read(single)[1], rtol=0, atol=1e-6)
    # the same layout: schema, metadata, row groups (the vectors may differ in the last bits: actors run their own
    # BLAS thread count)
    one, other = pq.ParquetFile(single), pq.ParquetFile(spread)
    assert other.schema_arrow.equals(one.schema_arrow, check_metadata=True)
    assert [other.metadata.row_group(i).num_rows for i in range(other.metadata.num_row_groups)] == \
        [one.metadata.row_group(i).num_rows for i in range(one.metadata.num_row_groups)]
