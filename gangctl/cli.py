"""The `gangctl` command. Typer (on click) for the command tree, rich for progress and tables."""
from __future__ import annotations

import json
import logging
import sys
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gangctl.api.runtime import GANG_BACKENDS
from gangctl.config import ClusterSettings, ControllerSettings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Gang-scheduled, elastic PyTorch training on Kubernetes.")
cluster_app = typer.Typer(no_args_is_help=True, help="A real local control plane (kube-apiserver, scheduler, controllers, KWOK GPU nodes).")
app.add_typer(cluster_app, name="cluster")
policy_app = typer.Typer(no_args_is_help=True, help="Quota policies (policies/*.yaml): validate, and apply as Kueue or Volcano objects.")
app.add_typer(policy_app, name="policy")
err = Console(stderr=True)
out = Console()


class Output(str, Enum):
    text = "text"
    json = "json"


# The gang backends, as the choices of `cluster up --scheduler` and `policy apply --backend`.
Backend = Enum("Backend", {name: name for name in GANG_BACKENDS}, type=str)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(1)


def _build_progress():
    """A rich progress bar for `ensure_built`, and the callback that feeds it."""
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), TextColumn("[dim]{task.fields[line]}"), console=err, transient=True)
    task = bar.add_task("building binaries", total=None, line="")

    compiled = 0

    def progress(what: str, done: int, total: int, line: str) -> None:
        nonlocal compiled
        bar.update(task, description=f"building {what}", completed=done, total=total, line=line[-60:])
        if line == "built":
            bar.console.print(f"  built {what} ({done}/{total})")
        else:
            compiled += 1
            if not err.is_terminal and compiled % 200 == 0:  # CI logs get a line now and then
                bar.console.print(f"  building {what}: {compiled} packages compiled so far")
    return bar, progress


@cluster_app.command("build")
def cluster_build() -> None:
    """Build (or reuse from the cache) the pinned control-plane binaries, showing progress."""
    import time

    from gangctl.cluster.build import BuildError, ensure_built

    settings = ClusterSettings()
    started = time.monotonic()
    bar, progress = _build_progress()
    with bar:
        try:
            folder = ensure_built(settings.integrations_dir, settings.bin_root, progress)
        except BuildError as exc:
            _fail(str(exc))
    err.print(f"binaries ready in {folder} ({time.monotonic() - started:.0f}s)")


@cluster_app.command("up")
def cluster_up(
    gpu_nodes: int = typer.Option(4, help="KWOK GPU nodes to create"),
    gpus_per_node: int = typer.Option(8, help="nvidia.com/gpu allocatable on each GPU node"),
    process_nodes: int = typer.Option(0, help="process nodes (gangctl node-agent): pods on them run real processes"),
    scheduler: Backend = typer.Option(Backend("coscheduling"), help="also run Volcano, Kueue, KAI Scheduler or upstream kube-scheduler with gang scheduling (native; built once, cached)"),
    topology: str | None = typer.Option(None, metavar="BLOCKSxRACKSxHOSTS",
                                           help="label the GPU nodes with blocks and racks, e.g. 2x4x8: 64 nodes "
                                                "(replaces --gpu-nodes)"),
) -> None:
    """Build the pinned binaries (once; minutes the first time), start the cluster, install CRDs and nodes."""
    from gangctl.cluster.build import BuildError
    from gangctl.cluster.lifecycle import UpOptions, up
    from gangctl.cluster.local import ClusterError
    from gangctl.cluster.setup import parse_shape

    settings = ClusterSettings()
    try:
        shape = parse_shape(topology) if topology else None
    except ValueError as exc:
        _fail(str(exc))
    options = UpOptions(shape.nodes if shape else gpu_nodes, gpus_per_node, process_nodes, scheduler.value, shape)
    bar, progress = _build_progress()
    with bar:
        try:
            cluster = up(settings, options, lambda m: err.print(f"• {m}"), progress)
        except (BuildError, ClusterError, TimeoutError, RuntimeError) as exc:
            _fail(str(exc))
    err.print(f"[green]cluster {settings.cluster_name!r} is up.[/] Use it with:\n  export KUBECONFIG={cluster.kubeconfig}")


