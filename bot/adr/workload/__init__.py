"""Workload shapes: what the traffic on an engine looks like, stored as a small versioned file
(``shape``), compared (``diff``) to say when production drifted from the shape a decision was
measured under, and put in words (``describe``) (docs/workload.md).

A shape is captured in bot/diagnosis/probes/ (``workload_capture`` from the engines' own /metrics,
``prometheus_capture`` from Prometheus, ``gateway_capture`` from the gateway's records): capture
scrapes and windows /metrics the way the probes do, and this package sits below them."""
