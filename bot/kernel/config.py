"""The bot's settings: one object, built once at startup from the environment and a TOML file.

The TOML file holds what a team reviews (channel, access lists, targets); the environment holds
secrets and deployment overrides. Environment wins over the file. Business code receives a
``Settings`` and never reads ``os.environ``.

    [slack]
    channel = "#inference-incidents"
    [access]
    diagnose = ["U012ABCDEF", "*"]      # "*" = every member of the workspace
    apply = ["U012ABCDEF"]              # empty or missing: nobody (fail closed)
    [targets.prod-a]
    vllm_url = "http://10.0.0.5:8000"
    gateway_url = "http://10.0.0.5:9000"
    prometheus_url = "http://prometheus:9090"
    node = "gpu-node-7"
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bot.kernel.errors import UsageError

CONFIG_ENV = "RULELOOP_CONFIG"
# environment variable -> (section, key) in the TOML layout
ENV_KEYS: dict[str, tuple[str, str]] = {
    "SLACK_BOT_TOKEN": ("slack", "bot_token"),
    "SLACK_SIGNING_SECRET": ("slack", "signing_secret"),
    "SLACK_APP_TOKEN": ("slack", "app_token"),
    "SLACK_API_URL": ("slack", "api_url"),
    "RULELOOP_CHANNEL": ("slack", "channel"),
    "RULELOOP_ALERTMANAGER_TOKEN": ("alertmanager", "token"),
    "RULELOOP_DATABASE_URL": ("store", "url"),
    "RULELOOP_RUNBOOKS_DIR": ("paths", "runbooks"),
    "RULELOOP_ADR_DIR": ("paths", "adr"),
    "RULELOOP_PUBLIC_URL": ("web", "public_url"),
    "RULELOOP_WEB_SECRET": ("web", "link_secret"),
    "RULELOOP_LOG_FORMAT": ("server", "log_format"),
    "RULELOOP_LOG_LEVEL": ("server", "log_level"),
    "OTEL_EXPORTER_OTLP_ENDPOINT": ("tracing", "otlp_endpoint"),
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlackSettings(_Section):
    """Slack credentials and where incidents are posted."""

    bot_token: SecretStr | None = Field(default=None, description="the bot token (xoxb-...)")
    signing_secret: SecretStr | None = Field(
        default=None, description="checks that requests to /slack/events come from Slack"
    )
    app_token: SecretStr | None = None  # set: Socket Mode too (only, without a signing secret)
    api_url: str = Field(
        default="https://slack.com/api/", description="the Web API base URL (tests: a local fake)"
    )
    channel: str = Field(default="#incidents", description="where alert incidents are posted")
    team_id: str | None = Field(
        default=None,
        description="the workspace (T...) the bot serves: requests from any other are refused; "
        "set it in production (one signing secret signs every workspace's requests)",
    )
    enterprise_id: str | None = Field(
        default=None,
        description="the Enterprise Grid org (E...): requests from outside it are refused",
    )

    @property
    def enabled(self) -> bool:
        """Whether there is enough to talk to Slack (else the console transport is used)."""
        return self.bot_token is not None and (
            self.signing_secret is not None or self.app_token is not None
        )


class AccessSettings(_Section):
    """Who may run what: Slack user IDs, user group IDs (S...: their members), or "*" for
    everyone. Empty means nobody."""

    diagnose: list[str] = Field(default_factory=list, description="may run /diagnose")
    apply: list[str] = Field(
        default_factory=list,
        description="may apply an ADR (/apply-adr, Apply buttons), silence and acknowledge an "
        "incident (its thread's buttons)",
    )
    approve: list[str] = Field(default_factory=list, description="may approve a requested change")
    review: list[str] = Field(default_factory=list)  # accept or reject ADR drafts

    def allows(self, action: str, user_id: str) -> bool:
        """Whether ``user_id`` may perform ``action`` (fail closed on an empty list)."""
        allowed: list[str] = getattr(self, action)
        return "*" in allowed or user_id in allowed


class LocalActuatorSpec(_Section):
    """Restart the local engine (`ruleloop engine`) on the target's vllm_url port with new flags.

    ``flags`` is the engine's full launch command line besides the model; the ADR's flags are
    merged into it (the previous line is kept for rollback).
    """

    changes_flags: ClassVar[bool] = True  # the actuator it builds changes flags

    kind: Literal["local"]
    flags: list[str] = Field(default_factory=lambda: ["--enforce-eager"])
    canary_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^/]+:\d+/?$",
        description="a second local engine for the change's canary stage (e.g. "
        "http://127.0.0.1:8001): the change starts there first, `ruleloop gateway "
        "--canary-upstream` sends it a share of the traffic, and promotion restarts the "
        "target's engine with the change and stops it (docs/fleet.md, the live stage)",
    )
    state_dir: Path | None = None
    start_timeout_s: float = Field(default=300.0, gt=0)
    cpu_limit: float | None = Field(
        default=None,
        ge=0.01,
        le=1024,
        description="cores of CPU time for the engine's processes (a cgroup quota; needs root): "
        "makes a fast machine as slow as a user's",
    )


class KubernetesActuatorSpec(_Section):
    """Patch the container args of a Deployment (optionally a canary Deployment first)."""

    changes_flags: ClassVar[bool] = True  # the actuator it builds changes flags

    kind: Literal["kubernetes"]
    api_url: str = "https://kubernetes.default.svc"
    namespace: str = Field(min_length=1)
    deployment: str = Field(min_length=1)
    container: str | None = None  # unset: the Deployment's first container
    canary_deployment: str | None = None
    canary_url: str | None = None  # where the canary Deployment serves; required with it
    token_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    ca_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    rollout_timeout_s: float = Field(default=600.0, gt=0)
    poll_interval_s: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _canary_needs_url(self) -> KubernetesActuatorSpec:
        if self.canary_deployment and not self.canary_url:
            raise ValueError("canary_deployment needs canary_url (where the canary serves)")
        return self


class ForgeSpec(_Section):
    """The forge that hosts the repository: ruleloop opens and merges pull requests (GitHub) or
    merge requests (GitLab) through its REST API (docs/remediation-gitops.md)."""

    kind: Literal["github", "gitlab"]
    project: str = Field(
        min_length=1, description="GitHub: owner/repo; GitLab: the project's path or numeric id"
    )
    token_file: Path = Field(
        description="file holding the API token (a mounted Secret), read on every request; "
        "GitHub fine-grained: contents and pull_requests write; GitLab: api"
    )
    api_url: str | None = Field(
        default=None,
        description="unset: https://api.github.com, or https://gitlab.com/api/v4 for GitLab",
    )
    merge_method: Literal["rebase", "squash"] = Field(
        default="rebase",
        description="how a pull request lands; both keep the branch's history linear (GitLab: "
        "rebase means a fast-forward merge, set the project's merge method to match)",
    )
    approvals: Literal["ruleloop", "forge"] = Field(
        default="ruleloop",
        description="ruleloop: the approvals collected in Slack suffice, the bot merges at "
        "once; forge: it waits (up to approval_timeout_s) for the forge's own rules (reviews, "
        "checks) to allow the merge",
    )
    approval_timeout_s: float = Field(default=1800.0, gt=0)


class GitRepoSpec(_Section):
    """A git repository ruleloop commits to, with the `git` CLI (SSH deploy keys and
    credential helpers work as they do for people)."""

    repo_url: str = Field(
        min_length=1,
        description="what `git clone` takes: git@github.com:acme/fleet.git, https://..., a path",
    )
    branch: str = Field(default="main", min_length=1, description="the branch the team deploys")
    forge: ForgeSpec | None = None  # unset: only direct_push, no pull requests
    direct_push: bool = Field(
        default=False,
        description="commit straight to `branch` instead of through a pull request (refused "
        "by the remote when the branch is protected)",
    )
    deploy_key_file: Path | None = Field(
        default=None, description="SSH private key for git@ URLs (a mounted Secret, mode 0400)"
    )
    known_hosts_file: Path | None = Field(
        default=None, description="the SSH host keys to trust; unset: ssh's own known_hosts"
    )
    author_name: str = "ruleloop"
    author_email: str = "ruleloop@users.noreply.github.com"
    workdir: Path | None = Field(
        default=None,
        description="where the clone is kept (e.g. under serve's --state-dir); unset: the "
        "system's temporary directory",
    )

    @field_validator("branch")
    @classmethod
    def _plain_branch(cls, branch: str) -> str:
        if branch.startswith(("-", "refs/")) or " " in branch or ".." in branch:
            raise ValueError(f"{branch!r} is not a branch name like main")
        return branch

    @model_validator(mode="after")
    def _forge_or_push(self) -> GitRepoSpec:
        if self.forge is None and not self.direct_push:
            raise ValueError(
                "set [forge] (pull requests through GitHub or GitLab) or direct_push = true"
            )
        return self


def _repo_path(path: str) -> str:
    """A path inside the repository: relative, no '..' (refused otherwise)."""
    parts = Path(path).parts
    if not parts or Path(path).is_absolute() or ".." in parts or path.startswith("-"):
        raise ValueError(f"{path!r} is not a path inside the repository (relative, no '..')")
    return path


class GitLocatorSpec(_Section):
    """Where the vLLM flags are in the repository: one YAML file (a kustomize patch, a Helm
    values file, a manifest) and either the path to the container's args list or the path to
    each flag's value, e.g. `spec.template.spec.containers[name=vllm].args`."""

    file: str = Field(min_length=1, description="the YAML file, relative to the repository root")
    document: int = Field(default=0, ge=0, description="which document of a multi-document file")
    args: str | None = Field(
        default=None, description="path to the args list (dotted keys, [n], [key=value])"
    )
    flags: dict[str, str] = Field(
        default_factory=dict,
        description="flag -> path of its value (Helm values), e.g. "
        '{ max-num-batched-tokens = "vllm.maxNumBatchedTokens" }',
    )

    @field_validator("file")
    @classmethod
    def _inside(cls, file: str) -> str:
        return _repo_path(file)

    @model_validator(mode="after")
    def _one_kind(self) -> GitLocatorSpec:
        if (self.args is None) == (not self.flags):
            raise ValueError("set exactly one of `args` (the args list) or `flags` (each value)")
        return self


