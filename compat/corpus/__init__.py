"""mlx-embed --input: a corpus file embedded into a Parquet file.

    files.py       the corpus file read as a stream of rows (JSON lines, CSV, Parquet, plain text)
    groups.py      row groups and their outcome, what both runners yield
    output.py      the Parquet output, written part by part so that a run resumes
    job.py         the command: checks, the local runner, progress and failure reports
    ray_runner.py  the Ray Data runner (--ray)
"""
