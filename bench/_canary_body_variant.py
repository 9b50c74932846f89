"""Runs the canary CLI with its request body changed one field at a time (the A/B bench's arms).

Usage: python bench/_canary_body_variant.py VARIANT -- <latency_checker flags>
VARIANT is a JSON object: each key is set in every request body, a null value removes the key
(e.g. '{"temperature": null}'); ``prompt_ids: [LO, HI]`` moves every prompt token id into
LO..HI-1 (which tokens the prompt holds; the canary's are 100-249). The canary is otherwise
the real CLI: only ``PromptFactory.body`` is wrapped, so the A/B bench can price what each
field costs the engine.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from bot.app.cli.canary import canary
from bot.canary import workload


def main() -> None:
    """Wrap the body builder with VARIANT, then run the canary CLI with the given flags."""
    variant: dict[str, Any] = json.loads(sys.argv[1])
    flags = sys.argv[sys.argv.index("--") + 1 :]
    original = workload.PromptFactory.body

    def body(self: workload.PromptFactory, *args: Any, **kwargs: Any) -> dict[str, object]:
        out = original(self, *args, **kwargs)
        for key, value in variant.items():
            if key == "prompt_ids":
                low, high = value
                out["prompt"] = [low + i % (high - low) for i in out["prompt"]]  # type: ignore
            elif value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out

    workload.PromptFactory.body = body  # type: ignore[method-assign]
    canary(args=flags, prog_name="python -m latency_checker")


if __name__ == "__main__":
    main()
