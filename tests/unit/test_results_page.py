"""benchmarks/README.md is generated from benchmarks/results/*.json and agrees with them; a result whose
measured code differs from its commit is marked stale (gangctl/harness/results.py)."""
from __future__ import annotations

import json
import subprocess

import pytest

from gangctl.harness import results


def test_the_results_page_is_what_the_results_files_give():
    assert results.PAGE.read_text() == results.page(results.load()), \
        "benchmarks/README.md disagrees with benchmarks/results/: run benchmarks/results_page.py"


def test_every_benchmark_has_a_result_and_the_page_stays_short():
    scripts = {p.stem for p in results.PAGE.parent.glob("*.py")} - {"local", "results_page"}
    assert scripts == set(results.BENCHMARKS), "a benchmark without an entry (what it measures, its paths)"
    assert {r["benchmark"] for r in results.load()} == set(results.BENCHMARKS), "a benchmark without a results file"
    assert len(results.PAGE.read_text().splitlines()) < 300


def git(repo, *argv):
    return subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True, text=True).stdout.strip()


def test_a_result_is_stale_once_its_measured_paths_change(tmp_path):
    repo = tmp_path / "repo"
    (repo / "gangctl" / "sim").mkdir(parents=True)
    git(repo.parent, "init", "-q", str(repo))
    for args in (("config", "user.email", "t@t"), ("config", "user.name", "t")):
        git(repo, *args)
    (repo / "gangctl" / "sim" / "engine.py").write_text("x = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "engine")
    measured = git(repo, "rev-parse", "--short", "HEAD")
    (repo / "README.md").write_text("unrelated\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "docs")
    out = tmp_path / "results"
    out.mkdir()
    result = {"benchmark": "sim_speed", "date": "2026-11-27", "commit": measured, "command": "bench", "cpu": "cpu",
              "load": "idle", "runs": "median of 3", "columns": ["jobs", "jobs/s"], "rows": [[20000, 12410]]}
    (out / "sim_speed.json").write_text(json.dumps(result))
    text = results.page(results.load(out), repo)
    assert "| 20,000 | 12,410 |" in text and f"Measured 2026-11-27 at `{measured}` on cpu (idle); median of 3." in text
    assert "**Stale:**" not in text, "a commit that did not touch the measured paths leaves it current"
    (repo / "gangctl" / "sim" / "engine.py").write_text("x = 2\n")
    stale = (f"**Stale:** the measured code (`gangctl/sim`, `gangctl/policy`) changed after it "
             f"(`git log {measured}.. -- <those paths>`);")
    before_commit = results.page(results.load(out), repo)
    assert stale in before_commit, "an uncommitted change already marks it, so the page is committed with the change"
    git(repo, "commit", "-qam", "faster engine")
    assert results.page(results.load(out), repo) == before_commit, "committing the change leaves the page as it was"
    (repo / "gangctl" / "policy").mkdir()
    (repo / "gangctl" / "policy" / "quota.py").write_text("y = 1\n")
    assert results.page(results.load(out), repo) == before_commit, "a new file, then a later commit, do not move it"
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "quota")
    assert results.page(results.load(out), repo) == before_commit
    (out / "sim_speed.json").write_text(json.dumps(result | {"commit": "unknown"}))
    assert "**Stale or not: unknown**" in results.page(results.load(out), repo), "no commit, no claim either way"
    (out / "sim_speed.json").write_text(json.dumps({k: v for k, v in result.items() if k != "cpu"}))
    with pytest.raises(ValueError, match="sim_speed.json: missing cpu"):
        results.load(out)


def test_repeated_runs_print_as_median_and_range():
    assert results.cell({"median": 20.28, "min": 16.21, "max": 22.07, "n": 3, "samples": []}) == \
        "20.28 (16.21–22.07, 3 runs)"
    assert (results.cell(11011), results.cell(0.51), results.cell(None), results.cell("8.1×")) == \
        ("11,011", "0.51", "—", "8.1×")
