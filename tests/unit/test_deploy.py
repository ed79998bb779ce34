"""deploy/ (kustomize) and deploy/helm/gangctl: what an admin installs, checked without a cluster.

- The RBAC is derived from gangctl's own source: every API call of the modules the controller runs
  (the import graph from gangctl.runtime.controller), resolved to (resource, verb), and every informer
  the Controller builds. A call without a rule fails this test, and so does a rule without a call.
- Restricted Pod Security fields, probes, replicas, PDB, no wildcard, no Secret but gangctl's own.
- The local overlay's pod is one the node agent can run (gangctl.nodeagent.spec.process_specs).
- Alerts and the dashboard name metrics gangctl exports (gangctl.obs.metrics).
- The Helm chart with default values renders the kustomize objects (and its monitoring / process
  node values render the two overlays), built with the pinned helm (integrations/helm).
"""
from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gangctl.api import pytorchjob as pytorchjob_api
from gangctl.api.resources import PYTORCHJOBS, TRAINJOBS, Resource

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "gangctl"
SYSTEM_NS = "gangctl-system"
SA = ("gangctl-system", "gangctl")
CLUSTER = "*cluster*"  # the scope of a ClusterRoleBinding's grants


def kustomize(path: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return kustomize(DEPLOY)


@pytest.fixture(scope="module")
def variants(base) -> dict[str, list[dict]]:
    return {"deploy": base, "local": kustomize(DEPLOY / "overlays/local"),
            "monitoring": kustomize(DEPLOY / "overlays/monitoring"),
            "lost-pod-reaper": kustomize(DEPLOY / "overlays/lost-pod-reaper"),
            "network-policy": kustomize(DEPLOY / "overlays/network-policy")}


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict], kind: str, name: str) -> dict:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


# --- what gangctl's controller calls, from its source ----------------------------------------------

# Kube's methods and the verbs each asks the API server for (gangctl/kube/client.py). A method not
# listed here fails the derivation: teach this table its verbs.
KUBE_VERBS = {
    "get": {"get"}, "text": {"get"}, "create": {"create"}, "delete": {"delete"},
    "merge_patch": {"patch"}, "json_patch": {"patch"},
    "remove_finalizer": {"patch", "get"},  # a JSON patch; re-reads the object when its copy was stale
    "list_pages": {"list"}, "watch": {"watch"},
    # server-side apply is a PATCH; on an object (not a subresource) it may create it, which the
    # API server authorizes as create
    "apply": {"patch"},
}
HTTP_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}

# Resources the controller touches only in its own namespace, which the Deployment names: the
# leader election Lease (--leader-elect-namespace gangctl-system, checked in
# test_deployment_is_restricted_replicated_and_probed). Every other write may be in any namespace.
OWN_NAMESPACE = {("coordination.k8s.io", "leases"), ("", "secrets")}
# What Kubernetes' built-in system:basic-user role lets every authenticated user do: ask what it may do
# itself (gangctl asks before it watches a gang backend).
EVERY_USER = {("authorization.k8s.io", "selfsubjectaccessreviews")}
# The one Secret gangctl reads and updates: the progress endpoint's CA and certificate, which it makes
# itself (create cannot be narrowed to a name; get and update are).
OWN_SECRET = "gangctl-trainer-status-tls"


def module_file(name: str) -> Path | None:
    path = ROOT / (name.replace(".", "/") + ".py")
    return path if path.exists() else None


