"""Build the controller image from Containerfile with podman (Debian's package, vfs storage, no daemon),
on a base image made from Debian's packages by mmdebstrap: no container registry is involved.

Both are cached outside the repo like the control-plane binaries, keyed by what they are made from:
the base by the suite and its packages, the image by the base and every file the Containerfile copies.
`make image` and the integration tests' background prebuild call `ensure_image`.
"""
from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gangctl.cluster.build import BuildError, _exclusive, _nice
from gangctl.config import REPO_ROOT, ClusterSettings

# The base: Debian's minimal system with Python 3.11 (what requirements.lock is resolved for).
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Documentation, manuals and translations are left out of the base (a third of its size); the
# copyright files stay.
DPKG_OPTIONS = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
                "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/locale/*",
                "path-exclude=/usr/share/info/*")
HOST_PACKAGES = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}   # command: Debian package
# What the Containerfile copies into the image (the gangctl package's files are added by walking it).
IMAGE_INPUTS = ("Containerfile", "pyproject.toml", "requirements.lock", "README.md")
BASE_NAME, IMAGE_NAME = "localhost/gangctl-base", "localhost/gangctl"
# podman asks the runtime for rlimits above what an unprivileged hard limit allows on some machines
# (here: setrlimit RLIMIT_NPROC fails with EPERM); ask for these instead.
NPROC = 4096

Say = Callable[[str], None]


@dataclass(frozen=True)
class Image:
    name: str          # localhost/gangctl:<key>
    base: str          # localhost/gangctl-base:<key>
    built: bool        # False: reused from the cache


def cache(settings: ClusterSettings) -> Path:
    return settings.cache_dir / "image"


def podman(settings: ClusterSettings) -> list[str]:
    """podman with the cache's own storage (vfs: works on any filesystem, no kernel overlay needed) and
    runc with cgroupfs (crun refuses cgroup v1 hybrid hosts; no systemd needed)."""
    store = cache(settings) / "podman"   # (not "storage": podman refuses a store made with another runroot)
    return ["podman", "--storage-driver", "vfs", "--root", str(store / "root"), "--runroot", str(runroot(store)),
            "--runtime", "runc", "--cgroup-manager", "cgroupfs"]


def runroot(store: Path) -> Path:
    """podman's transient state (locks, mounts): refused when its path is over 50 characters, so under
    /run (or the temp folder) with a name derived from the store, never beside a long cache path."""
    top = Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    return top / f"gangctl-podman-{hashlib.sha256(str(store).encode()).hexdigest()[:8]}"


def ulimits() -> list[str]:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 65536 if nofile == resource.RLIM_INFINITY else min(nofile, 65536)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={NPROC}:{NPROC}"]


def base_key() -> str:
    digest = hashlib.sha256("\n".join([SUITE, "minbase", *BASE_PACKAGES, *DPKG_OPTIONS]).encode())
    return digest.hexdigest()[:12]