class GitClusterSpec(_Section):
    """The Deployment that serves what the repository says, read (never written) through the
    Kubernetes API to see the change served."""

    api_url: str = "https://kubernetes.default.svc"
    namespace: str = Field(min_length=1)
    deployment: str = Field(min_length=1)
    container: str | None = None  # unset: the Deployment's first container
    canary_deployment: str | None = None  # serves canary_locator's file
    token_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    ca_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")


class ArgoCdSyncSpec(_Section):
    """An Argo CD Application that deploys the repository: the change counts as served once it
    is Synced at (or after) the change's commit and Healthy."""

    kind: Literal["argocd"]
    application: str = Field(min_length=1)
    namespace: str = "argocd"


class FluxSyncSpec(_Section):
    """A Flux Kustomization that deploys the repository: the change counts as served once its
    Ready condition is True at (or after) the change's commit."""

    kind: Literal["flux"]
    kustomization: str = Field(min_length=1)
    namespace: str = "flux-system"


class GitActuatorSpec(GitRepoSpec):
    """Commit the flags to the deployment repository (a pull request the bot merges, or a
    direct push), then wait until the cluster serves them; roll back with a revert commit."""

    changes_flags: ClassVar[bool] = True  # the actuator it builds changes flags

    kind: Literal["git"]
    locator: GitLocatorSpec
    canary_locator: GitLocatorSpec | None = None  # a canary's own file: changed first
    canary_url: str | None = None  # where the canary serves; required with canary_locator
    cluster: GitClusterSpec
    sync: Annotated[ArgoCdSyncSpec | FluxSyncSpec, Field(discriminator="kind")] | None = None
    rollout_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="from the merge until the cluster serves it: the GitOps tool's polling "
        "interval (Argo CD: 3 minutes) plus the rollout",
    )
    poll_interval_s: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _canary_complete(self) -> GitActuatorSpec:
        given = [
            self.canary_locator is not None,
            bool(self.canary_url),
            bool(self.cluster.canary_deployment),
        ]
        if any(given) and not all(given):
            raise ValueError(
                "a canary needs all three: canary_locator, canary_url and cluster.canary_deployment"
            )
        return self