def controller_modules() -> list[str]:
    """gangctl modules the controller process runs: the import graph from gangctl.runtime.controller and
    from the body of `gangctl controller` (cli.py imports lazily, per command)."""
    cli = ast.parse((ROOT / "gangctl/cli.py").read_text())
    roots = ["gangctl.runtime.controller"]
    for node in ast.walk(cli):
        if isinstance(node, ast.FunctionDef) and node.name == "controller":
            roots += [n.module for n in ast.walk(node) if isinstance(n, ast.ImportFrom) and n.module
                      and n.module.startswith("gangctl")]
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or module_file(name) is None:
            continue
        seen.add(name)
        for node in ast.walk(ast.parse(module_file(name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gangctl"):
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names]  # `from gangctl.plugins import base`
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("gangctl")]
    return sorted(seen)


# The pure deciders whose Plans the reconcilers' writers carry out.
PLANNERS = ("gangctl.policy.decide", "gangctl.policy.decide_pytorchjob")


class Unresolved(Exception):
    pass


class InformerCall(Exception):
    """The informer's own list/watch: its resources come from the informers the Controller builds."""


def parse_path(text: str) -> list[tuple[str, str, str | None]] | str:
    """(group, plural, subresource) of an API path ('{}' for the variable parts); 'discovery' for
    /api/<v> and /apis/<group>/<version>."""
    parts = text.split("?")[0].strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        raise Unresolved(text)
    if not rest:
        return "discovery"
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    if "{}" in rest[0]:
        raise Unresolved(text)
    return [(group, rest[0], rest[2] if len(rest) >= 3 else None)]


def _template(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in expr.values)
    return None


def _backend_resources(attr: str) -> list[tuple[str, str]]:
    from gangctl.plugins.registry import BACKENDS
    return [(r.group, r.plural) for b in BACKENDS.values() if (r := getattr(b, attr, None)) is not None]


def _kind_resources() -> list[tuple[str, str]]:
    """The resources of the job kinds the reconciler serves (gangctl.runtime.kinds)."""
    from gangctl.runtime.kinds import JobKind
    return [(k.resource.group, k.resource.plural) for k in JobKind.__subclasses__()]


class CallScanner:
    """Resolves the path argument of each `kube.<method>(...)` call in one module to resources."""

    def __init__(self, name: str):
        self.name = name
        self.module = importlib.import_module(name)
        self.tree = ast.parse(module_file(name).read_text())
        for node in ast.walk(self.tree):  # innermost function last, so it wins
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for child in ast.walk(node):
                    child.parent_function = node  # type: ignore[attr-defined]

    def calls(self):
        """(function, lineno, method, path expression, HTTP method or None) of each kube call."""
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            target = node.func.value
            is_kube = (isinstance(target, ast.Name) and target.id == "kube") or \
                      (isinstance(target, ast.Attribute) and target.attr == "kube")
            if not is_kube or node.func.attr.startswith("_") or node.func.attr in ("set_rate_limit", "close", "session"):
                continue
            fn = getattr(node, "parent_function", None)
            if node.func.attr == "request":
                method = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
                yield fn, node.lineno, "request", node.args[1], method
            elif node.args:
                yield fn, node.lineno, node.func.attr, node.args[0], None

    def resolve(self, expr: ast.expr, fn, depth: int = 0) -> list[tuple[str, str, str | None]] | str:
        """(group, plural, subresource) a path expression names; 'discovery' for discovery paths."""
        if depth > 6:
            raise Unresolved("too deep")
        template = _template(expr)
        if template is not None:
            return parse_path(template)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "path":
            sub = None
            if len(expr.args) >= 3 and isinstance(expr.args[2], ast.Constant):
                sub = expr.args[2].value
            for kw in expr.keywords:
                if kw.arg == "sub" and isinstance(kw.value, ast.Constant):
                    sub = kw.value.value
            return [(g, p, sub) for g, p in self.resources_of(expr.func.value, fn, depth)]
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Call) and \
                isinstance(expr.value.func, ast.Attribute) and expr.value.func.attr == "rsplit":
            inner = self.resolve(expr.value.func.value, fn, depth + 1)  # the collection of an object path
            return inner if isinstance(inner, str) else [(g, p, None) for g, p, _ in inner]
        found = self._definition(expr, fn, depth)
        return [x for value, where in found for x in self.resolve(value, where, depth + 1)]

    def resources_of(self, expr: ast.expr, fn, depth: int) -> list[tuple[str, str]]:
        """(group, plural) of an expression that evaluates to a Resource."""
        if depth > 6:
            raise Unresolved("too deep")
        if ast.unparse(expr) == "self.resource" and self.name == "gangctl.kube.informer":
            raise InformerCall()
        if isinstance(expr, ast.Attribute) and expr.attr in ("group_resource", "watch"):
            return _backend_resources(expr.attr)
        if isinstance(expr, ast.Attribute) and expr.attr == "resource" and \
                ast.unparse(expr.value).split("[")[0] in ("kind", "self.sources"):
            return _kind_resources()   # a JobKind's, or the quota gate's cache of a kind
        if (planned := self._planned(expr, fn, depth)) is not None:
            return planned
        if isinstance(expr, ast.Name):
            value = getattr(self.module, expr.id, None)
            if isinstance(value, Resource):
                return [(value.group, value.plural)]
        found = self._definition(expr, fn, depth)
        return [x for value, where in found for x in self.resources_of(value, where, depth + 1)]

    def _planned(self, expr: ast.expr, fn, depth: int) -> list[tuple[str, str]] | None:
        """`step.resource` where `step: d.<Kind>` is a step of gangctl.policy.decide's Plan: the
        resources the deciders (TrainJob's and PyTorchJob's) build that kind of step with (the first
        argument of each `<Kind>(...)`)."""
        if not (isinstance(expr, ast.Attribute) and expr.attr == "resource" and isinstance(expr.value, ast.Name)
                and fn is not None):
            return None
        arg = next((a for a in fn.args.args if a.arg == expr.value.id), None)
        annotations = [arg.annotation] if arg is not None else []
        while annotations and isinstance(annotations[0], ast.BinOp):  # d.Apply | d.Create
            annotations = [annotations[0].left, annotations[0].right, *annotations[1:]]
        if not annotations or not all(isinstance(a, ast.Attribute) for a in annotations):
            return None
        kinds = [a.attr for a in annotations]  # type: ignore[attr-defined]
        if not all(isinstance(getattr(importlib.import_module("gangctl.policy.decide"), k, None), type) for k in kinds):
            return None
        out = []
        for planner in map(CallScanner, PLANNERS):
            for node in ast.walk(planner.tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in kinds:
                    first = node.args[0] if node.args else next(k.value for k in node.keywords if k.arg == "resource")
                    out += planner.resources_of(first, getattr(node, "parent_function", None), depth + 1)
        if not out:
            raise Unresolved(f"no {' or '.join(kinds)}(...) in gangctl.policy.decide")
        return out

    def _definition(self, expr: ast.expr, fn, depth: int) -> list[tuple[ast.expr, object]]:
        """Where a local name, a parameter (its callers' arguments) or a `self.x` attribute gets its value."""
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
            out = [(node.value, getattr(node, "parent_function", None)) for node in ast.walk(self.tree)
                   if isinstance(node, ast.Assign) and any(ast.unparse(t) == ast.unparse(expr) for t in node.targets)]
            if out:
                return out
        if isinstance(expr, ast.Name) and fn is not None:
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets):
                    return [(node.value, fn)]
            params = [a.arg for a in fn.args.args]
            if expr.id in params:
                return self._callers(fn, params.index(expr.id), expr.id)
        raise Unresolved(ast.unparse(expr))

    def _callers(self, fn, index: int, name: str) -> list[tuple[ast.expr, object]]:
        out = []
        offset = 1 if fn.args.args and fn.args.args[0].arg == "self" else 0
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == fn.name:
                pos = index - offset
                arg = node.args[pos] if len(node.args) > pos else next((k.value for k in node.keywords if k.arg == name), None)
                if arg is None:
                    raise Unresolved(f"{fn.name}() called without {name}")
                out.append((arg, getattr(node, "parent_function", None)))
        if not out:
            raise Unresolved(f"no caller of {fn.name}() in {self.name}")
        return out


