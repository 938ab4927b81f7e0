"""mlx-embed on a model that gives one vector per token (a multi-vector model: ColQwen2.5 here; or --pooling
none): the corpus mode (--input, one vector per row) refuses it before it loads or writes anything, in this
process and on Ray; -p refuses an --embd-normalize it would not apply (the server uses the model's per-token
rows as they are, on the embedding routes and /maxsim)."""
from __future__ import annotations

import pytest

from compat.cli import embed_main
from tests.conftest import minilm_dir
from tests.engine.families import colqwen2_fixture as fixture


@pytest.fixture(scope="module")
def colqwen(tmp_path_factory):
    folder = tmp_path_factory.mktemp("colqwen2_5") / "m"
    fixture.make_checkpoint(folder)
    return folder


def _corpus(tmp_path):
    source = tmp_path / "c.jsonl"
    source.write_text('{"id": "a", "text": "a page"}\n{"id": "b", "text": "another page"}\n')
    return source


@pytest.mark.parametrize("ray", [False, True], ids=["local", "ray"])
def test_a_multi_vector_model_is_refused_before_anything_is_written(colqwen, tmp_path, capsys, ray):
    source = _corpus(tmp_path)
    code = embed_main(["-m", str(colqwen), "--quiet", "--input", str(source), "--output", str(tmp_path / "v.parquet"),
                       *(["--ray"] if ray else [])])
    err = capsys.readouterr().err
    assert code == 1
    assert "multi-vector" in err and "one vector per row" in err and "/maxsim" in err, err
    assert "embed_token_vectors" not in err and "Encoder" not in err, err  # no Python names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]  # no v.parquet, no v.parquet.parts/


def test_pooling_none_is_refused_before_anything_is_written(tmp_path, capsys):
    source = _corpus(tmp_path)
    code = embed_main(["-m", str(minilm_dir()), "--quiet", "--pooling", "none", "--input", str(source),
                       "--output", str(tmp_path / "v.parquet")])
    err = capsys.readouterr().err
    assert code == 1 and "pooling none gives one vector per token" in err and "--pooling mean" in err, err
    assert "Encoder" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_embd_normalize_is_refused_for_token_vectors(colqwen, capsys):
    code = embed_main(["-m", str(colqwen), "-p", "a page", "--embd-normalize", "-1"])
    captured = capsys.readouterr()
    assert code == 1 and "--embd-normalize -1" in captured.err and "L2-normalized by the model" in captured.err
    assert captured.out == ""
    # without it, the rows print as the model gives them
    assert embed_main(["-m", str(colqwen), "-p", "a page"]) == 0
    assert capsys.readouterr().out