class DryRunActuatorSpec(_Section):
    """Change nothing: say exactly what would change."""

    changes_flags: ClassVar[bool] = False  # the actuator it builds changes flags

    kind: Literal["dry-run"]


ActuatorSpec = Annotated[
    LocalActuatorSpec | KubernetesActuatorSpec | GitActuatorSpec | DryRunActuatorSpec,
    Field(discriminator="kind"),
]


class CanarySpec(_Section):
    """The load the canary gate puts on a target after a change (short chats by default)."""

    concurrency: int = Field(default=8, ge=1)
    num_requests: int = Field(default=48, ge=1)
    prompt_length: int = Field(default=256, ge=1)
    output_length: int = Field(default=48, ge=2)
    shared_prefix_length: int = Field(default=0, ge=0)
    # long requests beside the chats (0: none), e.g. agents with long system prompts
    background_concurrency: int = Field(default=0, ge=0)
    background_prompt_length: int = Field(default=2048, ge=1)
    background_output_length: int = Field(default=16, ge=1)
    timeout_s: float = Field(default=300.0, gt=0)
    # a replay of the live workload (the drift job's re-validation and before-run, a re-tune's
    # trials) runs this long at the live rate instead of num_requests requests (0: the count).
    # At a live 100 req/s, 48 requests span half a second: the engine never carries the load
    # production puts on it, and a stall that builds over seconds is never measured
    replay_s: float = Field(default=0.0, ge=0, le=3600)
    # looks the canary may take (bot.canary's DEFAULT_LOOKS): sized to what its gates need, it
    # stops at the first look where every p99 gate is decided, else sends as many requests
    # again; each look is judged at its share of the error, so the verdict stays at 99 %
    looks: int = Field(default=2, ge=1, le=4)
    # also measure the flags serving now, before the change: the matrix then compares both
    baseline: bool = False
    # when the workload drifts, put the flags an in-force ADR's change replaced back on the
    # canary stage (the whole engine with a local actuator) for one canary run on the live
    # shape, so its 'Nx before' gates are judged like for like (docs/workload.md)
    drift_before_run: bool = False
    # what a change may do to a number no gate names, read against the before-run, and to the
    # target's standing gates (the ADRs in force there; docs/canary.md, "Guardrails"): "warn"
    # says a regression beyond noise or a missed standing gate on the card and in the thread,
    # "block" rolls the change back for it
    guardrails: Literal["warn", "block"] = "warn"
    # a regression: worse than the before-run by more than this share (0.2: 20 %), and
    # significant at the gates' confidence (99 %)
    guardrail_band: float = Field(default=0.2, gt=0)


class DriftSpec(_Section):
    """What the workload-drift job does when a rule in force fails its gates on the live
    workload (docs/workload.md): "button" offers a re-tune in the drift thread (a tuning search
    on the canary stage replaying the live shape, started by an approver), "auto" starts it at
    once, "off" only says the rule failed."""

    retune: Literal["off", "button", "auto"] = "button"
    retune_trials: int = Field(default=6, ge=1, le=50)  # the search's grid points, at most


class LiveStage(_Section):
    """/apply-adr's live stage: after the canary met the gates, the change serves production
    traffic on the canary stage only, and the canary replicas are judged against the baseline
    replicas (``bot.canary.live``) in ``steps`` windows of ``step_s`` before it is promoted."""

    steps: int = Field(default=3, ge=1, le=100)
    step_s: float = Field(default=120.0, gt=0, le=3600)  # each step's window
    interval_s: float = Field(default=10.0, gt=0, le=600)  # between scrapes in a window
    # steps that may say "roll back" before the change is rolled back (0: the first one does)
    failure_limit: int = Field(default=0, ge=0)
    # steps that may say "cannot judge" (too few requests, a replica restarted) before the
    # change is rolled back, failing safe: it is promoted only on evidence
    inconclusive_limit: int = Field(default=1, ge=0)


# a Kubernetes object name as Services and namespaces take it (an RFC 1123 label)
_KUBE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# a Service port's name (an IANA service name: at most 15 characters, at least one letter)
_KUBE_PORT_NAME = re.compile(r"(?=.*[a-z])[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")


class KubernetesApiSpec(_Section):
    """How the bot reads the Kubernetes API for a target's kubernetes_service (the in-cluster
    defaults: the pod's own service account)."""

    api_url: str = Field(
        default="https://kubernetes.default.svc",
        description="the API server (e.g. http://127.0.0.1:8001 behind `kubectl proxy`)",
    )
    token_file: Path | None = Field(
        default=Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        description="bearer token, read on every request (the kubelet rotates it); unset: none",
    )
    ca_file: Path | None = Field(
        default=Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
        description="the cluster's CA (used when the file exists)",
    )


