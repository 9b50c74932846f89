"""Runs vLLM's own `vllm bench serve` (the peer) and records the CPU its load phase used.

Usage: python bench/_vllm_bench_serve_peer.py OUT.json -- <vllm bench serve flags>
The peer is driven through its public `add_cli_args` / `main`; its `benchmark` coroutine is
wrapped only to read this process's CPU time around the load, which the peer does not report.
"""

from __future__ import annotations

import json
import sys
import time

from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main() -> None:
    """Run the peer once and write its numbers plus load-phase CPU seconds to OUT.json."""
    out, flags = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
    measured: dict[str, float] = {}
    original = serve.benchmark

    async def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            measured["cpu_s"] = time.process_time() - cpu0
            measured["wall_s"] = time.perf_counter() - wall0

    serve.benchmark = timed
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    result = serve.main(parser.parse_args(flags))
    keep = {k: v for k, v in result.items() if isinstance(v, int | float | str)}
    with open(out, "w") as fh:
        json.dump(keep | measured, fh, indent=2)


if __name__ == "__main__":
    main()