def image_key(repo: Path, base: str) -> str:
    """Changes with the base and any file the image is built from."""
    digest = hashlib.sha256(base.encode())
    files = [repo / name for name in IMAGE_INPUTS]
    files += sorted(p for p in (repo / "gangctl").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def ensure_host_tools(say: Say) -> None:
    """Install podman, runc and mmdebstrap from Debian's packages when one is missing (as root)."""
    missing = sorted({pkg for cmd, pkg in HOST_PACKAGES.items() if shutil.which(cmd) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BuildError(f"building the image needs {', '.join(missing)} (Debian: apt-get install "
                         f"{' '.join(missing)}), run as root")
    say(f"installing {', '.join(missing)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300", *missing]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)   # a fresh machine's lists
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"apt-get install {' '.join(missing)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _run(cmd: list[str], log: Path, say: Say, show: Callable[[str], bool], what: str) -> None:
    """Run a build step under `nice`, its output into `log`; lines that `show` picks are reported."""
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        proc = subprocess.Popen([*_nice(), *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            sink.write(line)
            tail = (tail + [line.rstrip()])[-25:]
            if show(line):
                say(f"  {line.strip()}")
        if proc.wait() != 0:
            raise BuildError(f"{what} failed; full log: {log}\n" + "\n".join(tail))


def _exists(settings: ClusterSettings, name: str) -> bool:
    return subprocess.run([*podman(settings), "image", "exists", name], capture_output=True).returncode == 0


def ensure_base(settings: ClusterSettings, say: Say) -> str:
    """The base image (Debian `SUITE`, minbase plus Python), made by mmdebstrap once and imported."""
    folder = cache(settings)
    name = f"{BASE_NAME}:{base_key()}"
    tar = folder / f"base-{base_key()}.tar"
    if not tar.exists():
        started = time.monotonic()
        say(f"making the base image: Debian {SUITE} minbase + {', '.join(BASE_PACKAGES)} (mmdebstrap)")
        tar.with_suffix(".tmp").unlink(missing_ok=True)
        _run(["mmdebstrap", "--mode=root", "--format=tar", "--variant=minbase",
              f"--include={','.join(BASE_PACKAGES)}", *[f"--dpkgopt={o}" for o in DPKG_OPTIONS],
              SUITE, str(tar.with_suffix(".tmp"))], folder / "build.log", say,
             lambda line: line.startswith(("I: retrieving", "I: installing", "I: creating", "E:")), "mmdebstrap")
        os.replace(tar.with_suffix(".tmp"), tar)
        say(f"base image made in {time.monotonic() - started:.0f} s")
    if not _exists(settings, name):
        _run([*podman(settings), "import", "--quiet", str(tar), name], folder / "build.log", say,
             lambda line: False, "podman import")
        subprocess.run([*podman(settings), "tag", name, f"{BASE_NAME}:{SUITE}"], check=True, capture_output=True)
    return name


def _pip_forwarding() -> list[str]:
    """The host's pip CA bundle (a network's proxy CA) and index, given to the build's pip."""
    args = []
    cert = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    if Path(cert).is_file():
        args += ["--volume", f"{Path(cert).resolve()}:/run/host-ca.crt:ro", "--build-arg", "PIP_CERT=/run/host-ca.crt"]
    if os.environ.get("PIP_INDEX_URL"):
        args += ["--build-arg", f"PIP_INDEX_URL={os.environ['PIP_INDEX_URL']}"]
    return args


def ensure_image(settings: ClusterSettings, say: Say, repo: Path = REPO_ROOT) -> Image:
    """Build (or reuse) the controller image of `repo`'s files on the cached base. One build at a time
    across processes (`make image` and the test suite's prebuild wait for each other)."""
    with _exclusive(cache(settings)):
        ensure_host_tools(say)
        base = ensure_base(settings, say)
        name = f"{IMAGE_NAME}:{image_key(repo, base)}"
        if _exists(settings, name):
            return Image(name, base, built=False)
        started = time.monotonic()
        say(f"building {name} from {repo / 'Containerfile'}")
        _run([*podman(settings), "build", "--isolation", "chroot", "--network", "host", "--layers=false",
              *ulimits(), *_pip_forwarding(), "--build-arg", f"BASE={base}", "--tag", name,
              "--file", str(repo / "Containerfile"), str(repo)],
             cache(settings) / "build.log", say, lambda line: line.startswith(("STEP", "[")), "podman build")
        subprocess.run([*podman(settings), "tag", name, f"{IMAGE_NAME}:latest"], check=True, capture_output=True)
        _remove_older(settings, name)
        say(f"built {name} in {time.monotonic() - started:.0f} s")
        return Image(name, base, built=True)


def _remove_older(settings: ClusterSettings, keep: str) -> None:
    """Images of earlier trees go (vfs keeps a full copy of every layer), unless a container uses one;
    the base stays."""
    listed = subprocess.run([*podman(settings), "images", "--filter", f"reference={IMAGE_NAME}", "--format",
                             "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True).stdout.split()
    older = [ref for ref in listed if ref not in (keep, f"{IMAGE_NAME}:latest")]
    if older:
        subprocess.run([*podman(settings), "rmi", *older], capture_output=True)
    subprocess.run([*podman(settings), "image", "prune", "--force"], capture_output=True)


def run_command(settings: ClusterSettings, image: str, container: str, kubeconfig: Path) -> list[str]:
    """`podman run` of the image on the host's network with `kubeconfig` mounted read-only; the
    image's arguments (e.g. `controller --metrics-port 8081`) follow."""
    return [*podman(settings), "run", "--rm", "--name", container, "--network", "host", *ulimits(),
            "--volume", f"{kubeconfig}:/etc/gangctl/kubeconfig:ro", "--env", "KUBECONFIG=/etc/gangctl/kubeconfig",
            image]


def main() -> int:
    """`python -m gangctl.cluster.image`: build (or reuse) the controller image; print its name.
    `--podman`: print the podman command line that uses the image's storage (to run or save it)."""
    if sys.argv[1:] == ["--podman"]:
        print(" ".join(podman(ClusterSettings())))
        return 0
    started = time.monotonic()
    try:
        image = ensure_image(ClusterSettings(), lambda m: print(m, file=sys.stderr, flush=True))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{image.name} {'built' if image.built else 'reused from the cache'} after "
          f"{time.monotonic() - started:.0f} s (run it: {' '.join(podman(ClusterSettings()))} run ...)",
          file=sys.stderr, flush=True)
    print(image.name, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
