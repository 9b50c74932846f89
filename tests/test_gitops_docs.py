"""docs/remediation-gitops.md and its example repository stay true: the example overlay renders
with `kubectl kustomize` into valid Deployments, the documented configurations load and their
locators find the flags in the example files, the Argo CD and Flux objects are the ones the
configurations name, and the guide is linked from where people look."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from bot.change.actuators.yaml_flags import Locator
from bot.change.argv import read_flags
from bot.kernel.config import ArgoCdSyncSpec, FluxSyncSpec, GitActuatorSpec, Settings
from tests.kustomize_render import kustomize, schema_problems

ROOT = Path(__file__).parent.parent
DOC = ROOT / "docs" / "remediation-gitops.md"
EXAMPLE = ROOT / "docs" / "examples" / "gitops"


def toml_blocks() -> list[dict[str, object]]:
    return [tomllib.loads(b) for b in re.findall(r"^```toml\n(.*?)^```$", DOC.read_text(),
                                                 flags=re.M | re.S)]  # fmt: skip


def actuators() -> dict[str, GitActuatorSpec]:
    """Each documented target's git actuator, validated as the bot validates its file."""
    found = {}
    for block in toml_blocks():
        for name, target in (block.get("targets") or {}).items():  # type: ignore[attr-defined]
            target.setdefault("vllm_url", "http://vllm.inference.svc:8000")
            settings = Settings.model_validate({"targets": {name: target}})
            spec = settings.targets[name].actuator
            assert isinstance(spec, GitActuatorSpec), name
            found[name] = spec
    return found


def test_the_example_overlay_renders_into_valid_deployments_with_the_flags() -> None:
    objects = kustomize(EXAMPLE / "apps" / "vllm" / "overlays" / "prod")
    assert sorted(o["metadata"]["name"] for o in objects) == ["vllm", "vllm-canary"]
    assert schema_problems(objects) == []
    for obj in objects:
        assert obj["metadata"]["namespace"] == "inference"
        (container,) = obj["spec"]["template"]["spec"]["containers"]
        assert container["name"] == "vllm"
        assert read_flags(container["args"]) == {"max-num-batched-tokens": 8192}


def test_the_documented_configurations_load_and_find_the_flags_in_the_example_files() -> None:
    specs = actuators()
    assert set(specs) == {"prod-a", "prod-b"}
    for spec in specs.values():
        for locator in filter(None, [spec.locator, spec.canary_locator]):
            found = Locator(locator).read((EXAMPLE / locator.file).read_text())
            assert found.flags["max-num-batched-tokens"] == 8192, locator.file
    helm = Locator(specs["prod-b"].locator).read((EXAMPLE / "helm/values-prod.yaml").read_text())
    assert helm.flags == {"max-num-batched-tokens": 8192, "enable-chunked-prefill": False}


def test_the_argo_cd_and_flux_objects_are_the_ones_the_configurations_name() -> None:
    specs = actuators()
    app = yaml.safe_load((EXAMPLE / "argocd" / "application.yaml").read_text())
    argo = specs["prod-a"].sync
    assert isinstance(argo, ArgoCdSyncSpec)
    assert (app["metadata"]["name"], app["metadata"]["namespace"]) == (argo.application,
                                                                       argo.namespace)  # fmt: skip
    assert app["spec"]["source"]["repoURL"] == specs["prod-a"].repo_url
    assert app["spec"]["source"]["path"] == str(Path(specs["prod-a"].locator.file).parent)
    assert app["spec"]["syncPolicy"]["automated"]["selfHeal"] is True
    kinds = {d["kind"]: d for d in yaml.safe_load_all((EXAMPLE / "flux" / "vllm.yaml").read_text())}
    flux = specs["prod-b"].sync
    assert isinstance(flux, FluxSyncSpec)
    ks = kinds["Kustomization"]
    assert (ks["metadata"]["name"], ks["metadata"]["namespace"]) == (flux.kustomization,
                                                                     flux.namespace)  # fmt: skip
    assert ks["spec"]["sourceRef"]["name"] == kinds["GitRepository"]["metadata"]["name"]
    assert ks["spec"]["path"].removeprefix("./") == "apps/vllm/overlays/prod"


def test_the_adr_publish_example_loads() -> None:
    (block,) = [b for b in toml_blocks() if "adr_publish" in b]
    settings = Settings.model_validate(block)
    assert settings.adr_publish is not None and settings.adr_publish.directory == "adr"


def test_a_broken_locator_in_the_example_is_found() -> None:
    spec = actuators()["prod-a"]
    broken = spec.locator.model_copy(
        update={"args": "spec.template.spec.containers[name=vlm].args"}
    )
    with pytest.raises(Exception, match=r"no item with name=vlm \(its names: vllm\)"):
        Locator(broken).read((EXAMPLE / broken.file).read_text())


def test_the_guide_names_the_token_scopes_and_is_linked() -> None:
    doc = DOC.read_text()
    for words in ("Contents: Read and write", "Pull requests: Read and write", "`api`",
                  "`write_repository`", "selfHeal: true", "`selfHeal: false`"):  # fmt: skip
        assert words in doc, words
    assert "(remediation-gitops.md)" in (ROOT / "docs" / "remediation.md").read_text()
    assert "(docs/remediation-gitops.md)" in (ROOT / "README.md").read_text()
    # every path it names in the repository exists; it names none outside it but in-pod mounts
    for path in re.findall(r"`((?:bot|tests|docs)/[\w/.-]+)`", doc):
        assert (ROOT / path).exists(), path
    outside = [p for p in re.findall(r"(?<![\w.:/>])/[a-z][\w.-]*/[\w./-]*", doc)
               if not p.startswith(("/var/run/secrets/", "/var/lib/ruleloop/", "/apis/"))]  # fmt: skip
    assert outside == [], outside
