"""Trace loaders (gangctl.sim.traces) on the shipped samples, on round-trips and on bad input."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gangctl.sim import shipped
from gangctl.sim.generate import Shape, generate
from gangctl.sim.scenario import Scenario
from gangctl.sim.traces import TraceError, TraceFormat, TraceJob, load_trace

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "simulations" / "traces"

SAMPLES = {
    TraceFormat.PAI: TRACES / "pai_job_table.csv",
    TraceFormat.PHILLY: TRACES / "philly_cluster_job_log.json",
    TraceFormat.HELIOS: TRACES / "helios_cluster_log.csv",
    TraceFormat.CSV: TRACES / "jobs.csv",
}


def _valid(jobs: list[TraceJob]) -> None:
    assert jobs, "no jobs loaded"
    assert jobs[0].submit == 0, "submit times are shifted so the first job arrives at 0"
    assert [j.submit for j in jobs] == sorted(j.submit for j in jobs)
    assert len({j.id for j in jobs}) == len(jobs)
    for j in jobs:
        assert j.num_nodes >= 1 and j.gpus_per_node >= 1 and j.duration >= 0, j


@pytest.mark.parametrize("fmt", list(SAMPLES))
def test_shipped_samples_load(fmt):
    trace = load_trace(fmt, SAMPLES[fmt])
    _valid(trace.jobs)
    assert trace.errors == []
    assert "bad row" not in trace.skipped


def test_shipped_samples_are_what_the_generator_writes(tmp_path):
    shipped.write_samples(tmp_path)
    for path in SAMPLES.values():
        assert (tmp_path / path.name).read_text() == path.read_text(), f"{path.name}: run python -m gangctl.sim.shipped"
    assert (tmp_path / "pai_task_table.csv").read_text() == (TRACES / "pai_task_table.csv").read_text()


def test_scenario_schema_file_is_current():
    assert json.loads((ROOT / "simulations/schema.json").read_text()) == Scenario.model_json_schema(by_alias=True), \
        "run: python -m gangctl.sim.shipped"


# --- each format reads back the jobs that were written in it --------------------------------------

def _jobs(n: int = 120, seed: int = 5, shape: Shape = Shape.PAI) -> list[TraceJob]:
    return generate(n, 30, seed=seed, shape=shape, groups={"g1": 1, "g2": 1})


def _shape_of(jobs: list[TraceJob]) -> list[tuple[int, int]]:
    return [(j.num_nodes, j.gpus_per_node) for j in jobs]


def _same_durations(loaded: list[TraceJob], written: list[TraceJob]) -> None:
    """The writers round times to 0.1 s (PAI, CSV) or whole seconds (Helios, Philly timestamps)."""
    assert [j.duration for j in loaded] == pytest.approx([j.duration for j in written], abs=1.01)


def test_pai_reads_inst_num_and_plan_gpu_percent_and_skips_cpu_only_and_unfinished(tmp_path):
    jobs = _jobs()
    shipped.write_pai(jobs, tmp_path, random.Random(1))
    trace = load_trace(TraceFormat.PAI, tmp_path / "pai_job_table.csv")
    cpu_only = {i for i in range(len(jobs)) if i % 41 == 40}
    unfinished = {i for i in range(len(jobs)) if i % 97 == 96}
    kept = [j for i, j in enumerate(jobs) if i not in cpu_only | unfinished]
    assert [j.id for j in trace.jobs] == [j.id for j in kept]
    assert _shape_of(trace.jobs) == _shape_of(kept)
    _same_durations(trace.jobs, kept)
    assert trace.skipped == {"no GPU": len(cpu_only - unfinished), "never ended": len(unfinished)}
    assert trace.jobs[0].cpu_per_node == kept[0].cpu_per_node   # plan_cpu percent -> cores


def test_philly_reads_machines_of_the_last_attempt(tmp_path):
    jobs = _jobs(shape=Shape.PHILLY)
    path = tmp_path / "philly.json"
    shipped.write_philly(jobs, path, random.Random(1))
    trace = load_trace(TraceFormat.PHILLY, path)
    never = {i for i in range(len(jobs)) if i % 53 == 52}
    kept = [j for i, j in enumerate(jobs) if i not in never]
    by_id = {f"application_{i:06d}": j for i, j in enumerate(jobs)}
    assert _shape_of(trace.jobs) == _shape_of([by_id[j.id] for j in trace.jobs])
    _same_durations(trace.jobs, [by_id[j.id] for j in trace.jobs])
    assert len(trace.jobs) == len(kept)
    assert trace.skipped == {"never started": len(never)}


def test_helios_splits_gpu_num_over_node_num(tmp_path):
    jobs = _jobs(shape=Shape.HELIOS)
    path = tmp_path / "cluster_log.csv"
    shipped.write_helios(jobs, path, random.Random(1))
    trace = load_trace(TraceFormat.HELIOS, path)
    no_gpu = {i for i in range(len(jobs)) if i % 37 == 36}
    kept = [j for i, j in enumerate(jobs) if i not in no_gpu]
    assert [j.id for j in trace.jobs] == [j.id for j in kept]
    assert _shape_of(trace.jobs) == _shape_of(kept)
    _same_durations(trace.jobs, kept)


def test_plain_csv_round_trips(tmp_path):
    jobs = _jobs()
    path = tmp_path / "jobs.csv"
    shipped.write_csv(jobs, path)
    trace = load_trace(TraceFormat.CSV, path)
    t0 = jobs[0].submit
    assert [(j.id, j.group) for j in trace.jobs] == [(j.id, j.group) for j in jobs]
    assert [j.submit + t0 for j in trace.jobs] == pytest.approx([j.submit for j in jobs], abs=1e-3)
    assert _shape_of(trace.jobs) == _shape_of(jobs)
    _same_durations(trace.jobs, jobs)


def test_plain_csv_kind_column_says_what_a_job_is_submitted_as(tmp_path):
    header = "job_id,submit_time,duration,num_nodes,gpus_per_node,kind"
    path = _write(tmp_path / "jobs.csv", [header, "a,0,10,1,8,", "b,1,10,2,8,PyTorchJob", "c,2,10,1,8,TrainJob"])
    assert [j.kind for j in load_trace(TraceFormat.CSV, path).jobs] == ["TrainJob", "PyTorchJob", "TrainJob"]
    bad = _write(tmp_path / "bad.csv", [header, "a,0,10,1,8,MPIJob"])
    with pytest.raises(TraceError, match="bad.csv:2.*kind must be one of TrainJob, PyTorchJob, got 'MPIJob'"):
        load_trace(TraceFormat.CSV, bad)


# --- bad rows: an error naming file and line, or skipped and counted -----------------------------

def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _pai(tmp_path: Path, bad_task: str) -> Path:
    _write(tmp_path / "pai_task_table.csv", [
        "j1,worker,2,Terminated,10,110,600,48,800,V100",
        bad_task,
        "j3,worker,1,Terminated,30,90,600,48,100,T4",
    ])
    return _write(tmp_path / "pai_job_table.csv", [
        "j1,i1,u1,Terminated,5,110", "j2,i2,u1,Terminated,6,120", "j3,i3,u2,Terminated,7,90"])


def _helios(tmp_path: Path, bad: str) -> Path:
    return _write(tmp_path / "cluster_log.csv", [
        ",".join(["job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state", "submit_time", "start_time", "end_time"]),
        "a,u,vc1,16,8,2,COMPLETED,2020-04-01 00:00:00,2020-04-01 00:01:00,2020-04-01 01:01:00",
        bad,
        "c,u,vc2,1,1,1,COMPLETED,2020-04-01 00:02:00,2020-04-01 00:03:00,2020-04-01 00:13:00",
    ])


def _csv(tmp_path: Path, bad: str) -> Path:
    return _write(tmp_path / "jobs.csv", ["job_id,submit_time,duration,num_nodes,gpus_per_node",
                                          "a,0,100,2,8", bad, "c,20,50,1,1"])


def _philly(tmp_path: Path, bad: str) -> Path:
    good = lambda i: json.dumps({"jobid": f"app_{i}", "vc": "vc1", "submitted_time": 100 + i,  # noqa: E731
                                 "attempts": [{"start_time": 200 + i, "end_time": 900 + i,
                                               "detail": [{"ip": "m1", "gpus": ["g0", "g1"]}]}]})
    return _write(tmp_path / "philly.json", ["[", good(1) + ",", bad + ",", good(3), "]"])


BAD = [
    (TraceFormat.PAI, _pai, "j2,worker,two,Terminated,20,120,600,48,100,V100", "pai_task_table.csv:2", "inst_num"),
    (TraceFormat.PAI, _pai, "j2,worker,1,Terminated,20", "pai_task_table.csv:2", "expected 10 fields"),
    (TraceFormat.HELIOS, _helios, "b,u,vc1,x,8,1,COMPLETED,2020-04-01 00:00:00,2020-04-01 00:01:00,2020-04-01 01:01:00",
     "cluster_log.csv:3", "gpu_num"),
    (TraceFormat.HELIOS, _helios, "b,u,vc1,8,8,1,COMPLETED,2020-04-01 00:00:00,2020-04-01 02:00:00,2020-04-01 01:00:00",
     "cluster_log.csv:3", "before it starts"),
    (TraceFormat.CSV, _csv, "b,10,100,1.5,8", "jobs.csv:3", "num_nodes must be an integer"),
    (TraceFormat.CSV, _csv, "b,10,-5,1,8", "jobs.csv:3", "duration"),
    (TraceFormat.PHILLY, _philly, json.dumps({"jobid": "app_2", "submitted_time": 1, "attempts": "none"}),
     "philly.json:3", "attempts must be a list"),
]


@pytest.mark.parametrize("fmt,write,bad,where,what", BAD, ids=[f"{b[0].value}-{b[4]}" for b in BAD])
def test_bad_row_names_file_and_line(tmp_path, fmt, write, bad, where, what):
    path = write(tmp_path, bad)
    with pytest.raises(TraceError) as err:
        load_trace(fmt, path)
    assert str(err.value).startswith(where + ":"), str(err.value)
    assert what in str(err.value)


@pytest.mark.parametrize("fmt,write,bad,where,what", BAD, ids=[f"{b[0].value}-{b[4]}" for b in BAD])
def test_bad_row_skipped_and_counted_on_request(tmp_path, fmt, write, bad, where, what):
    trace = load_trace(fmt, write(tmp_path, bad), skip_bad=True)
    assert trace.skipped.get("bad row") == 1
    assert len(trace.errors) == 1 and trace.errors[0].startswith(where + ":") and what in trace.errors[0]
    assert len(trace.jobs) == 2      # the good rows around it are kept
    _valid(trace.jobs)


def test_invalid_json_names_its_line(tmp_path):
    path = _write(tmp_path / "philly.json", ["[", '{"jobid": "a",', '  "vc": }', "]"])
    with pytest.raises(TraceError, match=r"^philly.json:3: invalid JSON"):
        load_trace(TraceFormat.PHILLY, path)


def test_missing_header_column_is_an_error(tmp_path):
    path = _write(tmp_path / "jobs.csv", ["job_id,submit_time,duration,num_nodes", "a,0,1,1"])
    with pytest.raises(TraceError, match=r"^jobs.csv:1: header lacks column\(s\) gpus_per_node"):
        load_trace(TraceFormat.CSV, path)