def informer_permissions(reaper: bool) -> set[tuple[str, str, str, str]]:
    """list+watch for every informer of a Controller built with every backend (and the lost-pod reaper
    when `reaper`), in its namespace scope."""
    from kubernetes_asyncio.client import Configuration

    from gangctl.config import ControllerSettings
    from gangctl.kube.client import Kube
    from gangctl.runtime.controller import Controller

    async def build():
        conf = Configuration()
        conf.host = "https://127.0.0.1:9"  # never contacted: only the informers' resources are read
        kube = Kube(conf)
        try:
            settings = ControllerSettings(lost_pod_seconds=60 if reaper else None)
            return [(inf.resource, inf.namespace) for inf in Controller(kube, settings).informers()]
        finally:
            await kube.close()

    import asyncio
    out = set()
    for resource, namespace in asyncio.run(build()):
        for verb in ("list", "watch"):
            out.add((namespace or CLUSTER, resource.group, resource.plural, verb))
    return out


# The opt-in lost-pod reaper's module: its calls are granted by deploy/components/lost-pod-reaper only.
REAPER = "gangctl.runtime.lost_pods"


def derived_permissions(reaper: bool = False) -> tuple[set[tuple[str, str, str, str]], list[str]]:
    """(scope, group, resource[/sub], verb) the controller needs (with the lost-pod reaper on, when
    `reaper`), and the calls that could not be resolved."""
    from gangctl.kube.client import Kube

    needed = informer_permissions(reaper)
    problems = []
    known = {name for name, _ in inspect.getmembers(Kube, inspect.iscoroutinefunction) if not name.startswith("_")}
    for name in controller_modules():
        if name == "gangctl.kube.client" or (name == REAPER and not reaper):  # the client: see KUBE_VERBS
            continue
        scanner = CallScanner(name)
        for fn, line, method, expr, http in scanner.calls():
            where = f"{name}:{line} kube.{method}({ast.unparse(expr)})"
            if method == "request":
                if http not in HTTP_VERBS:
                    problems.append(f"{where}: HTTP method not a literal")
                    continue
                verbs = {HTTP_VERBS[http]}
            elif method in KUBE_VERBS:
                verbs = set(KUBE_VERBS[method])
            else:
                problems.append(f"{where}: Kube.{method} has no verbs in KUBE_VERBS" if method in known
                                else f"{where}: not a Kube method")
                continue
            try:
                resolved = scanner.resolve(expr, fn)
            except InformerCall:
                continue
            except Unresolved as exc:
                problems.append(f"{where}: cannot tell which resource ({exc}); build the path from a "
                                "Resource constant, or teach tests/unit/test_deploy.py")
                continue
            if resolved == "discovery":
                continue  # GET /apis/<group>/<version>: system:discovery grants it to every authenticated user
            for group, plural, sub in resolved:
                if (group, plural) in EVERY_USER:
                    continue
                scope = SYSTEM_NS if (group, plural) in OWN_NAMESPACE else CLUSTER
                call_verbs = verbs | ({"create"} if method == "apply" and not sub else set())
                for verb in call_verbs:
                    needed.add((scope, group, plural + (f"/{sub}" if sub else ""), verb))
    # Children carry an ownerReference to their TrainJob with blockOwnerDeletion: where the
    # OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift, hardened clusters),
    # setting it needs update on the owner's finalizers subresource.
    for name in controller_modules():
        tree = ast.parse(module_file(name).read_text())
        if any(isinstance(n, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "blockOwnerDeletion"
                                               and isinstance(v, ast.Constant) and v.value is True
                                               for k, v in zip(n.keys, n.values)) for n in ast.walk(tree)):
            needed.add((CLUSTER, TRAINJOBS.group, TRAINJOBS.plural + "/finalizers", "update"))
    if "gangctl.policy.decide_pytorchjob" in controller_modules():  # PyTorchJobs own their children too
        needed.add((CLUSTER, PYTORCHJOBS.group, PYTORCHJOBS.plural + "/finalizers", "update"))
    return needed, problems


