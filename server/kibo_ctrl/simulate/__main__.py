"""`python -m kibo_ctrl.simulate --seed N --steps M`: exit 0 when every invariant held, 1
when one broke (printing the shrunk history and the command that replays it). The last
line is `seed N steps M hash H`."""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time

from .run import shrink, simulate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kibo_ctrl.simulate", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="the seed (default: a random one, printed)")
    parser.add_argument("--steps", type=int, default=1000, help="steps of workload and faults per seed")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run this many seeds from --seed on, stopping at the first failure (a soak)",
    )
    parser.add_argument(
        "--no-warp",
        action="store_true",
        help="run every idle heartbeat tick instead of skipping them (the same history, slower)",
    )
    parser.add_argument("--no-shrink", action="store_true", help="print the full failing history")
    parser.add_argument("--shrink-runs", type=int, default=200, help="at most this many reruns to shrink a failure")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    status = 0
    for seed in range(first, first + args.seeds):
        began = time.perf_counter()
        outcome = simulate(seed, args.steps, warp=not args.no_warp)
        took = time.perf_counter() - began
        if not outcome.ok:
            status = 1
            where = "the final settle" if outcome.failed_step == outcome.steps else f"step {outcome.failed_step}"
            print(f"failed at {where} of {args.steps} ({took:.1f} s)")
            history = outcome.history
            if not args.no_shrink:
                keep, shrunk = shrink(seed, args.steps, outcome, budget=args.shrink_runs, warp=not args.no_warp)
                print(f"shrunk to {len(keep)} of {args.steps} steps: {keep}")
                history = shrunk.history
                print(f"violation (shrunk run): {shrunk.violation}")
            print("\n".join(history))
            print(f"violation: {outcome.violation}")
            print(f"replay: python -m kibo_ctrl.simulate --seed {seed} --steps {args.steps}")
        else:
            rate = args.steps / took if took else 0.0
            print(f"ok: {args.steps} steps, {outcome.virtual_s:.0f} virtual s, {took:.2f} s wall, {rate:.0f} steps/s")
        print(f"seed {seed} steps {args.steps} hash {outcome.digest}")
        if status:
            break
    return status


if __name__ == "__main__":
    # String hashing is salted per process, and the engine iterates sets of IDs: a replay in
    # a new process takes the same order only with a fixed salt.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "kibo_ctrl.simulate", *sys.argv[1:]])
    sys.exit(main())
