"""The JobSet fields of a runtime's `template.spec` beyond its replicated jobs, as JobSet applies them.

Kubeflow Trainer hands the runtime's template to JobSet; gangctl runs the same template as Indexed
Jobs (gangctl.plugins.workload), so what JobSet would do with these fields is done here, or the
runtime is refused (the message names the field) where gangctl cannot do it:

- `volumeClaimPolicies`: one PVC per claim template, `<claim>-<trainjob>`, labelled with the JobSet
  name, owned by the TrainJob unless its `retentionPolicy.whenDeleted` is `Retain`; every replicated
  job that mounts a volume of the claim's name gets the volume (Trainer's LLM runtimes share the
  initializers' downloads with the trainer this way).
- `ttlSecondsAfterFinished`: the children go that long after the TrainJob finished; the TrainJob stays.
- `coordinator`: the label and annotation `jobset.sigs.k8s.io/coordinator` with the coordinator
  pod's address, on every child Job and pod.
- `network.publishNotReadyAddresses`: on the headless Service.
- Refused: `network.subdomain` other than the TrainJob's name, `network.enableDNSHostnames: false`
  (torchrun's rendezvous needs the pods' DNS names), `managedBy` (gangctl runs the Jobs itself),
  `startupPolicy` `InOrder` with more than one replicated job (gangctl orders by `dependsOn`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from gangctl.model.names import JOBSET_NAME

COORDINATOR = "jobset.sigs.k8s.io/coordinator"
RETAIN = "Retain"
WHERE = "runtime spec.template.spec"


class Unsupported(ValueError):
    """A JobSet field gangctl cannot honour; the message names it."""


@dataclass(frozen=True)
class Claim:
    """A PVC of the runtime's volumeClaimPolicies, for one TrainJob."""
    name: str        # the claim template's name: the volume name pods mount
    template: dict   # the PersistentVolumeClaim template as the runtime gives it
    retain: bool     # retentionPolicy.whenDeleted: Retain (not deleted with the TrainJob)

    def claim_name(self, trainjob: str) -> str:
        return f"{self.name}-{trainjob}"

    def object(self, trainjob: str, namespace: str, owner: dict) -> dict:
        meta = self.template.get("metadata") or {}
        metadata: dict = {"name": self.claim_name(trainjob), "namespace": namespace,
                          "labels": {**(meta.get("labels") or {}), JOBSET_NAME: trainjob}}
        if meta.get("annotations"):
            metadata["annotations"] = dict(meta["annotations"])
        if not self.retain:
            metadata["ownerReferences"] = [owner]
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
                "spec": copy.deepcopy(self.template.get("spec") or {})}


def check(spec: dict, trainjob: str) -> None:
    """Refuse what gangctl cannot run as JobSet would (Unsupported names the field)."""
    network = spec.get("network") or {}
    if network.get("subdomain") not in (None, "", trainjob):
        raise Unsupported(f"{WHERE}.network.subdomain: gangctl names the headless Service after the TrainJob "
                          f"({trainjob!r}); remove subdomain ({network['subdomain']!r}) from the runtime")
    if network.get("enableDNSHostnames") is False:
        raise Unsupported(f"{WHERE}.network.enableDNSHostnames: false is not supported: torchrun's rendezvous "
                          "reaches rank 0 by its DNS name; remove the field or set it to true")
    if spec.get("managedBy"):
        raise Unsupported(f"{WHERE}.managedBy: gangctl runs the child Jobs itself and cannot hand them to "
                          f"{spec['managedBy']!r}; remove the field (set the TrainJob's spec.managedBy instead)")
    jobs = spec.get("replicatedJobs") or []
    if (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder" and len(jobs) > 1:
        raise Unsupported(f"{WHERE}.startupPolicy.startupPolicyOrder: InOrder is not supported with more than one "
                          "replicated job; order them with dependsOn")


def claims(spec: dict) -> tuple[Claim, ...]:
    out = []
    for policy in spec.get("volumeClaimPolicies") or []:
        retain = ((policy.get("retentionPolicy") or {}).get("whenDeleted") or "Delete") == RETAIN
        for template in policy.get("templates") or []:
            out.append(Claim(((template.get("metadata") or {}).get("name") or ""), template, retain))
    return tuple(out)


def mount_claims(pod_template: dict, all_claims: tuple[Claim, ...], trainjob: str, where: str) -> tuple[Claim, ...]:
    """Give `pod_template` the volume of each claim one of its containers mounts, as JobSet does;
    returns the claims it mounts. A volume of the claim's name already there is refused (JobSet
    refuses it too)."""
    spec = pod_template.setdefault("spec", {})
    mounted = {m.get("name") for key in ("containers", "initContainers") for c in spec.get(key) or []
               for m in c.get("volumeMounts") or [] if isinstance(m, dict)}
    volumes = spec.get("volumes") or []
    used = []
    for claim in all_claims:
        if claim.name not in mounted:
            continue
        if any(v.get("name") == claim.name for v in volumes):
            raise Unsupported(f"{where}.spec.volumes: a volume named {claim.name!r} is also a claim of "
                              f"{WHERE}.volumeClaimPolicies; remove one of them")
        volumes.append({"name": claim.name, "persistentVolumeClaim": {"claimName": claim.claim_name(trainjob)}})
        used.append(claim)
    if used:
        spec["volumes"] = volumes
    return tuple(used)


def coordinator(spec: dict, trainjob: str) -> str | None:
    """The coordinator pod's address, as JobSet writes it (`<jobset>-<job>-<jobIndex>-<podIndex>.<subdomain>`)."""
    c = spec.get("coordinator")
    if not c:
        return None
    return f"{trainjob}-{c.get('replicatedJob')}-{int(c.get('jobIndex') or 0)}-{int(c.get('podIndex') or 0)}.{trainjob}"


def template_spec(runtime: dict | None) -> dict:
    """A runtime's JobSet spec (`spec.template.spec`); empty without a runtime."""
    return (((runtime or {}).get("spec") or {}).get("template") or {}).get("spec") or {}


def ttl_after_finished(runtime: dict | None) -> int | None:
    ttl = template_spec(runtime).get("ttlSecondsAfterFinished")
    return int(ttl) if ttl is not None else None