class SilenceSpec(_Section):
    """[targets.X.silence]: an Alertmanager silence for the target's alerts while a change runs,
    and the Silence button in its incidents' threads (docs/remediation.md#silences); absent: no
    silence and no button (the default)."""

    alertmanager_url: str = Field(description="Alertmanager's base URL (its API v2 is used)")
    matchers: dict[str, str] = Field(
        default_factory=lambda: {"ruleloop_target": "{target}"},
        description="label = value the silence matches (exactly); {target} is the target's name",
    )
    change_s: float = Field(
        default=1800, gt=0, description="how long a change is expected to take, at most"
    )
    settle_s: float = Field(
        default=300, ge=0, description="the silence lasts this long past the change's expected end"
    )
    thread_silence_s: float = Field(
        default=3600, gt=0, description="how long the incident thread's Silence button silences"
    )

    @field_validator("alertmanager_url")
    @classmethod
    def _am_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http(s) URL like http://alertmanager:9093")
        return url.rstrip("/")

    @field_validator("matchers")
    @classmethod
    def _some_matcher(cls, matchers: dict[str, str]) -> dict[str, str]:
        if not matchers:  # a silence without matchers is refused by Alertmanager anyway
            raise ValueError('at least one matcher, e.g. ruleloop_target = "{target}"')
        return matchers


# Where pods get their addresses (RFC 1918, shared address space, IPv6 unique local): the
# default networks a discovered replica may be in.
POD_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")