@cluster_app.command("down")
def cluster_down() -> None:
    """Stop every component and delete the cluster's state."""
    from gangctl.cluster.lifecycle import down
    from gangctl.cluster.local import ClusterError

    try:
        down(ClusterSettings(), lambda m: err.print(f"• {m}"))
    except ClusterError as exc:
        _fail(str(exc))


@cluster_app.command("status")
def cluster_status(output: Output = typer.Option(Output.text, "-o", "--output")) -> None:
    """Which components run, and how many GPU nodes are Ready."""
    from gangctl.cluster.lifecycle import status

    info = status(ClusterSettings())
    if output is Output.json:
        print(json.dumps(info, indent=2))
        return
    if not info["exists"]:
        out.print(f"cluster {info['name']!r} does not exist; start it with: gangctl cluster up")
        return
    table = Table(title=f"cluster {info['name']} ({info.get('scheduler', 'coscheduling')}): "
                        f"{'running' if info['running'] else 'not running'}")
    table.add_column("component")
    table.add_column("process")
    for comp in info["components"]:
        table.add_row(comp["name"], "[green]running" if comp["running"] else "[red]stopped")
    out.print(table)
    if info.get("nodes"):
        out.print(f"KWOK GPU nodes Ready: {info['nodes']['kwok_ready']}")
    out.print(f"kubeconfig: {info['kubeconfig']}")


@cluster_app.command("env")
def cluster_env() -> None:
    """Print the export line that points kubectl and the SDK at the local cluster."""
    print(f"export KUBECONFIG={ClusterSettings().kubeconfig}")


@app.command("controller")
def controller(
    kubeconfig: str = typer.Option(None, envvar="KUBECONFIG",
                                   help="kubeconfig file (default: in-cluster when KUBERNETES_SERVICE_HOST is set, "
                                        "else ~/.kube/config)"),
    metrics_bind_address: str = typer.Option("127.0.0.1:8080", help="HOST:PORT of /metrics, /healthz and /readyz "
                                                                    "(':8080' or '0.0.0.0:8080': every interface)"),
    metrics_port: int = typer.Option(None, help="only the port of --metrics-bind-address"),
    metrics_auth: bool = typer.Option(False, "--metrics-auth/--no-metrics-auth",
                                      help="/metrics only for bearer tokens allowed 'get' on /metrics "
                                           "(TokenReview + SubjectAccessReview)"),
    leader_elect: bool = typer.Option(False, "--leader-elect/--no-leader-elect",
                                      help="reconcile only while holding the leader Lease (for several replicas)"),
    leader_elect_namespace: str = typer.Option("gangctl-system", envvar="POD_NAMESPACE",
                                               help="namespace of the leader Lease (default: POD_NAMESPACE if set)"),
    leader_elect_lease_name: str = typer.Option("gangctl-controller", help="name of the leader Lease"),
    trainer_status_url: str = typer.Option(None, envvar="GANGCTL_TRAINER_STATUS_URL",
                                           help="base URL trainer pods report progress to, e.g. https://gangctl-"
                                                "controller.gangctl-system.svc:8443 (default: the local cluster's "
                                                "host Service if any, else off)"),
    trainer_status_bind_address: str = typer.Option("127.0.0.1:8443", envvar="GANGCTL_TRAINER_STATUS_BIND_ADDRESS",
                                                    help="HOST:PORT the progress endpoint (HTTPS) listens on"),
    log_level: str = typer.Option("INFO", envvar="GANGCTL_LOG_LEVEL", help="DEBUG also logs every write a pass makes"),
) -> None:
    """Run the TrainJob controller until SIGTERM (exit 0) or a lost leader Lease (exit 1)."""
    import asyncio

    from rich.markup import escape

    from gangctl.obs.ports import PortInUse
    from gangctl.runtime.controller import run_controller

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        host, port = split_host_port(metrics_bind_address)
    except ValueError as exc:
        _fail(f"--metrics-bind-address: {exc}")
    try:
        status_host, status_port = split_host_port(trainer_status_bind_address)
    except ValueError as exc:
        _fail(f"--trainer-status-bind-address: {exc}")
    settings = ControllerSettings(trainer_status_url=trainer_status_url or None, trainer_status_host=status_host,
                                  trainer_status_port=status_port,kubeconfig=kubeconfig or None, metrics_host=host,
                                  metrics_port=port if metrics_port is None else metrics_port,
                                  metrics_auth=metrics_auth, leader_elect=leader_elect,
                                  leader_elect_namespace=leader_elect_namespace,
                                  leader_elect_lease_name=leader_elect_lease_name)
    try:
        code = asyncio.run(run_controller(settings))
    except KeyboardInterrupt:
        code = 0
    except PortInUse as exc:
        _fail(escape(f"--metrics-bind-address {exc.host}:{exc.port}: the port is in use, {exc.describe()}. Pass a "
                     f"free port (--metrics-bind-address {exc.host}:{exc.port + 1}, say) or stop that process"))
    raise typer.Exit(code)


