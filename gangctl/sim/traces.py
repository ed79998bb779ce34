"""Loaders for public GPU-cluster traces, turning each job into one gang of identical pods.

Formats (the real files load unchanged):
- `pai`: Alibaba cluster-trace-gpu-v2020. `pai_job_table.csv` (job_name, inst_id, user, status,
  start_time, end_time) and `pai_task_table.csv` (job_name, task_name, inst_num, status,
  start_time, end_time, plan_cpu, plan_mem, plan_gpu, gpu_type). The published files have no
  header row (a header row is accepted too). Times in seconds; plan_gpu in percent of a GPU
  (rounded up to whole GPUs: nvidia.com/gpu cannot share); plan_cpu in percent of a core; plan_mem
  in GB. The job's submit time is the job's start_time; its run time is the task's; the gang is the
  task with the most GPUs (inst_num pods).
- `philly`: Microsoft Philly cluster_job_log, a JSON array of jobs with submitted_time, vc, user and
  attempts[{start_time, end_time, detail[{ip, gpus[]}]}]: one pod per machine of the last attempt,
  GPUs per pod = the most GPUs it had on one machine; run time = the last attempt's.
- `helios`: SenseTime Helios cluster_log.csv (job_id, user, vc, gpu_num, cpu_num, node_num, state,
  submit_time, start_time, end_time[, duration]): node_num pods of ceil(gpu_num / node_num) GPUs.
- `csv`: a plain CSV with a header: job_id, submit_time, duration, num_nodes, gpus_per_node and
  optionally team, priority_class, gpu_type, cpu_per_node (cores), memory_per_node (GiB), kind
  (TrainJob, the default, or PyTorchJob: what the job is submitted as).

Times may be numbers (seconds) or "YYYY-MM-DD HH:MM:SS" (UTC); submit times are shifted so the
first job arrives at 0. Jobs that never ran, never ended or use no GPU are skipped and counted.
A malformed row raises `TraceError` naming file and line, or with `skip_bad=True` is skipped,
counted and its first messages kept.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Callable, Iterator

from gangctl.api.pytorchjob import KIND as PYTORCHJOB_KIND
from gangctl.api.trainjob import TRAINJOB_KIND

PAI_JOB_COLUMNS = ["job_name", "inst_id", "user", "status", "start_time", "end_time"]
PAI_TASK_COLUMNS = ["job_name", "task_name", "inst_num", "status", "start_time", "end_time",
                    "plan_cpu", "plan_mem", "plan_gpu", "gpu_type"]
HELIOS_COLUMNS = ["job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state",
                  "submit_time", "start_time", "end_time"]
CSV_COLUMNS = ["job_id", "submit_time", "duration", "num_nodes", "gpus_per_node"]
JOB_KINDS = (TRAINJOB_KIND, PYTORCHJOB_KIND)   # what a simulated job may be submitted as


class TraceFormat(str, Enum):
    PAI = "pai"
    PHILLY = "philly"
    HELIOS = "helios"
    CSV = "csv"


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit: float            # seconds since the trace's first submission
    duration: float          # seconds of running at full size
    num_nodes: int           # pods in the gang
    gpus_per_node: int
    cpu_per_node: float = 0.0      # cores
    memory_per_node: float = 0.0   # GiB
    group: str = ""          # user / virtual cluster / team in the trace: the scenario maps it to a team
    gpu_type: str | None = None
    priority_class: str | None = None
    kind: str = TRAINJOB_KIND   # what the job is submitted as: a TrainJob, or a PyTorchJob (the scenario's share)

    @property
    def gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass
class Trace:
    jobs: list[TraceJob]
    skipped: dict[str, int] = field(default_factory=dict)   # reason -> rows
    errors: list[str] = field(default_factory=list)         # first messages of skipped bad rows


class TraceError(ValueError):
    """A malformed row: the message starts with `file:line:`."""


_MAX_KEPT_ERRORS = 20


class _Rows:
    """Counts skipped rows and raises or records bad ones."""

    def __init__(self, skip_bad: bool) -> None:
        self.skip_bad = skip_bad
        self.trace = Trace(jobs=[])

    def skip(self, reason: str) -> None:
        self.trace.skipped[reason] = self.trace.skipped.get(reason, 0) + 1

    def bad(self, where: str, message: str) -> None:
        text = f"{where}: {message}"
        if not self.skip_bad:
            raise TraceError(text)
        self.skip("bad row")
        if len(self.trace.errors) < _MAX_KEPT_ERRORS:
            self.trace.errors.append(text)

    def guarded(self, where: str, parse: Callable[[], TraceJob | str | None]) -> None:
        """Run one row's parser: a job is kept, a string is a skip reason, a ValueError is a bad row."""
        try:
            result = parse()
        except (ValueError, KeyError, TypeError) as exc:
            self.bad(where, _message(exc))
            return
        if isinstance(result, str):
            self.skip(result)
        elif result is not None:
            self.trace.jobs.append(result)

    def finish(self) -> Trace:
        jobs = sorted(self.trace.jobs, key=lambda j: (j.submit, j.id))
        if jobs:
            t0 = jobs[0].submit
            jobs = [replace(j, submit=j.submit - t0) for j in jobs]
        self.trace.jobs = jobs
        return self.trace


