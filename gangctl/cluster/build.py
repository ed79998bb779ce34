"""Build the control-plane programs from their pinned Go modules, once, into a cache outside the repo.

The pins live in the wrapper modules under integrations/ (go.mod + go.sum). The cache folder is
keyed by a hash of those files and the Go version, so changing a pin builds a fresh set and an
unchanged pin reuses the binaries (and Go's own build cache makes a rebuild mostly linking).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


class BuildError(RuntimeError):
    """A build step failed; the message says what to do next."""


@dataclass(frozen=True)
class Tool:
    package: str
    binary: str


@dataclass(frozen=True)
class GoModule:
    """A wrapper module under integrations/ and the programs built from it."""

    folder: str
    tools: tuple[Tool, ...]
    cache_name: str = ""   # the cache folder's prefix (default: the module's folder)


CONTROL_PLANE = GoModule("controlplane", (
    Tool("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
    Tool("k8s.io/kubernetes/cmd/kube-controller-manager", "kube-controller-manager"),
    Tool("go.etcd.io/etcd/server/v3", "etcd"),
))
# scheduler-plugins' scheduler: a full kube-scheduler with the Coscheduling plugin compiled in. Its own
# module, because its newest served release (v0.34.7) builds on older Kubernetes libraries.
COSCHEDULING = GoModule("coscheduling", (
    Tool("sigs.k8s.io/scheduler-plugins/cmd/scheduler", "kube-scheduler"),
))
KWOK = GoModule("kwok", (
    Tool("sigs.k8s.io/kwok/cmd/kwok", "kwok"),
    Tool("sigs.k8s.io/kwok/cmd/kwokctl", "kwokctl"),
))
MODULES = (CONTROL_PLANE, COSCHEDULING, KWOK)

# Report progress as (what, done, total, line) while building.
Progress = Callable[[str, int, int, str], None]


def go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("Go is not installed or not on PATH. Install Go 1.26 or newer "
                         "(Debian: apt-get install golang-go), then run the command again.")
    return go


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    # go.sum in the repo pins every module hash, so the checksum database is not needed.
    env.setdefault("GOSUMDB", "off")
    env.setdefault("GOFLAGS", "-mod=readonly")
    return env


def go_version(go: str) -> str:
    return subprocess.run([go, "env", "GOVERSION"], check=True, capture_output=True, text=True).stdout.strip()


BUILD_OPTIONS = "build.json"
"""A wrapper module's own link flags, when it has the file ({"ldflags": [...]}): for a setting a
program has no flag for (a package variable set with -X). Part of the module's cache key."""


def module_key(module_dir: Path, goversion: str) -> str:
    digest = hashlib.sha256(goversion.encode())
    for name in ("go.mod", "go.sum", BUILD_OPTIONS):
        if name != BUILD_OPTIONS or (module_dir / name).exists():
            digest.update((module_dir / name).read_bytes())
    return digest.hexdigest()[:16]


def build_options(module_dir: Path) -> dict:
    path = module_dir / BUILD_OPTIONS
    return json.loads(path.read_text()) if path.exists() else {}


def pinned_version(module_dir: Path, module_path: str) -> str | None:
    """The version a wrapper module pins for `module_path` (a replace wins over a require)."""
    text = (module_dir / "go.mod").read_text()
    replaced = re.search(rf"^\s*{re.escape(module_path)}\s*=>\s*\S+\s+(v\S+)", text, re.M)
    if replaced:
        return replaced.group(1)
    required = re.search(rf"^\s*{re.escape(module_path)}\s+(v\S+)", text, re.M)
    return required.group(1) if required else None


def version_ldflags(module_dir: Path) -> list[str]:
    """Stamp Kubernetes binaries (and helm) with their real version so /version, kwokctl and
    `helm version` see the truth."""
    flags = []
    version = pinned_version(module_dir, "k8s.io/kubernetes")
    if version is not None:
        major, minor = version.lstrip("v").split(".")[:2]
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += [f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor={major}",
                      f"-X {pkg}.gitMinor={minor}", f"-X {pkg}.gitTreeState=clean"]
    helm = pinned_version(module_dir, "helm.sh/helm/v3")
    if helm is not None:
        # As helm's own Makefile does: else `helm version` says v3.22, and `helm template` assumes
        # Kubernetes v1.20 (.Capabilities.KubeVersion) instead of its client-go's version.
        flags += [f"-X helm.sh/helm/v3/internal/version.version={helm}",
                  "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"]
        client_go = pinned_version(module_dir, "k8s.io/client-go")
        if client_go is not None:
            minor = client_go.lstrip("v").split(".")[1]
            for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
                flags += [f"-X {pkg}.k8sVersionMajor=1", f"-X {pkg}.k8sVersionMinor={minor}"]
    flags += build_options(module_dir).get("ldflags") or []
    if not flags:
        return []
    return ["-ldflags", "-s -w " + " ".join(flags)]