def granted_permissions(docs: list[dict]) -> set[tuple[str, str, str, str]]:
    """(scope, group, resource, verb) the bindings in `docs` give gangctl's ServiceAccount."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and (s.get("namespace"), s["name"]) == SA
                   for s in binding.get("subjects") or []):
            continue
        ns = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])]
        scope = CLUSTER if binding["kind"] == "ClusterRoleBinding" else ns
        for rule in role.get("rules") or []:
            if rule.get("resourceNames"):  # the derivation models names only for gangctl's own Secret
                assert rule.get("resources") == ["secrets"] and rule["resourceNames"] == [OWN_SECRET], rule
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule["verbs"]:
                        out.add((scope, group, resource, verb))
    return out


def covered(need: tuple[str, str, str, str], grants: set) -> bool:
    scope, group, resource, verb = need
    return need in grants or (CLUSTER, group, resource, verb) in grants


def test_derivation_resolves_every_call():
    needed, problems = derived_permissions()
    assert not problems, "API calls the RBAC derivation cannot resolve:\n" + "\n".join(problems)
    # sanity: the derivation sees the calls it must (a scanner that finds nothing would pass the rest)
    for need in [(CLUSTER, "trainer.kubeflow.org", "trainjobs/status", "patch"), (CLUSTER, "batch", "jobs", "create"),
                 (CLUSTER, "", "events", "create"), (CLUSTER, "scheduling.volcano.sh", "podgroups", "delete"),
                 (SYSTEM_NS, "", "configmaps", "watch"), (CLUSTER, "kueue.x-k8s.io", "workloads", "list")]:
        assert need in needed, need


# The base grants what the controller calls with the reaper off (its default); the reaper's overlay
# adds exactly what the reaper calls.
RBAC_VARIANTS = [("deploy", False), ("lost-pod-reaper", True)]


@pytest.mark.parametrize("variant,reaper", RBAC_VARIANTS)
def test_rbac_covers_every_call_the_controller_makes(variants, variant, reaper):
    needed, _ = derived_permissions(reaper)
    grants = granted_permissions(variants[variant])
    missing = sorted(n for n in needed if not covered(n, grants))
    assert not missing, "the controller calls these but deploy/ does not grant them:\n" + "\n".join(map(str, missing))


@pytest.mark.parametrize("variant,reaper", RBAC_VARIANTS)
def test_rbac_grants_nothing_the_controller_does_not_call(variants, variant, reaper):
    needed, _ = derived_permissions(reaper)
    extra = sorted(g for g in granted_permissions(variants[variant]) if g not in needed)
    assert not extra, ("deploy/ grants these but no code calls them (least privilege; a namespaced need "
                       "granted cluster-wide counts too):\n" + "\n".join(map(str, extra)))


def test_no_wildcards_no_secrets_anywhere(variants):
    for variant, docs in variants.items():
        for role in find(docs, "Role") + find(docs, "ClusterRole"):
            assert "aggregationRule" not in role, role["metadata"]["name"]
            for rule in role.get("rules") or []:
                for field in ("apiGroups", "resources", "verbs", "nonResourceURLs", "resourceNames"):
                    assert not any("*" in v for v in rule.get(field) or []), (variant, role["metadata"]["name"], rule)
                # Secrets: only gangctl's own, in its namespace (no list/watch: it never sees another)
                if any(r.split("/")[0] == "secrets" for r in rule.get("resources") or []):
                    assert role["kind"] == "Role" and role["metadata"]["namespace"] == SYSTEM_NS, (variant, rule)
                    assert rule["resources"] == ["secrets"] and (
                        rule["verbs"] == ["create"] or (rule.get("resourceNames") == [OWN_SECRET]
                                                        and set(rule["verbs"]) <= {"get", "update"})), (variant, rule)
                # nothing that escalates: bind/escalate/impersonate, or writes to RBAC
                assert not {"bind", "escalate", "impersonate"} & set(rule["verbs"]), rule
                assert "rbac.authorization.k8s.io" not in (rule.get("apiGroups") or []), rule


def test_bindings_name_roles_that_exist(variants):
    for variant, docs in variants.items():
        for binding in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding"):
            ref = binding["roleRef"]
            ns = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
            assert [r for r in find(docs, ref["kind"], ref["name"]) if r["metadata"].get("namespace") == ns], \
                (variant, binding["metadata"]["name"])


# --- the Deployment ---------------------------------------------------------------------------------

EXPECTED_ARGS = ["controller", "--leader-elect", "--leader-elect-namespace", SYSTEM_NS,
                 "--metrics-bind-address", "0.0.0.0:8080", "--metrics-auth",
                 "--trainer-status-url", f"https://gangctl-controller.{SYSTEM_NS}.svc:8443",
                 "--trainer-status-bind-address", "0.0.0.0:8443"]


def _port(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


def test_deployment_is_restricted_replicated_and_probed(variants):
    for variant, docs in variants.items():
        dep = one(docs, "Deployment", "gangctl-controller")
        assert dep["metadata"]["namespace"] == SYSTEM_NS
        assert dep["spec"]["replicas"] == 2, variant
        pod = dep["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "gangctl"
        assert not pod.get("automountServiceAccountToken") is False  # the controller needs its token
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(key), key
        assert not pod.get("initContainers")
        psc = pod.get("securityContext") or {}
        assert psc.get("runAsNonRoot") is True and psc.get("runAsUser", 1) != 0
        for c in pod["containers"]:
            sc = c.get("securityContext") or {}
            assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, c["name"]
            assert sc.get("readOnlyRootFilesystem") is True, c["name"]
            assert sc.get("allowPrivilegeEscalation") is False, c["name"]
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
            assert not sc.get("capabilities", {}).get("add"), c["name"]
            assert not sc.get("privileged"), c["name"]
            seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
            assert seccomp == "RuntimeDefault", c["name"]
            res = c.get("resources") or {}
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(res.get(kind) or {}), (c["name"], kind)
            assert c["args"] == EXPECTED_ARGS, (variant, c["args"])
            live, ready = c["livenessProbe"]["httpGet"], c["readinessProbe"]["httpGet"]
            assert (live["path"], _port(c, live["port"])) == ("/healthz", 8080)
            assert (ready["path"], _port(c, ready["port"])) == ("/readyz", 8080)
            env = {e["name"]: e for e in c.get("env") or []}
            assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
            assert not c.get("envFrom")
            assert not any("secretKeyRef" in (e.get("valueFrom") or {}) for e in env.values())
        assert not any("secret" in v for v in pod.get("volumes") or [])


def test_pdb_and_metrics_service_select_the_controller_pods(base):
    dep = one(base, "Deployment", "gangctl-controller")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    pdb = one(base, "PodDisruptionBudget", "gangctl-controller")
    assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    svc = one(base, "Service", "gangctl-controller-metrics")
    assert svc["spec"]["selector"].items() <= labels.items()
    container = dep["spec"]["template"]["spec"]["containers"][0]
    (port,) = svc["spec"]["ports"]
    assert _port(container, port["targetPort"]) == 8080


def test_namespace_enforces_the_restricted_profile(base):
    ns = one(base, "Namespace", SYSTEM_NS)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_kubeflow_sdk_version_configmap(base):
    """Where the kubeflow SDK reads the control plane's version, and the Trainer API gangctl serves
    (the version of kubeflow_trainer_api, the generated models of that API the SDK ships)."""
    source = (Path(importlib.import_module("kubeflow.trainer.backends.kubernetes.backend").__file__)).read_text()
    assert '"kubeflow-trainer-public"' in source and '"kubeflow_trainer_version"' in source
    assert '"KUBEFLOW_SYSTEM_NAMESPACE", "kubeflow-system"' in source
    cm = one(base, "ConfigMap", "kubeflow-trainer-public")
    assert cm["metadata"]["namespace"] == "kubeflow-system"
    assert cm["data"]["kubeflow_trainer_version"] == "v" + importlib.metadata.version("kubeflow_trainer_api")
    assert find(base, "Namespace", "kubeflow-system")


def test_crds_and_runtimes_are_the_generated_ones(base):
    from gangctl.api.crds import build_crds

    check = subprocess.run([sys.executable, "-m", "gangctl.api.crds", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    crds = {d["metadata"]["name"]: d for d in find(base, "CustomResourceDefinition")}
    generated = {crd["metadata"]["name"]: crd for crd in build_crds().values()}
    # PyTorchJob's CRD is generated from Training Operator's module (tests/unit/test_pytorchjob.py checks it)
    pytorchjob = yaml.safe_load((DEPLOY / "crds" / pytorchjob_api.CRD_FILE).read_text())
    generated[pytorchjob["metadata"]["name"]] = pytorchjob
    assert crds == generated
    shipped = {p.name for p in (DEPLOY / "runtimes").glob("*.yaml")}
    assert {d["metadata"]["name"] + ".yaml" for d in find(base, "ClusterTrainingRuntime")} == shipped


def test_base_installs_without_prometheus_operator(base):
    assert not [d for d in base if d["apiVersion"].startswith("monitoring.coreos.com/")]


# --- the local overlay: the pod must be one a process node runs -------------------------------------

def test_local_overlay_runs_on_process_nodes(variants):
    from gangctl.nodeagent.spec import PROCESS_NODE_LABEL, PROCESS_NODE_TAINT, process_specs

    dep = one(variants["local"], "Deployment", "gangctl-controller")
    spec = dep["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {PROCESS_NODE_LABEL: "true"}
    assert any(t.get("key") == PROCESS_NODE_TAINT["key"] and t.get("effect") == PROCESS_NODE_TAINT["effect"]
               and (t.get("operator") == "Exists" or t.get("value") == PROCESS_NODE_TAINT["value"])
               for t in spec["tolerations"])
    pod = {"metadata": {"name": "gangctl-controller-abc", "namespace": SYSTEM_NS, "labels": {}},
           "spec": {**spec, "nodeName": "node-0"}}
    (proc,) = process_specs(pod, pod_ip="10.244.1.5", host_ip="127.0.0.1", allocatable={"cpu": "2", "memory": "4Gi"},
                            base_env={"PATH": "/venv/bin:/usr/bin"})
    assert proc.argv == ["gangctl", *EXPECTED_ARGS]
    assert proc.env["POD_NAME"] == "gangctl-controller-abc" and proc.env["POD_NAMESPACE"] == SYSTEM_NS
    # the rest is the same install
    strip = lambda docs: [d for d in docs if d["kind"] != "Deployment"]  # noqa: E731
    assert strip(variants["local"]) == strip(variants["deploy"])


# --- monitoring -------------------------------------------------------------------------------------

def exported_metric_names() -> set[str]:
    from prometheus_client import CollectorRegistry

    from gangctl.obs.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    names = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}
    for family in registry.collect():  # a labelled metric with no children yet has no samples
        names |= {s.name for s in family.samples} | {family.name}
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ())}
    return names


def test_alerts_and_dashboard_use_exported_metrics(variants):
    docs = variants["monitoring"]
    exported = exported_metric_names()
    rule = one(docs, "PrometheusRule", "gangctl")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"GangctlControllerDown", "GangctlReconcileErrorsRising", "GangctlGangsWaitingTooLong",
            "GangctlQuotaPolicyInvalid"} <= set(alerts)
    svc = one(docs, "Service", "gangctl-controller-metrics")
    for alert in alerts.values():
        used = set(re.findall(r"\b(gangctl_[a-z_]+)", alert["expr"]))
        assert used <= exported, (alert["alert"], used - exported)
        for job in re.findall(r'job="([^"]+)"', alert["expr"]):
            assert job == svc["metadata"]["name"], alert["alert"]  # prometheus-operator's job label
        assert alert["labels"]["severity"] in ("critical", "warning")
    dashboard = one(docs, "ConfigMap", "gangctl-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboard["data"].values()
    exprs = [t["expr"] for p in json.loads(text)["panels"] for t in p["targets"]]
    used = set(re.findall(r"\b(gangctl_[a-z_]+)", " ".join(exprs)))
    assert used and used <= exported, used - exported
    # ... and the label values they select exist: a phase the metrics never export shows 0 for ever.
    from gangctl.obs.metrics import PHASES
    rules = " ".join(r["expr"] for r in alerts.values())
    phases = {v for sel in re.findall(r'phase=~?"([^"]+)"', " ".join(exprs) + " " + rules) for v in sel.split("|")}
    assert phases and phases <= set(PHASES), phases - set(PHASES)
    monitor = one(docs, "ServiceMonitor", "gangctl-controller")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    reader = one(docs, "ClusterRoleBinding", "gangctl-metrics-reader")
    assert one(docs, "ClusterRole", reader["roleRef"]["name"])["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


# --- the NetworkPolicy overlay -----------------------------------------------------------------------

def test_network_policy_admits_only_prometheus_to_metrics_and_only_pods_to_the_progress_endpoint(variants):
    docs = variants["network-policy"]
    assert not find(variants["deploy"], "NetworkPolicy"), "optional: not in deploy/"
    policy = one(docs, "NetworkPolicy", "gangctl-controller")
    dep = one(docs, "Deployment", "gangctl-controller")
    assert policy["metadata"]["namespace"] == dep["metadata"]["namespace"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress stays open: the controller calls the API server"
    container = dep["spec"]["template"]["spec"]["containers"][0]
    rules = {_port(container, p["port"]): r["from"] for r in policy["spec"]["ingress"] for p in r["ports"]}
    assert rules.keys() == {p["containerPort"] for p in container["ports"]} == {8080, 8443}
    # the probes' port: the kubelet probes from the pod's own node, which NetworkPolicy always admits
    assert _port(container, container["readinessProbe"]["httpGet"]["port"]) == 8080
    (prometheus,) = rules[8080]
    assert prometheus["podSelector"]["matchLabels"] and prometheus["namespaceSelector"]["matchLabels"], \
        "only Prometheus's pods, not every pod of a namespace"
    assert "ipBlock" not in prometheus
    assert rules[8443] == [{"namespaceSelector": {}}], "pods of any namespace; no ipBlock: nothing from outside"
    strip = lambda docs: [d for d in docs if d["kind"] != "NetworkPolicy"]  # noqa: E731
    assert strip(docs) == variants["deploy"], "the rest is the same install"


# --- Helm -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def helm() -> Path:
    """The pinned helm (integrations/helm), built on first use (a few minutes, cached after)."""
    from gangctl.cluster.build import ensure_tool
    from gangctl.config import ClusterSettings

    settings = ClusterSettings()
    return ensure_tool("helm", settings.integrations_dir, settings.bin_root,
                       lambda what, done, total, line: line == "built" and print(f"built {what}"))


def helm_template(helm: Path, *sets: str, namespace: str = SYSTEM_NS) -> subprocess.CompletedProcess:
    cmd = [str(helm), "template", "gangctl", str(CHART), "--namespace", namespace, "--include-crds"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True)


HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")


def normalise(docs: list[dict]) -> dict[tuple, dict]:
    """Objects by (apiVersion, kind, namespace, name), without Helm's bookkeeping labels/annotations."""
    out = {}
    for d in docs:
        d = json.loads(json.dumps(d))
        meta = d["metadata"]
        for label in HELM_LABELS:
            (meta.get("labels") or {}).pop(label, None)
        (meta.get("annotations") or {}).pop("helm.sh/resource-policy", None)
        for key in ("labels", "annotations"):
            if key in meta and not meta[key]:
                del meta[key]
        out[(d["apiVersion"], d["kind"], meta.get("namespace"), meta["name"])] = d
    return out