def _message(exc: Exception) -> str:
    return f"missing column {exc}" if isinstance(exc, KeyError) else str(exc)


def load_trace(fmt: TraceFormat, path: Path, *, task_table: Path | None = None, skip_bad: bool = False) -> Trace:
    """Load a trace file; `task_table` is PAI's second file (default: pai_task_table.csv beside it)."""
    rows = _Rows(skip_bad)
    if fmt is TraceFormat.PAI:
        _load_pai(rows, path, task_table or path.with_name("pai_task_table.csv"))
    elif fmt is TraceFormat.PHILLY:
        _load_philly(rows, path)
    elif fmt is TraceFormat.HELIOS:
        _load_helios(rows, path)
    else:
        _load_csv(rows, path)
    return rows.finish()


def _csv_rows(path: Path, columns: list[str], header_required: bool) -> Iterator[tuple[str, dict[str, str]]]:
    """(`file:line`, row) pairs. Without a header row (PAI's files) `columns` names the fields."""
    with path.open(newline="") as f:
        reader = csv.reader(f)
        names: list[str] | None = None
        for record in reader:
            where = f"{path.name}:{reader.line_num}"
            if not record or not any(c.strip() for c in record):
                continue
            if names is None:
                if record[0].strip() == columns[0]:
                    names = [c.strip() for c in record]
                    missing = [c for c in columns if c not in names]
                    if missing:
                        raise TraceError(f"{where}: header lacks column(s) {', '.join(missing)}")
                    continue
                if header_required:
                    raise TraceError(f"{where}: expected a header row starting with {columns[0]!r}")
                names = columns
            if len(record) != len(names):
                yield where, {"__error__": f"expected {len(names)} fields, found {len(record)}"}
                continue
            yield where, {n: v.strip() for n, v in zip(names, record)}


def _checked(row: dict[str, str]) -> dict[str, str]:
    if "__error__" in row:
        raise ValueError(row["__error__"])
    return row


def _number(row: dict[str, str], name: str, *, required: bool = True) -> float | None:
    text = row.get(name, "")
    if text in ("", "None", "nan", "NaN"):
        if required:
            raise ValueError(f"{name} is empty")
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} is not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {text!r}")
    return value


def _time(value: object, name: str) -> float | None:
    """Seconds; numbers pass through, 'YYYY-MM-DD HH:MM:SS' is read as UTC; empty/None is None."""
    if value is None or value in ("", "None", "nan"):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise ValueError(f"{name} is not a time: {text!r}") from None