def split_host_port(address: str) -> tuple[str, int]:
    """'127.0.0.1:8080', '[::1]:8080', ':8080' (every interface) -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    host = host.strip("[]")
    return host or "0.0.0.0", int(port)


@app.command("node-agent")
def node_agent(
    name: str = typer.Option(..., help="the Node's name"),
    cluster: str = typer.Option("gangctl", envvar="GANGCTL_CLUSTER_NAME", help="names the pod network namespaces"),
    index: int = typer.Option(0, help="this agent's number in the cluster: pod IPs come from 10.244.<index+1>.0/24"),
    cpu: str = typer.Option(None, help="cpu capacity (default: this machine's CPU count)"),
    memory: str = typer.Option(None, help="memory capacity (default: this machine's memory)"),
    pods: int = typer.Option(110, help="pods capacity"),
    kubelet_port: int = typer.Option(0, help="kubelet API port on 127.0.0.1 (0: pick a free one)"),
    state_dir: str = typer.Option(None, help="logs and certificates (default: <cache>/nodes/<cluster>/<name>)"),
    kubeconfig: str = typer.Option(None, envvar="KUBECONFIG"),
    taint: bool = typer.Option(False, help="taint the node gangctl.io/process-node=true:NoSchedule, so only pods "
                               "that tolerate it land there (default: untainted, it runs any pod for real)"),
    token_max_age: float = typer.Option(24 * 3600, help="seconds after which a pod's ServiceAccount token is "
                                        "replaced even before 80 % of its lifetime (kubelet: 24 h)"),
    client_ca_file: str = typer.Option(None, help="CA of the kubelet API's callers (default: the kubeconfig's "
                                       "cluster CA)"),
    hide: list[str] = typer.Option([], help="a path pods must not see (the kubeconfig and its keys always are)"),
    log_level: str = typer.Option("INFO", envvar="GANGCTL_LOG_LEVEL", help="DEBUG also logs every write a pass makes"),
) -> None:
    """Run a process node: pods bound to it run as local processes (real torchrun)."""
    import asyncio
    from pathlib import Path

    from gangctl.nodeagent.agent import AgentConfig, run_agent
    from gangctl.nodeagent.machine import machine_cpu, machine_memory
    from gangctl.processes import free_port
    from gangctl.nodeagent.spec import NodeConfig

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ClusterSettings(cluster_name=cluster)
    node = NodeConfig(name=name, cpu=cpu or machine_cpu(), memory=memory or machine_memory(), pods=pods,
                      kubelet_port=kubelet_port or free_port(), taint=taint)
    cfg = AgentConfig(node=node, cluster=cluster, index=index, kubeconfig=Path(kubeconfig) if kubeconfig else None,
                      state_dir=Path(state_dir) if state_dir else settings.cache_dir / "nodes" / cluster / name,
                      token_max_age=token_max_age, client_ca=Path(client_ca_file) if client_ca_file else None,
                      hide=tuple(hide))
    try:
        asyncio.run(run_agent(cfg))
    except KeyboardInterrupt:
        pass


def _read_policy(path: str):
    from pathlib import Path

    from gangctl.policy.quota_check import check_policy

    try:
        text = Path(path).read_text()
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}")
    policy, problems = check_policy(text)
    return policy, [p.format(path) for p in problems]


def _topology_problems(topology, path: str) -> list[str]:
    from pathlib import Path

    import yaml

    from gangctl.model.topology import check_nodes

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        _fail(f"cannot read nodes from {path}: {exc}")
    items = data.get("items") if isinstance(data, dict) and "items" in data else [data]
    return [f"{path}: {problem}" for problem in check_nodes(topology, items or [])]


@policy_app.command("validate")
def policy_validate(file: str = typer.Argument(..., help="a quota policy YAML file (schema: policies/schema.json)"),
                    nodes: str = typer.Option(None, "--nodes", help="a NodeList file (`kubectl get nodes -o yaml`): "
                                              "check the policy's topology against its nodes' labels"),
                    output: Output = typer.Option(Output.text, "-o", "--output")) -> None:
    """Check a quota policy: schema and semantic errors, each with its field and line. Exit 1 if any.
    With --nodes and a `topology:` section, also every node labelled at every level and every domain
    inside one domain of the level above."""
    policy, problems = _read_policy(file)
    if policy is not None and policy.topology is not None and nodes:
        problems = _topology_problems(policy.topology, nodes)
        policy = None if problems else policy
    if output is Output.json:
        print(json.dumps({"file": file, "valid": policy is not None, "errors": problems,
                          "teams": [t.name for t in policy.teams] if policy else [],
                          "topology": [lv.name for lv in policy.topology.levels] if policy and policy.topology else []},
                         indent=2))
    elif policy is not None:
        teams = ", ".join(f"{t.name} ({len(t.namespaces or [t.name])} ns)" for t in policy.teams)
        out.print(f"[green]{file}: valid[/] — {len(policy.teams)} teams: {teams}; "
                  f"priorities: {', '.join(f'{k}={v}' for k, v in policy.priorities.items())}"
                  + (f"; topology: {' > '.join(lv.name for lv in policy.topology.levels)}" if policy.topology else ""),
                  soft_wrap=True)
    else:
        for line in problems:
            print(line, file=sys.stderr)
    if policy is None:
        raise typer.Exit(1)


@policy_app.command("apply")
def policy_apply(
    file: str = typer.Argument(..., help="a quota policy YAML file"),
    backend: Backend = typer.Option(None, help="kueue, volcano, kai, coscheduling or native (default: the scheduler the "
                                         "local cluster runs)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show the diff against the cluster; change nothing"),
    kubeconfig: str = typer.Option(None, envvar="KUBECONFIG", help="default: the local cluster's"),
    output: Output = typer.Option(Output.text, "-o", "--output"),
) -> None:
    """Translate a quota policy into Kueue objects, Volcano Queues or KAI Queues and server-side apply them.

    With coscheduling (no quota system of its own) gangctl admits the jobs itself: the policy is
    stored in the ConfigMap gangctl-system/gangctl-quota-policy, with the policy's PriorityClasses.
    With Volcano it is stored there too: gangctl preempts lower-priority gangs where the policy
    allows it, which Volcano's own preempt action does not do for a job its full queue holds back.
    With KAI, what its Queues cannot express (lendingLimit, reclaimWithinCohort Never, ...) is
    named on stderr. A policy with a `topology:` section also gets the backend's topology objects:
    Kueue's Topology (and the flavor's topologyName), Volcano's HyperNodes (from the cluster's
    nodes), KAI's Topology; none for native and coscheduling (docs/topology.md)."""
    import asyncio

    from gangctl.kube.client import ApiError, Kube
    from gangctl.commands.policy_apply import apply_policy

    policy, problems = _read_policy(file)
    if policy is None:
        for line in problems:
            print(line, file=sys.stderr)
        raise typer.Exit(1)
    settings = ClusterSettings()
    if backend is None:
        from gangctl.cluster.schedulers import chosen

        backend = Backend(chosen(settings))
    from pathlib import Path

    text = Path(file).read_text()

    async def run():
        kube = await Kube.connect(kubeconfig or settings.kubeconfig)
        try:
            return await apply_policy(kube, policy, backend.value, dry_run=dry_run, text=text)
        finally:
            await kube.close()
    try:
        changes = asyncio.run(run())
    except (ApiError, RuntimeError, OSError) as exc:
        _fail(str(exc))
    from gangctl.plugins import base
    from gangctl.plugins.registry import BACKENDS

    for note in base.unexpressed(BACKENDS[backend.value], policy):
        err.print(f"[yellow]note:[/] {note}")
    if output is Output.json:
        print(json.dumps({"backend": backend.value, "dryRun": dry_run, "objects": [c.as_json() for c in changes]}, indent=2))
        return
    colour = {"create": "green", "created": "green", "update": "yellow", "updated": "yellow", "unchanged": "dim"}
    for c in changes:
        where = f"{c.namespace}/" if c.namespace else ""
        out.print(f"[{colour.get(c.action, 'white')}]{c.action:>9}[/] {c.kind} {where}{c.name}")
        if dry_run and c.diff:
            out.print("".join(c.diff).rstrip(), markup=False, highlight=False)
    counts = {a: sum(c.action == a for c in changes) for a in dict.fromkeys(c.action for c in changes)}
    summary = ", ".join(f"{n} {a}" for a, n in counts.items())
    err.print(f"{backend.value}: {summary}{' (dry run: nothing changed)' if dry_run else ''}")