class Target(_Section):
    """One inference deployment the bot can diagnose (and, with an actuator, change)."""

    vllm_url: str = Field(description="the engine's base URL (its /metrics is scraped)")
    replicas: list[str] = Field(
        default_factory=list,
        description="the base URLs of every engine serving the target (each one's /metrics is "
        "scraped and merged, docs/fleet.md); empty: the one engine at vllm_url",
    )
    prefill_replicas: list[str] = Field(
        default_factory=list,
        description="prefill/decode disaggregation: the base URLs of the prefill pool's engines "
        '(TTFT is judged on them, docs/fleet.md "Prefill and decode pools"); set with '
        "decode_replicas, never with replicas",
    )
    decode_replicas: list[str] = Field(
        default_factory=list,
        description="prefill/decode disaggregation: the base URLs of the decode pool's engines "
        "(TPOT is judged on them); set with prefill_replicas, never with replicas",
    )
    canary_replicas: list[str] = Field(
        default_factory=list,
        description="the base URLs of the canary Deployment's pods, beside the baseline "
        "replicas under the same traffic: `ruleloop canary-live` judges them against the "
        'others (docs/fleet.md "Live canary"); never also listed in replicas',
    )
    kubernetes_service: str | None = Field(
        default=None,
        description="`namespace/name` of a Kubernetes Service whose ready endpoints are the "
        "replicas (read from its EndpointSlices when a window starts, docs/fleet.md); "
        "`replicas` wins when both are set",
    )
    kubernetes_port: str | None = Field(
        default=None,
        description="the name of the Service port that serves vLLM; unset: the Service's only port",
    )
    kubernetes_networks: list[str] = Field(
        default_factory=lambda: list(POD_NETWORKS),
        description="the networks a discovered pod address must be in before the bot scrapes "
        "it (docs/fleet.md); a loopback, link-local (the cloud metadata address) or multicast "
        "address only when a network listed here lies inside that block",
    )
    kubernetes_max_replicas: int = Field(
        default=64, ge=1, le=1024,
        description="more ready endpoints than this and discovery is refused, nothing scraped",
    )  # fmt: skip
    kubernetes_api: KubernetesApiSpec = Field(default_factory=KubernetesApiSpec)
    inference_pool: str | None = Field(
        default=None,
        description="`namespace/name` of a Gateway API Inference Extension InferencePool (llm-d): "
        "its Ready pods are the replicas, on its target port, read when a window starts "
        '(docs/fleet.md "Behind an InferencePool"); `replicas` and `kubernetes_service` win '
        "when set; uses kubernetes_api, kubernetes_networks and kubernetes_max_replicas",
    )
    router_url: str | None = Field(
        default=None, pattern=r"^https?://[^/\s]+/?$",
        description="a vllm-router in front of the replicas: its workers (GET /workers) are "
        "the replicas, read when a window starts (docs/fleet.md \"Behind vllm-router\"); "
        "`replicas` and `kubernetes_service` win when set; addresses checked against "
        "kubernetes_networks",
    )  # fmt: skip
    step_budget: int | None = Field(
        default=None, ge=1, le=10_000_000,
        description="the engine's --max-num-batched-tokens, the most tokens one scheduler step "
        "carries: step readings are bounded by it (vLLM credits a chunked prompt's whole length "
        "to the step that completes it); unset: the step-mixing cause reads 'cannot tell'",
    )  # fmt: skip
    gateway_url: str | None = Field(
        default=None, description="the inference gateway: its counters join queue_cancel"
    )
    prometheus_url: str | None = Field(
        default=None, description="a Prometheus with the engine's history (prometheus probe)"
    )
    node: str | None = Field(
        default=None,
        description="the GPU node (without gpu_agent_url, NVML reads only the bot's own host)",
    )
    gpu_agent_url: str | None = Field(
        default=None,
        description="a `ruleloop agent` on the target's GPU host: the nvml probe reads it "
        "instead of the bot's own host (docs/agent.md)",
    )
    gpu_agent_token_file: Path | None = Field(
        default=None, description="file holding the agent's bearer token (a mounted Secret)"
    )
    gpu_agent_daemonset: str | None = Field(
        default=None,
        description="`namespace/name` of a DaemonSet of `ruleloop agent` pods: the nvml probe "
        "reads the agent on each replica's node (its Ready pod there, at its pod IP, checked "
        "against kubernetes_networks; docs/agent.md); replicas' nodes come from "
        "kubernetes_service or inference_pool, else `node`; gpu_agent_url wins when both are set",
    )
    gpu_agent_port: int = Field(
        default=9401, ge=1, le=65535,
        description="the port the gpu_agent_daemonset's agents listen on (`agent --listen`)",
    )  # fmt: skip
    actuator: ActuatorSpec | None = None
    canary: CanarySpec = Field(default_factory=CanarySpec)
    # after the canary, production traffic on the canary stage judged against the baseline
    live_stage: LiveStage | None = None
    # when a rule in force fails on the live workload: offer a re-tune, start one, or neither
    drift: DriftSpec = Field(default_factory=DriftSpec)
    silence: SilenceSpec | None = None
    # a second approver, not the requester, even with [remediation] allow_self_approval
    two_person: bool = False
    # bearer token of the gateway's /admin/limits, for ADRs with `fix.gateway` rules
    gateway_admin_token_file: Path | None = None

    @field_validator("vllm_url", "gateway_url", "prometheus_url", "gpu_agent_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http(s) URL like http://10.0.0.5:8000")
        return url.rstrip("/")

    @field_validator("replicas")
    @classmethod
    def _replica_urls(cls, urls: list[str]) -> list[str]:
        checked = [cls._http_url(url) for url in urls]
        if len(set(checked)) != len(checked):
            raise ValueError("a replica is listed twice")
        return [url for url in checked if url is not None]

    @field_validator("canary_replicas", "prefill_replicas", "decode_replicas")
    @classmethod
    def _canary_urls(cls, urls: list[str], info: ValidationInfo) -> list[str]:
        checked = [cls._http_url(url) for url in urls]
        if len(set(checked)) != len(checked):
            which = str(info.field_name).removesuffix("_replicas")
            raise ValueError(f"a {which} replica is listed twice: list each engine once")
        return [url for url in checked if url is not None]

    @model_validator(mode="after")
    def _two_pools(self) -> Target:
        # prefill/decode disaggregation: two pools, each judged on its own (docs/fleet.md)
        pools = {"prefill_replicas": self.prefill_replicas, "decode_replicas": self.decode_replicas}
        if not any(pools.values()):
            return self
        if self.replicas:
            raise ValueError(
                "replicas and prefill_replicas/decode_replicas both name the target's engines: "
                "list a prefill/decode target's engines only in its two pools"
            )
        for name, other in zip(pools, reversed(pools), strict=True):
            if not pools[name]:
                raise ValueError(
                    f"{other} is set but {name} is empty: a prefill/decode target has both "
                    f"pools; list that pool's engines in {name}, or every engine in replicas "
                    "for a fleet of like engines"
                )
        both = sorted(set(self.prefill_replicas) & set(self.decode_replicas))
        if both:
            named = ", ".join(urlsplit(u).netloc.rpartition("@")[2] for u in both)  # no secrets
            raise ValueError(
                f"{named} is in both prefill_replicas and decode_replicas: an engine serves one "
                "pool (its --kv-transfer-config kv_role); list it in its own pool only"
            )
        return self

    @field_validator("kubernetes_service", "inference_pool")
    @classmethod
    def _service_ref(cls, ref: str | None, info: ValidationInfo) -> str | None:
        if ref is None:
            return None
        namespace, slash, name = ref.partition("/")
        if not slash or not all(_KUBE_NAME.fullmatch(part) for part in (namespace, name)):
            kind = "a Service" if info.field_name == "kubernetes_service" else "an InferencePool"
            raise ValueError(
                f'{ref!r} is not `namespace/name` of {kind}, like "inference/vllm" '
                "(lowercase letters, digits and '-', at most 63 each)"
            )
        return ref

    @field_validator("gpu_agent_daemonset")
    @classmethod
    def _daemonset_ref(cls, ref: str | None) -> str | None:
        namespace, slash, name = (ref or "").partition("/")
        if ref is not None and not (slash and _KUBE_NAME.fullmatch(namespace)
                                    and _KUBE_NAME.fullmatch(name)):  # fmt: skip
            raise ValueError(
                f'{ref!r} is not `namespace/name` of a DaemonSet, like "inference/ruleloop-nvml-'
                "agent\" (lowercase letters, digits and '-', at most 63 each)"
            )
        return ref

    @field_validator("kubernetes_networks")
    @classmethod
    def _networks(cls, networks: list[str]) -> list[str]:
        checked = []
        for text in networks:
            try:
                checked.append(str(ipaddress.ip_network(text, strict=True)))
            except ValueError as exc:
                raise ValueError(
                    f'{text!r} is not a network like "10.0.0.0/8" or "fd00::/8" ({exc})'
                ) from None
        if not checked:
            raise ValueError("list at least one network, e.g. the cluster's pod CIDR")
        return checked

    @field_validator("kubernetes_port")
    @classmethod
    def _port_name(cls, name: str | None) -> str | None:
        if name is not None and not _KUBE_PORT_NAME.fullmatch(name):
            raise ValueError(
                f'{name!r} is not a Service port name like "http" (lowercase letters, '
                "digits and '-', at most 15); name the port in the Service's `ports`"
            )
        return name

    @model_validator(mode="after")
    def _port_needs_service(self) -> Target:
        if self.kubernetes_port is not None and self.kubernetes_service is None:
            raise ValueError("kubernetes_port names a port of kubernetes_service: set that too")
        return self

    @model_validator(mode="after")
    def _before_run_needs_actuator(self) -> Target:
        if self.canary.drift_before_run and self.actuator is None:
            raise ValueError(
                "canary.drift_before_run puts the replaced flags back through the target's "
                "actuator: configure [targets.NAME.actuator], or set drift_before_run = false"
            )
        if self.canary.drift_before_run and not _has_canary_stage(self.actuator):
            # without a canary stage the old flags would go on every pod serving production
            raise ValueError(
                "canary.drift_before_run puts the flags an ADR replaced back for one canary "
                "run, on the canary stage only, never on the pods serving production: give "
                "[targets.NAME.actuator] a canary (canary_deployment and canary_url for "
                "kubernetes; canary_locator, canary_url and cluster.canary_deployment for "
                "git), or set drift_before_run = false"
            )
        return self

    @model_validator(mode="after")
    def _live_stage_has_two_groups(self) -> Target:
        if self.live_stage is None:
            return self
        if not self.canary_replicas:
            raise ValueError(
                "live_stage judges the canary replicas against the baseline ones on production "
                "traffic: list the canary stage's pods in canary_replicas"
            )
        if isinstance(self.actuator, LocalActuatorSpec):
            return self._local_canary_listed(self.actuator)
        if self.actuator is None:
            raise ValueError(
                "live_stage needs a canary stage that serves beside the baseline: a Kubernetes "
                "canary Deployment (actuator canary_deployment), a git canary (canary_locator) "
                "or a second local engine (a local actuator's canary_url)"
            )
        if not _has_canary_stage(self.actuator):
            raise ValueError(
                "live_stage puts the change on the canary stage alone first: give "
                "[targets.NAME.actuator] a canary (canary_deployment and canary_url for "
                "kubernetes; canary_locator, canary_url and cluster.canary_deployment for git)"
            )
        return self

    def _local_canary_listed(self, actuator: LocalActuatorSpec) -> Target:
        """A local engine's live stage: its canary engine is the one canary replica."""
        if actuator.canary_url is None:
            raise ValueError(
                "live_stage on a local engine needs a second engine for the canary stage: set "
                "[targets.NAME.actuator] canary_url (e.g. http://127.0.0.1:8001) and run "
                "`ruleloop gateway --canary-upstream` with it, or remove "
                "[targets.NAME.live_stage]"
            )
        if [u.rstrip("/") for u in self.canary_replicas] != [actuator.canary_url.rstrip("/")]:
            raise ValueError(
                f"live_stage judges the canary engine: canary_replicas must be "
                f'["{actuator.canary_url}"], the actuator\'s canary_url'
            )
        return self

    @model_validator(mode="after")
    def _canary_apart_from_baseline(self) -> Target:
        # a URL in both groups would be judged against itself
        baseline = {*self.replicas, *self.prefill_replicas, *self.decode_replicas, self.vllm_url}
        both = sorted(set(self.canary_replicas) & baseline)
        if both:
            named = ", ".join(urlsplit(u).netloc.rpartition("@")[2] for u in both)  # no secrets
            raise ValueError(
                f"{named} is both a canary replica and a baseline one (replicas or "
                "vllm_url): list the canary Deployment's pods only in canary_replicas"
            )
        return self

    @property
    def metrics_url(self) -> str:
        """The engine's /metrics page."""
        return f"{self.vllm_url}/metrics"

    @property
    def hostport(self) -> str:
        """host:port of the engine, as Prometheus writes it in the `instance` label (never the
        URL's user info: it is matched against labels and written into Prometheus queries)."""
        return urlsplit(self.vllm_url).netloc.rpartition("@")[2]


