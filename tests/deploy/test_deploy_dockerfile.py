"""The Dockerfile and .dockerignore, checked without a Docker engine: hadolint, the stages each
variant builds, the final image's user/port/health check/command, and the build context."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from deploy_files import (
    DOCKERFILE,
    REPO_ROOT,
    Dockerfile,
    dockerignore_excludes,
    parse_dockerfile,
    read_dockerignore,
)

from bayesgate.service.settings import Settings

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _torch_pin() -> str:
    """The torch version pyproject.toml pins (``torch==X``)."""
    deps = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if re.match(r"torch\s*==", d)]
    return pin.split("==", 1)[1].strip()


def test_hadolint_passes_on_the_dockerfile(hadolint: str) -> None:
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_hadolint_reports_a_bad_dockerfile(hadolint: str, tmp_path: Path) -> None:
    """The tool really lints: an untagged base and unpinned, uncleaned apt-get are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\n")
    result = subprocess.run(
        [hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    for rule in ("DL3006", "DL3008", "DL3009", "DL3015"):
        assert rule in result.stdout, result.stdout


def test_parser_reads_stages_continuations_and_exec_forms(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(
        "ARG V=a\nARG IMG=debian:12\n"
        'FROM ${IMG} AS os-a\nENV X=1 \\\n    # dropped comment\n    Y="two words"\n'
        "FROM os-${V} AS final\nENV Y=3\nCOPY src/f.py /opt/f.py\nCOPY --from=os-a /x /x\n"
        'HEALTHCHECK --interval=5s --timeout=2s CMD ["python", "/opt/f.py"]\n'
        'ENTRYPOINT ["tool"]\nCMD ["run", "--fast"]\n'
    )
    df = parse_dockerfile(path)
    assert [s.name for s in df.stages] == ["os-a", "final"]
    assert [s.name for s in df.chain()] == ["final", "os-a"]
    assert df.base_image() == "debian:12"
    assert df.env() == {"X": "1", "Y": "3"}
    assert df.context_copies() == {"/opt/f.py": "src/f.py"}
    assert df.healthcheck() == ({"interval": "5s", "timeout": "2s"}, ["python", "/opt/f.py"])
    assert df.final_command() == ["tool", "run", "--fast"]
    # A base that names no stage is an image, as for Docker.
    assert df.base_image({"V": "b"}) == "os-b"
    with pytest.raises(ValueError, match="undefined build arg"):
        df.expand("${NOPE}")


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_each_variant_installs_the_pinned_torch_build(dockerfile: Dockerfile, variant: str) -> None:
    """VARIANT selects the torch stage: PyPI's CUDA wheel or the CPU index's +cpu wheel, both at
    pyproject's pin; the GPU variant sits on a CUDA base image, the CPU one does not."""
    assert dockerfile.global_args["TORCH_VERSION"] == _torch_pin()
    venv = dockerfile.stage("venv")
    torch_stage_name = dockerfile.expand(venv.base, {"VARIANT": variant})
    assert torch_stage_name == f"torch-{variant}"
    (install,) = [i.args for i in dockerfile.stage(torch_stage_name).all("RUN")]
    if variant == "cpu":
        assert f"--index-url {CPU_INDEX}" in install
        assert '"torch==${TORCH_VERSION}+cpu"' in install
    else:
        assert "--index-url" not in install and "--extra-index-url" not in install
        assert '"torch==${TORCH_VERSION}"' in install
    base = dockerfile.base_image({"VARIANT": variant})
    env = dockerfile.env({"VARIANT": variant})
    if variant == "gpu":
        assert re.fullmatch(r"nvidia/cuda:13\.0\.\d+-base-ubuntu24\.04", base), base
        assert env["BAYESGATE_DEVICE"] == "cuda"
    else:
        assert base == "ubuntu:24.04"
        assert env["BAYESGATE_DEVICE"] == "cpu"


def test_final_image_runs_bayesgate_serve_as_non_root(dockerfile: Dockerfile) -> None:
    final = dockerfile.final
    (user,) = final.all("USER")
    uid = user.args.split(":")[0]
    assert uid not in {"0", "root"}
    assert dockerfile.final_command() == ["bayesgate", "serve"]
    env = dockerfile.env()
    assert env["BAYESGATE_HOST"] == "0.0.0.0"
    assert final.all("EXPOSE")[0].args == env["BAYESGATE_PORT"] == "8000"
    assert env["PATH"].startswith("/opt/venv/bin:")
    # Every BAYESGATE_* variable the image sets is a real setting (a typo would be ignored).
    fields = {f"BAYESGATE_{name.upper()}" for name in Settings.model_fields}
    assert {k for k in env if k.startswith("BAYESGATE_")} <= fields


def test_healthcheck_probes_readiness_with_the_copied_script(dockerfile: Dockerfile) -> None:
    options, command = dockerfile.healthcheck()
    assert command[0] == "/opt/venv/bin/python"
    script = dockerfile.context_copies()[command[1]]
    assert (REPO_ROOT / script).is_file()
    assert '"/readyz"' in (REPO_ROOT / script).read_text()
    assert {"interval", "timeout", "start-period", "retries"} <= set(options)


def test_final_stage_has_no_build_tools_or_caches(dockerfile: Dockerfile) -> None:
    """Only Python comes from apt in the runtime chain, apt lists are removed in the same layer,
    pip is uninstalled from the venv the final image copies, and pip never keeps a cache."""
    runtime_chain = dockerfile.chain()
    for stage in runtime_chain:
        for run in stage.all("RUN"):
            if "apt-get install" in run.args:
                packages = run.args.split("apt-get install", 1)[1].split("&&")[0].split()
                assert [p for p in packages if not p.startswith("-")] == ["python3"]
                assert "rm -rf /var/lib/apt/lists/*" in run.args
    copied_stages = {
        part.split("=", 1)[1]
        for inst in dockerfile.final.all("COPY")
        for part in inst.args.split()
        if part.startswith("--from=")
    }
    assert copied_stages == {"venv", "native"}
    # from the native front end's build stage, only its library, where the image's setting says
    (native,) = [i.args for i in dockerfile.final.all("COPY") if "--from=native" in i.args]
    assert native.split()[1:] == [
        "/out/libbgfront.so",
        dockerfile.env()["BAYESGATE_NATIVE_LIBRARY"],
    ]
    (build,) = [r.args for r in dockerfile.stage("native").all("RUN")]
    assert "cargo build --release --offline" in build  # no crates: no registry access
    assert "pip uninstall -y pip" in dockerfile.stage("venv").all("RUN")[-1].args
    for stage in dockerfile.stages:
        for run in stage.all("RUN"):
            if "pip install" in run.args:
                assert "--no-cache-dir" in run.args, f"Dockerfile:{run.line}"


def test_dockerignore_matching_rules(tmp_path: Path) -> None:
    """Docker's semantics on hand-made cases: root-anchored names, ** at any depth, exceptions."""
    path = tmp_path / ".dockerignore"
    path.write_text("# comment\ndata\n**/__pycache__\n/docs/\n!docs/keep.md\n")
    rules = read_dockerignore(path)
    assert dockerignore_excludes(rules, "data/mnist/x.gz")
    assert not dockerignore_excludes(rules, "models/data/mnist.py")
    assert not dockerignore_excludes(rules, "models/data/x.py")
    assert dockerignore_excludes(rules, "__pycache__/a.pyc")
    assert dockerignore_excludes(rules, "models/sub/__pycache__/a.pyc")
    assert dockerignore_excludes(rules, "docs/other.md")
    assert not dockerignore_excludes(rules, "docs/keep.md")


def _context_files() -> list[str]:
    """Files of the repository as the build context sees them (before .dockerignore)."""
    out = []
    for root, dirs, files in os.walk(REPO_ROOT):
        rel_root = Path(root).relative_to(REPO_ROOT)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if d not in {".git", ".venv"}]  # large, excluded anyway
        out += [(rel_root / f).as_posix() for f in files]
    return out


def test_dockerignore_keeps_what_the_build_copies_and_drops_the_rest(
    dockerfile: Dockerfile,
) -> None:
    rules = read_dockerignore()
    for path in (
        ".venv/bin/python",
        ".git/HEAD",
        "runs/model/model.safetensors",
        "data/mnist/train-images-idx3-ubyte.gz",
        ".pytest_cache/v/cache/nodeids",
        ".ruff_cache/CACHEDIR.TAG",
        "models/__pycache__/mc.cpython-311.pyc",
        "bayesgate.egg-info/PKG-INFO",
        "tests/deploy/conftest.py",
        "deploy/model-store/my-model/model.safetensors",
        "service/native_front/target/release/libbayesgate_front.so",  # a host build: 95 MB
    ):
        assert dockerignore_excludes(rules, path), f"{path} would enter the build context"
    sources = [
        src
        for stage in dockerfile.stages
        for inst in stage.all("COPY")
        if "--from" not in inst.args
        for src in inst.args.split()[:-1]
    ]
    files = _context_files()
    for src in sources:
        src = src.rstrip("/")
        under = [f for f in files if f == src or f.startswith(src + "/")]
        kept = [f for f in under if not dockerignore_excludes(rules, f)]
        assert kept, f"COPY {src}: nothing of it is left in the build context"
        if src in {"models", "service", "bayesgate", "attacks"}:
            dropped = [f for f in under if f.endswith(".py") and dockerignore_excludes(rules, f)]
            assert dropped == [], f"source files left out of the build context: {dropped}"
    pretrained = [f for f in files if f.startswith("models/pretrained/")]
    assert not [f for f in pretrained if dockerignore_excludes(rules, f)]