def _mount_sim() -> None:
    from gangctl.sim.cli import sim_command
    from gangctl.validate.cli import sim_check_command

    app.command("sim")(sim_command)
    app.command("sim-check")(sim_check_command)


_mount_sim()


@app.command("explain")
def explain_command(
    target: str = typer.Argument(..., metavar="[pytorchjob/]NAMESPACE/NAME",
                                 help="the TrainJob, or a PyTorchJob with the pytorchjob/ prefix"),
    output: Output = typer.Option(Output.text, "-o", "--output"),
) -> None:
    """Why a TrainJob or PyTorchJob waits (or runs, or ended): its gang's requests against what the nodes have free."""
    import asyncio

    from gangctl.api.quantity import format_amount
    from gangctl.commands.explain import ExplainError, as_json, explain, explain_pytorchjob
    from gangctl.kube.client import ApiError

    parts = target.split("/")
    kind = parts.pop(0).lower() if len(parts) == 3 else "trainjob"
    readers = {"trainjob": explain, "trainjobs": explain, "pytorchjob": explain_pytorchjob, "pytorchjobs": explain_pytorchjob}
    if len(parts) != 2 or not all(parts) or kind not in readers:
        _fail(f"give the job as NAMESPACE/NAME (a TrainJob) or pytorchjob/NAMESPACE/NAME, e.g. default/{parts[-1]}")
    namespace, name = parts
    settings = ControllerSettings()
    try:
        job, d = asyncio.run(readers[kind](settings.kubeconfig, namespace, name, settings.gang_retry_seconds))
    except (ExplainError, ApiError, ValueError) as exc:
        _fail(str(exc))
    if output is Output.json:
        print(json.dumps(as_json(job, d), indent=2))
        return
    out.print(f"[bold]{namespace}/{name}[/]: [bold]{d.reason}[/]")
    out.print(d.message)
    if d.rows:
        table = Table(title=f"{d.pods_missing} pod(s) of the gang missing; room for {d.slots} on schedulable nodes")
        for col in ("resource", "the missing pods need", "free on schedulable nodes"):
            table.add_column(col, justify="right")
        for row in d.rows:
            needed, free = format_amount(row.resource, row.needed), format_amount(row.resource, row.free)
            table.add_row(row.resource, needed, f"[red]{free}[/]" if row.free < row.needed else free)
        out.print(table)
    if any(e.slots for e in d.excluded):
        table = Table(title="nodes the gang's pods may not use")
        for col, justify in (("excluded by", "left"), ("nodes", "right"), ("room for pods", "right"), ("to use them", "left")):
            table.add_column(col, justify=justify)
        for e in d.excluded:
            table.add_row(e.what, str(e.nodes), str(e.slots), e.fix)
        out.print(table)
    if d.domains:
        table = Table(title=f"free room per {d.level}" + (f"; {d.next_domain} would hold the gang next"
                                                            if d.next_domain else "; none holds the gang's floor now"))
        for col, justify in ((d.level, "left"), ("hosts", "right"), ("hosts with room", "right"),
                             ("room for pods", "right"), ("GPUs free", "right")):
            table.add_column(col, justify=justify)
        for r in d.domains:
            table.add_row(r.domain, str(r.hosts), str(r.hosts_with_room), str(r.room), format_amount("nvidia.com/gpu", r.gpus_free))
        out.print(table)
    if d.scheduler_says:
        out.print(f"the scheduler says: {d.scheduler_says}")