def _has_canary_stage(actuator: ActuatorSpec | None) -> bool:
    """Whether a change through ``actuator`` can reach a canary stage alone. A local engine is
    one engine (a workstation's or the demo's): it is its own stage."""
    if isinstance(actuator, KubernetesActuatorSpec):
        return actuator.canary_deployment is not None
    if isinstance(actuator, GitActuatorSpec):
        return actuator.canary_locator is not None
    return True


class RemediationSettings(_Section):
    """How /apply-adr is approved: by someone other than the requester, unless opted out."""

    approval_ttl_s: float = Field(default=900.0, gt=0)  # approval buttons expire after this
    # a change held for a person (its canary could not decide, its ADR says inconclusive: hold)
    # is rolled back when nobody keeps or rolls it back within this
    hold_ttl_s: float = Field(default=1800.0, gt=0)
    allow_self_approval: bool = Field(
        default=False,
        description="opt-out of the two-person rule: true lets the requester approve their own "
        "change (targets with two_person and two_person_adrs still need two people); "
        "keep false in production",
    )
    two_person_adrs: list[str] = Field(default_factory=list)  # these ADRs always need two people
    heartbeat_s: float = Field(
        default=20.0, gt=0, description="a running change says it is alive this often"
    )
    stale_after_s: float = Field(
        default=90.0,
        gt=0,
        description="a running change silent this long (database time) is rolled back by "
        "another replica; keep it several heartbeats long",
    )

    @model_validator(mode="after")
    def _stale_after_heartbeats(self) -> RemediationSettings:
        if self.stale_after_s < 3 * self.heartbeat_s:
            raise ValueError(
                "stale_after_s must be at least 3 heartbeats (3 x heartbeat_s): one missed "
                "heartbeat must not look like a dead replica"
            )
        return self


class StoreSettings(_Section):
    """Where incidents live: a SQLAlchemy URL (SQLite file by default, PostgreSQL by URL)."""

    url: str | None = Field(
        default=None, description="e.g. postgresql+psycopg://user@db/ruleloop; unset: SQLite"
    )


class PathSettings(_Section):
    """Directories the bot reads at startup."""

    runbooks: Path = Field(
        default=Path("runbooks"),
        description="the YAML runbooks; unset and no runbooks/ where serve starts: the runbooks "
        "shipped with ruleloop",
    )
    adr: Path = Field(
        default=Path("adr"),
        description="the ADRs (drafts in its drafts/), imported into the store at start and when "
        "a file changes; never written (`ruleloop adr export` writes the store's). Unset and no "
        "adr/ where serve starts: the seed ADR shipped with ruleloop",
    )
    state: Path | None = Field(
        default=None, description="where the SQLite store goes; unset: serve's --state-dir"
    )


