"""Field parity with Kubeflow Trainer v2.3: every field of TrainJob, TrainingRuntime and
ClusterTrainingRuntime in `kubeflow_trainer_api` 2.3.0 (the generated models the kubeflow SDK ships)
has a place in gangctl's CRD schemas, with a compatible type.

Trainer's own types (TrainerV1alpha1*) must be spelled out field by field, recursively. Embedded
types of other APIs (core Kubernetes, JobSet, Volcano) may instead sit under a node that keeps unknown
fields (x-kubernetes-preserve-unknown-fields); where gangctl does spell out a field of them, its type
is checked too.
"""
from __future__ import annotations

import datetime
import types
import typing
from typing import Any

import pytest
from kubeflow_trainer_api import models
from pydantic import BaseModel

from gangctl.api.crds import build_crds

TRAINER_PREFIX = "TrainerV1alpha1"


def _crd_root(kind: str) -> dict[str, Any]:
    crd = next(c for c in build_crds().values() if c["spec"]["names"]["kind"] == kind)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def unwrap(annotation: Any) -> Any:
    """Optional[X] / Annotated[X, ...] -> X."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            assert len(args) == 1, annotation
            annotation = args[0]
        else:
            return annotation


def _preserves(node: dict) -> bool:
    return bool(node.get("x-kubernetes-preserve-unknown-fields"))


def _check_type(annotation: Any, node: dict, path: str, problems: list[str]) -> None:
    """Compare one upstream field type with its CRD schema node; recurse into models, lists and maps."""
    annotation = unwrap(annotation)
    origin = typing.get_origin(annotation)
    if node.get("x-kubernetes-int-or-string"):
        if annotation not in (int, str) and not _is_int_or_string(annotation):
            problems.append(f"{path}: int-or-string in gangctl, {annotation} upstream")
        return
    if _is_int_or_string(annotation):
        problems.append(f"{path}: int-or-string upstream, {node.get('type')} in gangctl")
        return
    kind = node.get("type")
    if origin in (list, typing.List):
        if kind != "array":
            problems.append(f"{path}: a list upstream, {kind} in gangctl")
            return
        _check_type(typing.get_args(annotation)[0], node["items"], f"{path}[]", problems)
    elif origin in (dict, typing.Dict):
        if kind != "object":
            problems.append(f"{path}: a map upstream, {kind} in gangctl")
            return
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            _check_type(typing.get_args(annotation)[1], values, f"{path}{{}}", problems)
        elif not _preserves(node):
            problems.append(f"{path}: a map upstream, an object without additionalProperties in gangctl")
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if kind != "object":
            problems.append(f"{path}: an object upstream, {kind} in gangctl")
            return
        _check_model(annotation, node, path, problems)
    else:
        expected = {bool: "boolean", int: "integer", float: "number", str: "string",
                    datetime.datetime: "string"}.get(annotation)
        if expected is None:  # Dict[str, Any] values, Any
            return
        if kind != expected:
            problems.append(f"{path}: {expected} upstream, {kind} in gangctl")


INT_OR_STRING = {"IoK8sApimachineryPkgUtilIntstrIntOrString", "IoK8sApimachineryPkgApiResourceQuantity"}


def _is_int_or_string(annotation: Any) -> bool:
    """IntOrString and Quantity: an integer or a string on the wire."""
    return isinstance(annotation, type) and annotation.__name__ in INT_OR_STRING


def _check_model(model: type[BaseModel], node: dict, path: str, problems: list[str]) -> None:
    own = model.__name__.startswith(TRAINER_PREFIX)
    properties = node.get("properties") or {}
    for name, info in model.model_fields.items():
        field = info.alias or name
        where = f"{path}.{field}"
        if field in properties:
            _check_type(info.annotation, properties[field], where, problems)
        elif own:
            problems.append(f"{where}: missing (a Trainer field must be in the schema, not only kept as unknown)")
        elif not _preserves(node):
            problems.append(f"{where}: missing, and the API server would prune it")


def _problems(upstream: type[BaseModel], kind: str, parts: tuple[str, ...]) -> list[str]:
    root = _crd_root(kind)
    problems: list[str] = []
    for part in parts:
        annotation = upstream.model_fields[part].annotation
        _check_type(annotation, root["properties"][part], part, problems)
    return problems


@pytest.mark.parametrize(("upstream", "kind", "parts"), [
    (models.TrainerV1alpha1TrainJob, "TrainJob", ("spec", "status")),
    (models.TrainerV1alpha1TrainingRuntime, "TrainingRuntime", ("spec",)),
    (models.TrainerV1alpha1ClusterTrainingRuntime, "ClusterTrainingRuntime", ("spec",)),
])
def test_every_trainer_v2_3_field_is_in_the_crd(upstream: type[BaseModel], kind: str, parts: tuple[str, ...]) -> None:
    assert _problems(upstream, kind, parts) == []


def test_the_walk_reaches_nested_trainer_types_and_sees_a_missing_field() -> None:
    """The check itself: it walks down to the container patches of a runtime patch, and a field
    gangctl lacked there (or a wrong type) would be reported."""
    root = _crd_root("TrainJob")
    spec = root["properties"]["spec"]
    container = (spec["properties"]["runtimePatches"]["items"]["properties"]["trainingRuntimeSpec"]["properties"]
                 ["template"]["properties"]["spec"]["properties"]["replicatedJobs"]["items"]["properties"]["template"]
                 ["properties"]["spec"]["properties"]["template"]["properties"]["spec"]["properties"]["containers"]
                 ["items"])
    del container["properties"]["volumeMounts"]
    spec["properties"]["activeDeadlineSeconds"]["type"] = "string"
    problems: list[str] = []
    _check_type(models.TrainerV1alpha1TrainJob.model_fields["spec"].annotation, spec, "spec", problems)
    assert problems == [
        "spec.activeDeadlineSeconds: integer upstream, string in gangctl",
        "spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[].template.spec.template.spec"
        ".containers[].volumeMounts: missing (a Trainer field must be in the schema, not only kept as unknown)",
    ]
