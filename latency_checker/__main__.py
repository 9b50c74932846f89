"""Entry point for `python -m latency_checker` (same flags and exit codes as `ruleloop canary`)."""

from bot.app.cli.canary import canary

if __name__ == "__main__":
    canary(prog_name="python -m latency_checker")