@pytest.mark.parametrize("variant,sets", [("deploy", ()), ("monitoring", ("monitoring.enabled=true",)),
                                          ("local", ("processNodes.enabled=true",)),
                                          ("lost-pod-reaper", ("lostPodReaper.enabled=true",)),
                                          ("network-policy", ("networkPolicy.enabled=true",))])
def test_helm_chart_renders_the_kustomize_objects(helm, variants, variant, sets):
    result = helm_template(helm, *sets)
    assert result.returncode == 0, result.stderr
    rendered = normalise([d for d in yaml.safe_load_all(result.stdout) if d])
    # `helm install -n gangctl-system --create-namespace` makes the release's namespace
    expected = normalise([d for d in variants[variant] if not (d["kind"] == "Namespace" and d["metadata"]["name"] == SYSTEM_NS)])
    assert sorted(rendered) == sorted(expected)
    for key in expected:
        assert rendered[key] == expected[key], key


def test_helm_values_change_what_they_say(helm):
    docs = [d for d in yaml.safe_load_all(helm_template(
        helm, "image.repository=registry.example/gangctl", "image.tag=1.2.3", "replicas=3",
        "metrics.auth=false", "backends.volcano.enabled=false", "backends.kueue.enabled=false").stdout) if d]
    dep = one(docs, "Deployment", "gangctl-controller")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/gangctl:1.2.3" and dep["spec"]["replicas"] == 3
    assert "--metrics-auth" not in container["args"] and not find(docs, "ClusterRole", "gangctl-metrics-auth")
    groups = {g for r in one(docs, "ClusterRole", "gangctl-controller")["rules"] for g in r["apiGroups"]}
    assert "scheduling.volcano.sh" not in groups and "kueue.x-k8s.io" not in groups
    assert "scheduling.x-k8s.io" in groups


