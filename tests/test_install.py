"""minipaged installs wherever participants sit: pip's own resolver, in dry-run mode,
finds a wheel for every package of the runtime set (`make setup`, `make chat`) and of
the test set (`make test`: the `dev` extra) on macOS (arm64, x86_64), Windows (x86_64)
and Linux (x86_64, aarch64), from PyPI, downloading nothing but metadata. pip resolves
the test set, which holds the runtime set; the runtime set is what its own requirements
reach in that resolution.

pip evaluates environment markers for the machine it runs on, not for `--platform`: from
Linux it would leave out Windows' colorama and ask a Mac for NVIDIA's wheels. So the
markers are evaluated here, for each target, and what the target needs beyond pip's
answer (a dependency whose marker holds there, not here) is added and resolved again.
Needs PyPI: skipped, with the reason, when it cannot be reached, except on CI (CI is
set), where that is a failure.
"""

import json
import os
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from minipaged.attention import nvrtc

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYTHON = "3.12"  # what python.org, Homebrew and recent Linux distributions give today
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/")


def machine(sys_platform: str, system: str, arch: str, os_name: str = "posix") -> dict:
    """The marker environment (PEP 508) of a CPython PYTHON on such a machine."""
    return {
        "sys_platform": sys_platform,
        "platform_system": system,
        "platform_machine": arch,
        "os_name": os_name,
        "python_version": PYTHON,
        "python_full_version": f"{PYTHON}.0",
        "implementation_name": "cpython",
        "implementation_version": f"{PYTHON}.0",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_version": "",
    }


def manylinux(arch: str) -> list[str]:
    """Wheel tags a Linux with glibc 2.28 (Debian 10, Ubuntu 20.04, RHEL 8 on) takes:
    pip expands neither manylinux_2_28 nor manylinux2014 to the older tags by itself."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(28, 16, -1)] + [
        f"manylinux2014_{arch}"
    ]
    if arch == "x86_64":
        tags += [f"manylinux_2_{minor}_{arch}" for minor in range(16, 4, -1)]
        tags += [f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return tags


# name: (pip's --platform tags, the marker environment); pip expands macOS' tags
PLATFORMS = {
    "macos-arm64": (["macosx_14_0_arm64"], machine("darwin", "Darwin", "arm64")),
    "macos-x86_64": (["macosx_13_0_x86_64"], machine("darwin", "Darwin", "x86_64")),
    "windows-x86_64": (
        ["win_amd64"],
        machine("win32", "Windows", "AMD64", os_name="nt"),
    ),
    "linux-x86_64": (manylinux("x86_64"), machine("linux", "Linux", "x86_64")),
    "linux-aarch64": (manylinux("aarch64"), machine("linux", "Linux", "aarch64")),
}
SETS = {"runtime": (), "test": ("dev",)}  # the extras each `make` target installs
NVRTC = {"nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12", "cuda-bindings"}


def requirement_set(
    extras: tuple[str, ...], with_dependencies: bool = True
) -> list[Requirement]:
    """pyproject.toml's dependencies and its `extras`, an extra naming minipaged[...]
    expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = (
        [Requirement(r) for r in project["dependencies"]] if with_dependencies else []
    )
    for extra in extras:
        for requirement in map(Requirement, project["optional-dependencies"][extra]):
            if requirement.name == project["name"]:
                requirements += requirement_set(
                    tuple(requirement.extras), with_dependencies=False
                )
            else:
                requirements.append(requirement)
    return requirements


def applies(requirement: Requirement, environment: dict, extras=()) -> bool:
    marker = requirement.marker
    return marker is None or any(
        marker.evaluate({**environment, "extra": extra}) for extra in ("", *extras)
    )


def unmarked(requirement: Requirement) -> str:
    """The requirement as pip should take it once its marker was decided here."""
    copy = Requirement(str(requirement))
    copy.marker = None
    return str(copy)


def left_out(
    report: dict, roots: list[Requirement], environment: dict
) -> list[Requirement]:
    """What the target needs that pip's resolution lacks: walk the dependencies from
    `roots` through the resolved packages' metadata, with the target's markers."""
    return walk(report, roots, environment)[1]


