"""The controller image, as `make image` builds it (Containerfile, podman with vfs storage, a base made
from Debian's packages), runs `gangctl controller` against the local cluster and completes a TrainJob.

The container runs on the host's network as the image's non-root user, with the suite's least-privilege
kubeconfig mounted read-only, watching only the test's namespace. The session's own controller is
stopped meanwhile, so the image's controller is the only one that acts, and restarted after.
The image is built in the background from the session's start (conftest's `prebuilt`) and reused from
the cache while its inputs are unchanged.
"""
from __future__ import annotations

import asyncio
import base64
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from gangctl.cluster.image import ensure_image, podman, run_command
from gangctl.config import ClusterSettings
from gangctl.processes import ControllerProcess
from tests.integration.conftest import wait_ready
from tests.integration.helpers import eventually, get_trainjob, is_true, jobs_in, submit, trainjob

pytestmark = pytest.mark.integration

START_WITHIN = 240.0   # seconds: vfs copies the image's files into the container before it starts


def self_contained(kubeconfig: Path, path: Path) -> Path:
    """The kubeconfig with its CA file's content inlined, so that one read-only file is all the
    container needs."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        ca = entry["cluster"].pop("certificate-authority", None)
        if ca:
            entry["cluster"]["certificate-authority-data"] = base64.b64encode(Path(ca).read_bytes()).decode()
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)   # readable by the image's user (uid 65532)
    return path


async def test_the_image_controller_completes_a_trainjob(cluster_settings: ClusterSettings, kube, controller,
                                                         controller_kubeconfig: Path, namespace: str,
                                                         tmp_path: Path):
    image = await asyncio.to_thread(ensure_image, cluster_settings, lambda m: print(f"[image] {m}"))
    kubeconfig = self_contained(controller_kubeconfig, tmp_path / "kubeconfig.yaml")
    container = f"gangctl-itest-{uuid.uuid4().hex[:8]}"
    launcher = run_command(cluster_settings, image.name, container, kubeconfig)
    launcher[-1:-1] = ["--env", f"GANGCTL_NAMESPACE={namespace}"]   # podman's options go before the image
    ctl = ControllerProcess(kubeconfig, tmp_path / "image-controller.log", command=tuple(launcher))
    controller.stop()   # one controller only: the image's
    try:
        ctl.start()
        await asyncio.to_thread(ctl.wait_ready, START_WITHIN)
        inside = subprocess.run([*podman(cluster_settings), "exec", container, "id", "-u"], capture_output=True,
                                text=True)
        assert inside.stdout.strip() == "65532", inside   # the image's non-root user

        await submit(kube, trainjob("from-image", namespace, nodes=2, run_for="1s"))

        async def complete() -> bool:
            return is_true(await get_trainjob(kube, namespace, "from-image"), "Complete")
        await eventually(complete, 60, f"TrainJob {namespace}/from-image Complete")
        assert len(await jobs_in(kube, namespace)) == 1
        assert ctl.stop(timeout=60) == 0, ctl.log_path.read_text()[-3000:]   # SIGTERM reaches it through podman
    finally:
        ctl.stop(timeout=60)
        subprocess.run([*podman(cluster_settings), "rm", "--force", "--ignore", container], capture_output=True)
        controller.start()
        await wait_ready(controller)