def ensure_built(integrations: Path, bin_root: Path, progress: Progress | None = None) -> Path:
    """Build (or reuse) every pinned program; returns the folder that holds all binaries."""
    go = go_binary()
    goversion = go_version(go)
    keys = [module_key(integrations / m.folder, goversion) for m in MODULES]
    out = bin_root / "-".join(k[:8] for k in keys)
    stamp = out / ".complete"
    if stamp.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tools = [(m, t) for m in MODULES for t in m.tools]
    for number, (module, tool) in enumerate(tools, 1):
        target = out / tool.binary
        if target.exists():
            continue
        _build_one(go, integrations / module.folder, tool, target, out / "build.log",
                   lambda line, n=number: progress and progress(tool.binary, n - 1, len(tools), line))
        if progress:
            progress(tool.binary, number, len(tools), "built")
    stamp.write_text(goversion + "\n")
    return out


def _nice() -> list[str]:
    """Builds run at the lowest CPU priority: on a 2-core machine they must not slow what else runs."""
    nice = shutil.which("nice")
    return [nice, "-n", "19"] if nice else []


def _build_one(go: str, module_dir: Path, tool: Tool, target: Path, log: Path, on_line: Callable[[str], None]) -> None:
    cmd = [*_nice(), go, "build", "-v", "-trimpath", *version_ldflags(module_dir), "-o", str(target) + ".tmp", tool.package]
    with log.open("a") as sink:
        sink.write(f"$ (cd {module_dir} && {' '.join(cmd)})\n")
        proc = subprocess.Popen(cmd, cwd=module_dir, env=go_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            sink.write(line)
            tail = (tail + [line.rstrip()])[-25:]
            on_line(line.strip())
        if proc.wait() != 0:
            raise BuildError(f"building {tool.binary} ({tool.package}) failed; full log: {log}\n"
                             + "\n".join(tail)
                             + "\nIf a module download failed, check the Go module proxy is reachable (go env GOPROXY) and retry.")
    os.replace(str(target) + ".tmp", target)


# CoreDNS (cluster DNS for process-node pods) is cached in its own folder, so adding it did not
# change the key of the control-plane binaries that are already built.
COREDNS = GoModule("coredns", (Tool(".", "coredns"),))


def ensure_coredns(integrations: Path, bin_root: Path, progress: Progress | None = None) -> Path:
    """Build (or reuse) CoreDNS from the wrapper module integrations/coredns; returns the binary.
    Waits for another process building it (the test suite's background prebuild), then reuses it."""
    return ensure_module(COREDNS, integrations, bin_root, progress) / COREDNS.tools[0].binary


# Kueue, Volcano and KAI are built only when `cluster up --scheduler kueue|volcano|kai` asks for them, each
# cached in its own folder (keyed like the others), so the default cluster never pays for them.
KUEUE = GoModule("kueue", (Tool("sigs.k8s.io/kueue/cmd/kueue", "kueue"),))
VOLCANO = GoModule("volcano", (
    Tool("volcano.sh/volcano/cmd/scheduler", "vc-scheduler"),
    Tool("volcano.sh/volcano/cmd/controller-manager", "vc-controller-manager"),
))
# Upstream kube-scheduler (KEP-4671 gang scheduling), from the control plane's own pinned module.
NATIVE = GoModule("controlplane", (Tool("k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"),),
                  cache_name="native-scheduler")
# NVIDIA KAI Scheduler: its scheduler, binder and the PodGroup/Queue status controllers (not the
# podgrouper or operator). The proxy serves v0.12.0 but will not list KAI's versions, so the pin is exact.
KAI = GoModule("kai", (
    Tool("github.com/NVIDIA/KAI-scheduler/cmd/scheduler", "kai-scheduler"),
    Tool("github.com/NVIDIA/KAI-scheduler/cmd/binder", "kai-binder"),
    Tool("github.com/NVIDIA/KAI-scheduler/cmd/podgroupcontroller", "kai-podgroupcontroller"),
    Tool("github.com/NVIDIA/KAI-scheduler/cmd/queuecontroller", "kai-queuecontroller"),
))
EXTRA_MODULES = {"kueue": KUEUE, "volcano": VOLCANO, "native": NATIVE, "kai": KAI}


@contextlib.contextmanager
def _exclusive(folder: Path):
    """Hold an exclusive lock on `folder` (created if need be): one build of a cache folder at a time,
    across processes (`cluster up` in two terminals, the test suite's background prebuild). The
    kernel drops the lock when the holder exits, however it exits."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_module(module: GoModule, integrations: Path, bin_root: Path, progress: Progress | None = None) -> Path:
    """Build (or reuse) every program of one optional wrapper module; returns the folder holding them.
    Waits for another process building the same folder, then reuses what it built."""
    go = go_binary()
    goversion = go_version(go)
    module_dir = integrations / module.folder
    out = bin_root / f"{module.cache_name or module.folder}-{module_key(module_dir, goversion)[:8]}"
    if (out / ".complete").exists():
        return out
    with _exclusive(out):
        if not (out / ".complete").exists():
            _build_module(go, goversion, module, module_dir, out, progress)
    return out


def _build_module(go: str, goversion: str, module: GoModule, module_dir: Path, out: Path,
                  progress: Progress | None) -> None:
    total = len(module.tools)
    for number, tool in enumerate(module.tools, 1):
        target = out / tool.binary
        if not target.exists():
            _build_one(go, module_dir, tool, target, out / "build.log",
                       lambda line, n=number, b=tool.binary: progress and progress(b, n - 1, total, line))
        if progress:
            progress(tool.binary, number, total, "built")
    (out / ".complete").write_text(goversion + "\n")


# The peer controllers of benchmarks/controller_peer.py (Kubeflow Trainer and the JobSet controller it
# needs), built only when the benchmark asks for them, each cached in its own folder like the above.
TRAINER = GoModule("trainer", (
    Tool("github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager", "trainer-controller-manager"),
))
JOBSET = GoModule("jobset", (Tool("sigs.k8s.io/jobset", "jobset"),))
# Training Operator v1 (PyTorchJob), the peer of benchmarks/pytorchjob_peer.py.
TRAINING_OPERATOR = GoModule("training-operator", (
    Tool("github.com/kubeflow/training-operator/cmd/training-operator.v1", "training-operator"),
))
PEER_MODULES = {"trainer": TRAINER, "jobset": JOBSET, "training-operator": TRAINING_OPERATOR}


# helm renders the chart deploy/helm/gangctl (tests/unit/test_deploy.py compares it with the kustomize
# output). Built only when asked, cached in its own folder like Kueue and Volcano, never by `make build`:
#   python -m gangctl.cluster.build helm
HELM = GoModule("helm", (Tool("helm.sh/helm/v3/cmd/helm", "helm"),))
TOOL_MODULES = {"helm": HELM}
# What `python -m gangctl.cluster.build NAME...` builds: a tool, an extra scheduler ahead of its
# `cluster up --scheduler`, or CoreDNS ahead of the first process nodes (the integration tests
# prebuild what their collected tests will need).
BUILDABLE = {**TOOL_MODULES, **EXTRA_MODULES, "coredns": COREDNS}


def ensure_tool(name: str, integrations: Path, bin_root: Path, progress: Progress | None = None) -> Path:
    """Build (or reuse) one pinned command-line tool of TOOL_MODULES; returns the binary."""
    module = TOOL_MODULES[name]
    return ensure_module(module, integrations, bin_root, progress) / module.tools[0].binary


def main(argv: list[str] | None = None) -> int:
    """`python -m gangctl.cluster.build helm|coredns|kueue|volcano|kai|native ...`: build (or reuse) pinned
    tools, CoreDNS or extra schedulers, print the folder (a tool: the binary) of each."""
    import argparse
    import sys
    import time

    from gangctl.config import ClusterSettings

    parser = argparse.ArgumentParser(prog="python -m gangctl.cluster.build", description=main.__doc__)
    parser.add_argument("names", nargs="+", choices=sorted(BUILDABLE), metavar="NAME",
                        help=f"one or more of {', '.join(sorted(BUILDABLE))}")
    args = parser.parse_args(argv)
    settings = ClusterSettings()
    started = time.monotonic()
    compiled = 0

    def progress(what: str, done: int, total: int, line: str) -> None:
        nonlocal compiled
        compiled += line != "built"
        if line == "built" or compiled % 100 == 0:
            print(f"  building {what}: {compiled} packages compiled so far" if line != "built"
                  else f"  built {what} ({done}/{total})", file=sys.stderr, flush=True)

    for name in args.names:
        try:
            if name in TOOL_MODULES:
                path = ensure_tool(name, settings.integrations_dir, settings.bin_root, progress)
            else:
                path = ensure_module(BUILDABLE[name], settings.integrations_dir, settings.bin_root, progress)
        except BuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{name} ready after {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        print(path, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