def walk(
    report: dict, roots: list[Requirement], environment: dict
) -> tuple[set[str], list[Requirement]]:
    """(the resolved packages that `roots` need on the target, what they need that is
    missing): the dependencies from `roots` through the resolved packages' metadata,
    with its markers.
    """
    resolved = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]
        for item in report["install"]
    }
    missing, seen, todo = [], set(), list(roots)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        if name not in resolved:
            missing.append(requirement)
            continue
        todo += [
            dependency
            for dependency in map(Requirement, resolved[name].get("requires_dist", []))
            if applies(dependency, environment, requirement.extras)
        ]
    return {name for name, _ in seen if name in resolved}, missing


def pip_dry_run(
    requirements: list[str], platforms: list[str], folder: Path
) -> tuple[dict, str]:
    """pip's resolution for those wheel tags: its report (empty when it failed) and its
    errors."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "-q",
        "--only-binary=:all:",
        "--python-version",
        PYTHON,
        "--implementation",
        "cp",
        *(f"--platform={tag}" for tag in platforms),
        "--target",
        str(folder / "target"),
        "--report",
        str(folder / "report.json"),
        "--disable-pip-version-check",
        "--timeout",
        "30",
        "-r",
        str(folder / "requirements.txt"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    errors = "\n".join(
        line for line in done.stderr.splitlines() if "is ignored" not in line
    )
    report = (
        json.loads((folder / "report.json").read_text()) if done.returncode == 0 else {}
    )
    return report, errors


def resolve(platform: str, folder: Path) -> dict[str, tuple[set[str], str]]:
    """Set name -> (the package names it installs on `platform`, or empty; pip's error).
    pip resolves the test set, which holds the runtime set; the runtime set is what its
    own requirements reach in that resolution (a resolution of the larger set is one of
    the smaller: half the runs, each mostly waiting on PyPI)."""
    tags, environment = PLATFORMS[platform]
    roots = {
        name: [r for r in requirement_set(extras) if applies(r, environment)]
        for name, extras in SETS.items()
    }
    requirements = [unmarked(r) for r in roots["test"]]
    for attempt in range(4):  # each round adds what the target needs and pip left out
        report, errors = pip_dry_run(requirements, tags, folder / str(attempt))
        if not report:
            return {name: (set(), errors) for name in SETS}
        missing = left_out(report, roots["test"], environment)
        if not missing:
            return {
                name: (walk(report, roots[name], environment)[0], "") for name in SETS
            }
        requirements += [unmarked(r) for r in missing]
    return {
        name: (
            set(),
            f"the dependencies of {platform} did not settle: still missing {missing}",
        )
        for name in SETS
    }


def pypi_unreachable() -> str:
    """Why PyPI cannot be reached, or "" when it can."""
    try:
        urllib.request.urlopen(
            urllib.request.Request(INDEX + "pip/", method="HEAD"), timeout=10
        )
    except OSError as error:
        return f"{INDEX} cannot be reached ({error})"
    return ""


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory):
    """(platform, set) -> resolution, every platform at once: pip mostly waits on the
    network."""
    reason = pypi_unreachable()
    if reason and os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must check that every platform installs")
    if reason:
        pytest.skip(f"resolving for other platforms needs PyPI: {reason}")
    folder = tmp_path_factory.mktemp("resolve")
    with ThreadPoolExecutor(len(PLATFORMS)) as pool:
        futures = {
            platform: pool.submit(resolve, platform, folder / platform)
            for platform in PLATFORMS
        }
        return {
            (platform, name): resolution
            for platform, future in futures.items()
            for name, resolution in future.result().items()
        }


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_platform_installs(resolutions, platform, name):
    packages, errors = resolutions[platform, name]
    assert packages, (
        f"the {name} set cannot be installed on {platform}:\n{errors[-3000:]}"
    )
    assert {"numpy", "tokenizers", "fastapi", "openai"} <= packages


@pytest.mark.parametrize("platform", PLATFORMS)
def test_running_needs_no_test_tools_and_tests_get_nvrtc_where_it_exists(
    resolutions, platform
):
    runtime, _ = resolutions[platform, "runtime"]
    tests, _ = resolutions[platform, "test"]
    assert not runtime & {"pytest", "playwright", "schemathesis", "nbclient", *NVRTC}
    assert {"pytest", "playwright", "schemathesis", "nbclient"} <= tests
    environment = PLATFORMS[platform][1]  # the markers agree with the NVRTC test's skip
    here = (environment["sys_platform"], environment["platform_machine"])
    assert (NVRTC <= tests) == (here in nvrtc.WHEELS)
    # no macOS wheels exist
    assert (NVRTC <= tests) == (not platform.startswith("macos"))