def test_helm_refuses_an_unsafe_install(helm):
    wrong_ns = helm_template(helm, namespace="default")
    assert wrong_ns.returncode != 0 and "gangctl-system" in wrong_ns.stderr
    no_election = helm_template(helm, "leaderElection.enabled=false")
    assert no_election.returncode != 0 and "leaderElection" in no_election.stderr
    single = helm_template(helm, "leaderElection.enabled=false", "replicas=1")
    assert single.returncode == 0, single.stderr


def test_the_lost_pod_reaper_alone_needs_pod_status(base, variants):
    off, _ = derived_permissions(reaper=False)
    on, _ = derived_permissions(reaper=True)
    # The Node informer is the base's (the default restart mode reads it), and so is listing Nodes.
    assert (CLUSTER, "", "nodes", "watch") in off and (CLUSTER, "", "nodes", "list") in off
    assert on - off == {(CLUSTER, "", "pods/status", "patch")}
    container = one(variants["lost-pod-reaper"], "Deployment", "gangctl-controller")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "GANGCTL_LOST_POD_SECONDS", "value": "60"} in container["env"], "the overlay turns the reaper on"
    base_env = one(base, "Deployment", "gangctl-controller")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "GANGCTL_LOST_POD_SECONDS" not in {e["name"] for e in base_env}


@pytest.mark.parametrize("value,named", [
    ("replicas=two", "at '/replicas': got string, want integer"),
    ("metrics.port=80800", "at '/metrics/port': maximum"),
    ("backends.slurm.enabled=true", "at '/backends': additional properties 'slurm' not allowed"),
    ("backends.kai.enabled=yes", "at '/backends/kai/enabled': got string, want boolean"),
    ("lostPodReaper.seconds=0", "at '/lostPodReaper/seconds': minimum"),
])
def test_helm_values_schema_refuses_a_wrong_value_naming_it(helm, value, named):
    result = helm_template(helm, value)
    assert result.returncode != 0, f"{value} rendered"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert named in result.stderr, result.stderr
