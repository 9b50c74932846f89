"""Fuzz: no body reaching the Alertmanager webhook parser crashes it; each bad one is a 4xx."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.incidents.intake.models import MAX_DEPTH, Webhook, parse_webhook
from bot.kernel.errors import RequestRejected
from tests.fakes.alerts import alert, payload
from tests.fuzzing import examples

pytestmark = pytest.mark.faults

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
LABELS = st.dictionaries(st.text(max_size=20), st.text(max_size=40) | JSON, max_size=4)
ALERT = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["firing", "resolved", "", "x"]) | JSON,
        "labels": LABELS, "annotations": LABELS,
        "startsAt": st.sampled_from(["2026-11-30T02:00:00Z", "0001-01-01T00:00:00Z", "yesterday"])
        | JSON,
        "endsAt": st.sampled_from(["0001-01-01T00:00:00Z", "2026-13-40T99:00:00Z"]) | JSON,
        "fingerprint": st.text(max_size=80) | JSON, "generatorURL": st.text(max_size=40),
    },
)  # fmt: skip
WEBHOOK = st.fixed_dictionaries(
    {},
    optional={
        "version": st.sampled_from(["4", "3", 4]) | JSON, "groupKey": st.text(max_size=300) | JSON,
        "status": st.sampled_from(["firing", "resolved"]) | JSON, "receiver": st.text(max_size=20),
        "groupLabels": LABELS, "commonLabels": LABELS, "commonAnnotations": LABELS,
        "externalURL": st.text(max_size=30), "truncatedAlerts": st.integers() | JSON,
        "alerts": st.lists(ALERT, max_size=3) | JSON,
    },
)  # fmt: skip
BODIES = (
    st.binary(max_size=200)
    | JSON.map(lambda v: json.dumps(v).encode())
    | WEBHOOK.map(lambda v: json.dumps(v).encode())
)


@settings(max_examples=examples(2_000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODIES)
def test_every_body_is_a_webhook_or_a_clear_4xx(body: bytes) -> None:
    try:
        parsed = parse_webhook(body)
    except RequestRejected as exc:
        assert exc.status in (400, 422) and str(exc)
    else:
        assert isinstance(parsed, Webhook)


# Issue 31 item 5: a valid webhook with a deep extra field, strings of brackets beside it.
NESTED = st.tuples(
    st.integers(0, 3000),
    st.sampled_from([("[", "]"), ('{"k":', "}")]),
    st.text('[]{}"\\', max_size=30),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nested=NESTED)
def test_nesting_past_the_limit_is_a_400_and_within_it_is_read(
    nested: tuple[int, tuple[str, str], str],
) -> None:
    levels, (opening, closing), text = nested
    sent = payload(alert(summary=text))
    head = json.dumps(sent)[:-1]
    body = f'{head}, "x": {opening * levels}1{closing * levels}}}'.encode()
    try:
        parse_webhook(body)
    except RequestRejected as exc:
        assert levels + 1 > MAX_DEPTH and exc.status == 400 and "nested too deeply" in str(exc)
    else:
        assert levels + 1 <= MAX_DEPTH
