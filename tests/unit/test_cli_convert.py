"""`gangctl convert`, as a user runs it: a v1 manifest in, TrainJob manifests out that gangctl accepts."""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gangctl.api.trainjob import parse_trainjob
from gangctl.cli import app
from gangctl.model.resolve import resolve

EXAMPLE = Path(__file__).parents[2] / "examples" / "pytorchjob" / "ddp.yaml"


def test_the_example_converts_to_a_trainjob_and_runtime_that_resolve():
    result = CliRunner().invoke(app, ["convert", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    runtime, trainjob = docs
    assert (runtime["kind"], trainjob["kind"]) == ("TrainingRuntime", "TrainJob")
    parse_trainjob(trainjob)
    job = resolve(trainjob, runtime)
    assert job.num_nodes == 4  # Master + 3 Workers: four identical nodes
    assert "# no equivalent:" in result.stderr and "torchrun" in result.stderr


def test_json_output_carries_the_gaps():
    result = CliRunner().invoke(app, ["convert", str(EXAMPLE), "-o", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert [m["kind"] for m in out["manifests"]] == ["TrainingRuntime", "TrainJob"]
    assert out["noEquivalent"] and all(isinstance(g, str) for g in out["noEquivalent"])


def test_a_manifest_v1_would_refuse_is_refused_naming_the_field(tmp_path):
    bad = yaml.safe_load(EXAMPLE.read_text())
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = CliRunner().invoke(app, ["convert", str(path)])
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())
    assert "Master" in said and "replicas" in said


def test_not_a_pytorchjob_says_what_it_is():
    result = CliRunner().invoke(app, ["convert", str(Path(__file__).parents[2] / "examples" / "ddp" / "trainjob.yaml")])
    assert result.exit_code == 1 and "kind: TrainJob" in " ".join(result.stderr.split())  # rich wraps lines