WEBHOOK_TOKEN_MIN = 16  # characters; `openssl rand -hex 32` makes 64
# the examples' and tutorials' stand-ins: a token anyone can guess
PLACEHOLDER_TOKENS = frozenset(
    {"replace-me", "replaceme", "changeme", "change-me", "changeme-changeme", "secret", "s3cret",
     "token", "password", "example", "xxxxxxxxxxxxxxxx", "your-token-here", "<token>"}
)  # fmt: skip


class AlertmanagerSettings(_Section):
    """The webhook's bearer token; unset means every webhook is refused."""

    token: SecretStr | None = Field(
        default=None,
        description="Alertmanager sends it as Authorization: Bearer <token>; at least "
        f"{WEBHOOK_TOKEN_MIN} characters, not a placeholder (`openssl rand -hex 32`)",
    )

    @field_validator("token")
    @classmethod
    def _guessable(cls, token: SecretStr | None) -> SecretStr | None:
        # a placeholder (the example Secret's `replace-me`) or a short token let anyone who
        # can reach /alertmanager open incidents; the value itself is never echoed
        if token is None:
            return None
        value = token.get_secret_value().strip()
        if value.lower() in PLACEHOLDER_TOKENS or "replace-me" in value.lower():
            raise ValueError(
                "is a placeholder from an example: set a random token "
                "(`openssl rand -hex 32`) in RULELOOP_ALERTMANAGER_TOKEN and in Alertmanager"
            )
        if len(value) < WEBHOOK_TOKEN_MIN:
            raise ValueError(
                f"is {len(value)} characters; use at least {WEBHOOK_TOKEN_MIN} "
                "(`openssl rand -hex 32`)"
            )
        return token


class ServerSettings(_Section):
    """Where `ruleloop serve` listens, and how it logs."""

    host: str = Field(default="127.0.0.1", description="0.0.0.0 in a container")
    port: int = Field(default=3000, ge=0, lt=65536, description="0: any free port")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="the log on stderr: text (a line for a person) or json (one JSON object "
        "per line, with incident_id and change_id where known: for a log collector)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="the bot's own log lines (loggers ruleloop.* and bot.*); libraries log "
        "warnings and errors only (RULELOOP_DEBUG=1: everything at debug)",
    )
    max_body_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        description="the largest request body /slack/events and /alertmanager read; "
        "a larger one is answered 413 before more is read",
    )
    max_diagnoses: int = Field(
        default=32, ge=1, le=1024,
        description="diagnoses a replica runs at once; past it a new incident's diagnosis is "
        "left owed and the outbox job runs it later (ruleloop_background_shed_total counts them)",
    )  # fmt: skip
    max_deliveries: int = Field(
        default=64, ge=1, le=4096,
        description="incidents a replica delivers Slack messages for at once; past it the "
        "messages stay owed and the outbox job sends them (ruleloop_background_shed_total)",
    )  # fmt: skip