@app.command("convert")
def convert_command(
    path: str = typer.Argument(..., metavar="FILE", help="a PyTorchJob (kubeflow.org/v1) manifest; - reads stdin"),
    runtime: str = typer.Option("torch-distributed", help="the ClusterTrainingRuntime the TrainJob names when the "
                                "job needs no runtime of its own"),
    output: Output = typer.Option(Output.text, "-o", "--output", help="text: YAML documents; json: a list"),
) -> None:
    """A PyTorchJob as the equivalent TrainJob (+ a TrainingRuntime when it needs one): manifests on
    stdout, one `# no equivalent:` line per field that has none on stderr."""
    import yaml

    from gangctl.api.pytorchjob import PyTorchJobError
    from gangctl.policy.convert import convert

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        manifest = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        _fail(f"cannot read {path}: {exc}")
    if not isinstance(manifest, dict) or manifest.get("kind") != "PyTorchJob":
        _fail(f"{path} is not a PyTorchJob manifest (kind: {(manifest or {}).get('kind') if isinstance(manifest, dict) else None})")
    try:
        result = convert(manifest, runtime=runtime)
    except PyTorchJobError as exc:
        _fail(f"{path}: {exc}; Training Operator v1.9 would refuse it too")
    if output is Output.json:
        print(json.dumps({"manifests": result.manifests(), "noEquivalent": result.gaps}, indent=2))
        return
    print(yaml.safe_dump_all(result.manifests(), sort_keys=False), end="")
    for gap in result.gaps:
        print(f"# no equivalent: {gap}", file=sys.stderr)  # unwrapped: one line per gap, for grep


@app.command("demo")
def demo(gpu_nodes: int = typer.Option(64), gpus_per_node: int = typer.Option(8)) -> None:
    """A 64 x 8-GPU KWOK cluster plus 3 process nodes: two KWOK gangs and a real 3-node DDP job, live."""
    from gangctl.commands.demo import run_demo

    raise typer.Exit(run_demo(out, gpu_nodes, gpus_per_node))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