def _run_time(start: float | None, end: float | None) -> float | str:
    if start is None:
        return "never started"
    if end is None:
        return "never ended"
    if end < start:
        raise ValueError(f"ends ({end:g}) before it starts ({start:g})")
    return end - start


# --- Alibaba PAI ---------------------------------------------------------------------------------

def _load_pai(rows: _Rows, job_path: Path, task_path: Path) -> None:
    jobs: dict[str, tuple[str, float | None]] = {}   # job_name -> (user, submit)
    for where, raw in _csv_rows(job_path, PAI_JOB_COLUMNS, header_required=False):
        try:
            row = _checked(raw)
            if not row["job_name"]:
                raise ValueError("job_name is empty")
            jobs[row["job_name"]] = (row["user"], _time(row["start_time"], "start_time"))
        except ValueError as exc:
            rows.bad(where, str(exc))
    best: dict[str, tuple[float, str, dict[str, str]]] = {}   # job_name -> (GPUs, where, task row)
    for where, raw in _csv_rows(task_path, PAI_TASK_COLUMNS, header_required=False):
        def task() -> str | None:
            row = _checked(raw)
            if row["job_name"] not in jobs:
                raise ValueError(f"job {row['job_name']!r} is not in {job_path.name}")
            inst = _number(row, "inst_num")
            gpu = _number(row, "plan_gpu", required=False) or 0.0
            if inst != int(inst) or inst < 1:
                raise ValueError(f"inst_num must be a positive integer, got {row['inst_num']!r}")
            _number(row, "plan_cpu", required=False)
            _number(row, "plan_mem", required=False)
            total = inst * gpu
            if row["job_name"] not in best or total > best[row["job_name"]][0]:
                best[row["job_name"]] = (total, where, row)
            return None
        rows.guarded(where, task)
    for name, (user, submit) in jobs.items():
        if name not in best:
            rows.skip("no task")
            continue
        _, where, row = best[name]
        rows.guarded(where, lambda: _pai_job(name, user, submit, row))


def _pai_job(name: str, user: str, submit: float | None, row: dict[str, str]) -> TraceJob | str:
    gpu_percent = _number(row, "plan_gpu", required=False) or 0.0
    if gpu_percent == 0:
        return "no GPU"
    run = _run_time(_time(row["start_time"], "start_time"), _time(row["end_time"], "end_time"))
    if isinstance(run, str):
        return run
    if submit is None:
        raise ValueError("the job's start_time (its submission) is empty")
    return TraceJob(
        id=name, submit=submit, duration=run, num_nodes=int(float(row["inst_num"])),
        gpus_per_node=math.ceil(gpu_percent / 100),
        cpu_per_node=(_number(row, "plan_cpu", required=False) or 0.0) / 100,
        memory_per_node=_number(row, "plan_mem", required=False) or 0.0,
        group=user, gpu_type=row["gpu_type"] or None)


# --- Microsoft Philly ----------------------------------------------------------------------------

def _json_array_items(path: Path) -> Iterator[tuple[str, object]]:
    """Items of a top-level JSON array with the line each starts on."""
    text = path.read_text()
    decoder = json.JSONDecoder()
    pos = _skip_ws(text, 0)
    if text[pos:pos + 1] != "[":
        raise TraceError(f"{path.name}:{text.count(chr(10), 0, pos) + 1}: expected a JSON array")
    pos = _skip_ws(text, pos + 1)
    line, counted = 1, 0
    while pos < len(text) and text[pos] != "]":
        line += text.count("\n", counted, pos)
        counted = pos
        where = f"{path.name}:{line}"
        try:
            item, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path.name}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        yield where, item
        pos = _skip_ws(text, end)
        if text[pos:pos + 1] == ",":
            pos = _skip_ws(text, pos + 1)
        elif text[pos:pos + 1] != "]":
            raise TraceError(f"{path.name}:{line + text.count(chr(10), counted, pos)}: expected ',' or ']'")


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _load_philly(rows: _Rows, path: Path) -> None:
    for where, item in _json_array_items(path):
        rows.guarded(where, lambda: _philly_job(item))


