"""Actuators: local engine processes, a Kubernetes Deployment, or a dry run."""
