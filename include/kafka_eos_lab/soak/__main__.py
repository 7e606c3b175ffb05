"""``python -m kafka_eos_lab.soak`` (``make soak``): a soak of ``SOAK_MINUTES`` (default 60) with the
faults of ``SOAK_SEED`` (default: a new seed, printed); exits 1 unless every audit number is zero.
The report (tables and the lag chart) goes to ``.local/soak/<time>/report``."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from kafka_eos.paths import local_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kafka_eos_lab.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES") or 60))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED") or random.randrange(1, 10**6)))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SOAK_PORT") or 19600),
                        help="the first of the ports it binds on 127.0.0.1 (11 ports from here)")
    args = parser.parse_args(argv)
    from kafka_eos_lab.soak.run import run

    home = local_dir() / "soak" / time.strftime("%Y%m%dT%H%M%S")
    print(f"soak: seed {args.seed} (SOAK_SEED={args.seed} repeats its faults), {args.minutes:g} min, under {home}",
          flush=True)
    result = run(home, args.minutes, args.seed, args.port, say=lambda line: print(line, flush=True))
    print(result.report.read_text())
    print(f"soak: {'passed' if result.passed else 'FAILED'}; report {result.report}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
