"""The lock files: requirements.lock (the image: the controller's runtime dependencies and the build
backend) and requirements-dev.lock (`make`'s environment) pin every package, transitive ones included,
with hashes, at versions that satisfy pyproject.toml, and agree with each other."""
from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCKS = ("requirements.lock", "requirements-dev.lock")


def pins(lock: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of each entry (`name==version \\` then `--hash=sha256:...` lines)."""
    text = re.sub(r"\\\n", " ", (REPO / lock).read_text())
    entries = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = line.split()
        requirement = Requirement(spec)
        assert str(requirement.specifier).startswith("=="), f"{lock}: {spec} is not pinned with =="
        entries[canonicalize_name(requirement.name)] = (
            str(requirement.specifier)[2:], [o.removeprefix("--hash=") for o in options if o.startswith("--hash=")])
    return entries


def wanted(lock: str) -> list[Requirement]:
    project = PYPROJECT["project"]
    if lock == "requirements.lock":
        return [Requirement(r) for r in project["dependencies"] + PYPROJECT["build-system"]["requires"]]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


@pytest.mark.parametrize("lock", LOCKS)
def test_every_pin_has_a_hash(lock):
    entries = pins(lock)
    assert entries, lock
    unhashed = [name for name, (_, hashes) in entries.items() if not hashes]
    assert not unhashed, f"{lock}: no --hash for {unhashed}"
    assert all(h.startswith("sha256:") for _, hashes in entries.values() for h in hashes)


@pytest.mark.parametrize("lock", LOCKS)
def test_the_lock_satisfies_pyproject(lock):
    entries = pins(lock)
    for requirement in wanted(lock):
        name = canonicalize_name(requirement.name)
        assert name in entries, f"{lock} lacks {requirement} (pyproject.toml); regenerate it (its header says how)"
        assert requirement.specifier.contains(entries[name][0], prereleases=True), \
            f"{lock} pins {name}=={entries[name][0]}, pyproject.toml asks {requirement}"


@pytest.mark.parametrize("lock", LOCKS)
def test_the_lock_holds_every_dependency_of_what_it_pins(lock):
    """Transitively complete, read from the installed packages' metadata (`make` installs the dev lock,
    which holds every package of the other): else pip --require-hashes refuses the install."""
    entries = pins(lock)
    for name, (version, _) in entries.items():
        installed = importlib.metadata.version(name)
        assert installed == version, f"{name} {installed} is installed, {lock} pins {version}: run make"
        for spec in importlib.metadata.requires(name) or []:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                assert canonicalize_name(requirement.name) in entries, \
                    f"{lock}: {name} needs {requirement}, which is not pinned"


def test_the_image_runs_the_versions_the_tests_ran():
    image, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    differ = {name: (image[name][0], dev[name][0]) for name in image.keys() & dev.keys() if image[name][0] != dev[name][0]}
    assert not differ, f"requirements.lock and requirements-dev.lock pin different versions: {differ}"
    assert image.keys() <= dev.keys(), sorted(image.keys() - dev.keys())