def _philly_job(item: object) -> TraceJob | str:
    if not isinstance(item, dict):
        raise ValueError("a job must be a JSON object")
    attempts = item["attempts"]
    if not isinstance(attempts, list):
        raise ValueError("attempts must be a list")
    if not attempts:
        return "never started"
    last = attempts[-1]
    machines = last["detail"]
    if not machines:
        return "never started"
    gpus = max(len(m["gpus"]) for m in machines)
    if gpus == 0:
        return "no GPU"
    run = _run_time(_time(last["start_time"], "start_time"), _time(last["end_time"], "end_time"))
    if isinstance(run, str):
        return run
    submit = _time(item["submitted_time"], "submitted_time")
    if submit is None:
        raise ValueError("submitted_time is empty")
    return TraceJob(id=str(item["jobid"]), submit=submit, duration=run, num_nodes=len(machines),
                    gpus_per_node=gpus, group=str(item.get("vc") or item.get("user") or ""))


# --- SenseTime Helios ----------------------------------------------------------------------------

def _load_helios(rows: _Rows, path: Path) -> None:
    for where, raw in _csv_rows(path, HELIOS_COLUMNS, header_required=True):
        rows.guarded(where, lambda: _helios_job(_checked(raw)))


def _helios_job(row: dict[str, str]) -> TraceJob | str:
    gpus = _number(row, "gpu_num")
    nodes = _number(row, "node_num")
    if gpus == 0:
        return "no GPU"
    if nodes != int(nodes) or nodes < 1:
        raise ValueError(f"node_num must be a positive integer, got {row['node_num']!r}")
    run = _run_time(_time(row["start_time"], "start_time"), _time(row["end_time"], "end_time"))
    if isinstance(run, str):
        return run
    submit = _time(row["submit_time"], "submit_time")
    if submit is None:
        raise ValueError("submit_time is empty")
    n = int(nodes)
    return TraceJob(id=row["job_id"], submit=submit, duration=run, num_nodes=n,
                    gpus_per_node=math.ceil(gpus / n), cpu_per_node=(_number(row, "cpu_num") or 0) / n,
                    group=row["vc"])


# --- plain CSV -----------------------------------------------------------------------------------

def _load_csv(rows: _Rows, path: Path) -> None:
    for where, raw in _csv_rows(path, CSV_COLUMNS, header_required=True):
        rows.guarded(where, lambda: _csv_job(_checked(raw)))


def _csv_job(row: dict[str, str]) -> TraceJob | str:
    nodes, gpus = _number(row, "num_nodes"), _number(row, "gpus_per_node")
    for name, value in (("num_nodes", nodes), ("gpus_per_node", gpus)):
        if value != int(value):
            raise ValueError(f"{name} must be an integer, got {row[name]!r}")
    if nodes < 1:
        raise ValueError("num_nodes must be at least 1")
    if gpus == 0:
        return "no GPU"
    return TraceJob(id=row["job_id"], submit=_number(row, "submit_time"), duration=_number(row, "duration"),
                    num_nodes=int(nodes), gpus_per_node=int(gpus),
                    cpu_per_node=_number(row, "cpu_per_node", required=False) or 0.0,
                    memory_per_node=_number(row, "memory_per_node", required=False) or 0.0,
                    group=row.get("team", ""), gpu_type=row.get("gpu_type") or None,
                    priority_class=row.get("priority_class") or None, kind=_kind(row.get("kind") or TRAINJOB_KIND))


def _kind(value: str) -> str:
    if value not in JOB_KINDS:
        raise ValueError(f"kind must be one of {', '.join(JOB_KINDS)}, got {value!r}")
    return value