class TracingSettings(_Section):
    """OpenTelemetry traces of an alert's path and a change's (docs/operations.md, "Traces"),
    sent by OTLP over HTTP/protobuf; off unless ``otlp_endpoint`` is set."""

    otlp_endpoint: str | None = Field(
        default=None,
        description="the collector's OTLP/HTTP base URL (http://otel-collector:4318): spans go "
        "to its /v1/traces; unset: no traces (no exporter, nothing sent)",
    )
    service_name: str = Field(
        default="ruleloop", min_length=1, description="the traces' service.name"
    )
    sample_ratio: float = Field(
        default=1.0, ge=0.0, le=1.0,
        description="the share of alerts and changes traced (a trace is kept or dropped whole)",
    )  # fmt: skip
    timeout_s: float = Field(
        default=10.0, gt=0, le=60,
        description="one export's deadline, retries included; a collector that does not answer "
        "costs spans (logged), never an alert",
    )  # fmt: skip

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if not url:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http(s) URL (e.g. http://otel-collector:4318)")
        return url.rstrip("/")


class WebSettings(_Section):
    """The incident page (`/incidents/<id>`): read-only, reached only through signed links."""

    public_url: str | None = Field(
        default=None,
        description="the bot as people's browsers reach it (https://ruleloop.example.com); "
        "set: Slack messages link to each incident's page",
    )
    link_secret: SecretStr | None = Field(
        default=None,
        description="signs page links (HMAC-SHA256), at least 32 characters (e.g. `openssl "
        "rand -hex 32`); the same on every replica; unset: no page is served",
    )
    link_ttl_s: float = Field(
        default=14 * 86400.0,
        gt=0,
        le=366 * 86400.0,
        description="how long a link stays valid; a root message carries a fresh one each "
        "time it is updated",
    )

    @field_validator("public_url")
    @classmethod
    def _base_url(cls, url: str | None) -> str | None:
        if not url:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise ValueError(f"{url!r} is not a base URL like https://ruleloop.example.com")
        return url.rstrip("/")

    @field_validator("link_secret")
    @classmethod
    def _long_secret(cls, secret: SecretStr | None) -> SecretStr | None:
        value = "" if secret is None else secret.get_secret_value().strip().lower()
        if value in PLACEHOLDER_TOKENS or "replace-me" in value:  # anyone could sign a link
            raise ValueError(
                "is a placeholder from an example: set a random secret (`openssl rand -hex 32`) "
                "in RULELOOP_WEB_SECRET, the same on every replica"
            )
        if secret is not None and len(secret.get_secret_value()) < 32:
            raise ValueError("must be at least 32 characters (e.g. `openssl rand -hex 32`)")
        return secret

    @model_validator(mode="after")
    def _links_need_a_secret(self) -> WebSettings:
        if self.public_url and self.link_secret is None:
            raise ValueError(
                "public_url is set but link_secret is not: set RULELOOP_WEB_SECRET (at least "
                "32 characters, the same on every replica) so page links can be signed"
            )
        return self


class AdrPublishSettings(GitRepoSpec):
    """Accepted ADRs as pull requests to the team's repository: accepting a draft in Slack
    opens one that adds the ADR's file (optional; unset: ADRs stay in the store)."""

    directory: str = Field(
        default="adr", description="the ADR directory, relative to the repository root"
    )

    @field_validator("directory")
    @classmethod
    def _inside(cls, directory: str) -> str:
        return _repo_path(directory)


class ScheduledTarget(_Section):
    """One target's overrides of the scheduler (intervals in seconds; 0 turns the job off)."""

    baseline_every_s: float | None = Field(default=None, ge=0)
    snapshot_every_s: float | None = Field(default=None, ge=0)
    workload_every_s: float | None = Field(default=None, ge=0)
    adrs: list[str] = Field(default_factory=list)  # in force here while none was promoted here


class SchedulerSettings(_Section):
    """Scheduled jobs (intervals in seconds, 0 turns a job off); replicas share them by lease."""

    enabled: bool = True
    baseline_every_s: float = Field(default=3600.0, ge=0)  # canary vs the ADRs in force
    snapshot_every_s: float = Field(default=300.0, ge=0)  # the numbers kept as "normal"
    snapshot_window_s: float = Field(default=10.0, gt=0, le=600)
    # the live workload shape vs the shape each ADR in force was measured under (docs/workload.md)
    workload_every_s: float = Field(default=300.0, ge=0)
    workload_window_s: float = Field(default=60.0, gt=0, le=3600)
    normal_of_last: int = Field(default=12, ge=1)  # "normal" is the median of these snapshots
    draft_reminder_after_s: float = Field(default=86400.0, gt=0)
    draft_reminder_every_s: float = Field(default=900.0, ge=0)
    approval_sweep_every_s: float = Field(default=30.0, ge=0)
    outbox_every_s: float = Field(default=15.0, ge=0)  # Slack messages still owed, sent again
    lease_ttl_s: float = Field(default=60.0, gt=0)  # a silent replica's job is taken over after
    targets: dict[str, ScheduledTarget] = Field(default_factory=dict)


class DeliverySettings(_Section):
    """How long the bot keeps trying to post a message Slack did not take (seconds)."""

    retry_first_s: float = Field(
        default=5.0, gt=0, description="the wait after a first failed try; doubled per try"
    )
    retry_max_s: float = Field(
        default=300.0,
        gt=0,
        description="the longest wait between tries (Slack's Retry-After wins when longer)",
    )
    give_up_after_s: float = Field(
        default=86400.0,
        gt=0,
        description="a message not delivered this long after it was "
        "owed is marked failed (an Alertmanager repeat of its incident tries it again)",
    )


class Settings(_Section):
    """Everything the bot is configured with."""

    slack: SlackSettings = Field(default_factory=SlackSettings)
    access: AccessSettings = Field(default_factory=AccessSettings)
    targets: dict[str, Target] = Field(default_factory=dict)
    default_target: str | None = Field(
        default=None, description="the target when none is named; unset: the first one"
    )
    store: StoreSettings = Field(default_factory=StoreSettings)
    paths: PathSettings = Field(default_factory=PathSettings)
    alertmanager: AlertmanagerSettings = Field(default_factory=AlertmanagerSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    remediation: RemediationSettings = Field(default_factory=RemediationSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    web: WebSettings = Field(default_factory=WebSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    adr_publish: AdrPublishSettings | None = None

    @field_validator("default_target")
    @classmethod
    def _no_blank(cls, name: str | None) -> str | None:
        return name or None

    def database_url(self, *, fallback_dir: Path) -> str:
        """The store URL: the configured one, else a SQLite file in the state directory."""
        if self.store.url:
            return self.store.url
        state = self.paths.state or fallback_dir
        return f"sqlite:///{state / 'ruleloop.db'}"

    def target(self, name: str | None) -> tuple[str, Target]:
        """The named target (or the default one); UsageError that lists the known names."""
        chosen = name or self.default_target or (next(iter(self.targets)) if self.targets else None)
        if chosen is None or chosen not in self.targets:
            known = ", ".join(sorted(self.targets)) or "none configured"
            what = f"unknown target {_shown(chosen)}" if chosen else "no target given"
            raise UsageError(f"{what}; known targets: {known}")
        return chosen, self.targets[chosen]

    @classmethod
    def load(cls, environ: Mapping[str, str], *, path: Path | None = None) -> Settings:
        """Settings from a TOML file (``path`` or $RULELOOP_CONFIG), then the environment on top."""
        file = path or (Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None)
        data: dict[str, Any] = read_toml(file) if file is not None else {}
        for var, (section, key) in ENV_KEYS.items():
            if environ.get(var):
                data.setdefault(section, {})[key] = environ[var]
        try:
            settings = cls.model_validate(data)
        except ValidationError as exc:
            raise UsageError(
                f"bad configuration{f' in {file}' if file else ''}: {_why(exc)}"
            ) from None
        if settings.default_target and settings.default_target not in settings.targets:
            raise UsageError(f"default_target {settings.default_target!r} is not in [targets]")
        return settings


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; UsageError naming the file when it is missing or malformed."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config {path} is not valid TOML: {exc}") from None


def _why(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" + (
        f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    )


def _shown(name: str, limit: int = 64) -> str:
    """A typed name, quoted, cut at ``limit`` (a 100 KB /diagnose argument came back whole)."""
    if len(name) <= limit:
        return repr(name)
    return f"{name[:limit]!r}… ({len(name):,} characters)"
