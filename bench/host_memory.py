"""Huge pages for XLA:CPU's buffers, on and off, side by side in one run.

With ``LEARNER_HUGE_PAGES=1`` the learner's commands start again with
``glibc.malloc.hugetlb=1`` in ``GLIBC_TUNABLES`` (``learner.training.host_memory``).
A tunable is read when a process starts, so each setting runs in a process of its own: ``bench/learner.py --no-long``
(the GRPO step of the tiny and the ~50M config, and with a KL term the reference's
forward inside the step and as a program of its own) and ``bench/decode.py`` (the
embedded engine's generation), off then on, ``--rounds`` times, alternated. For each
process: its figures, its user and system CPU seconds, its minor page faults and its
peak resident memory (``wait4``).

    python bench/host_memory.py [--rounds 1] [--steps 4] [--decode-rows 128]

Final line: {"bench": "host_memory", "tunable", "thp", "glibc", "runs": [...],
"learner": {config: {"off", "on", "ratio"}}, "reference": {...}, "decode": {...},
"minor_faults", "sys_s", "peak_rss_gib": {"off", "on": {script: median}}} where each ratio is
on / off of the medians over rounds: tokens/s (higher is better) for the learner,
seconds for decode (lower is better).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from learner.training import host_memory  # noqa: E402


def env_for(setting: str) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GLIBC_TUNABLES", host_memory.HUGE_PAGES_ENV, host_memory.ENV)
    }
    if setting == "off":
        return base
    env = host_memory.huge_pages_env({**base, host_memory.HUGE_PAGES_ENV: "1"})
    if env is None:
        raise SystemExit(
            f"huge pages cannot be turned on here (glibc {host_memory.glibc_version()}, "
            f"transparent huge pages {host_memory.thp_mode()}): nothing to compare"
        )
    return env


def run(setting: str, args: list[str]) -> dict:
    """One bench script in a process of its own: its final JSON line and, from ``wait4``,
    its CPU seconds, minor page faults and peak resident memory."""
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=REPO, env=env_for(setting), stdout=out, stderr=err
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} ({setting}) failed:\n{stderr[-2000:]}")
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return {
        "setting": setting,
        "script": args[0],
        "result": json.loads(lines[-1]),
        "wall_s": round(time.perf_counter() - t, 1),
        "user_s": round(usage.ru_utime, 2),
        "sys_s": round(usage.ru_stime, 2),
        "minor_faults": usage.ru_minflt,
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),  # ru_maxrss is in KiB
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1, help="off/on pairs of each script")
    ap.add_argument("--steps", type=int, default=4, help="bench/learner.py --steps")
    ap.add_argument("--decode-rows", type=int, default=128, help="bench/decode.py --rows")
    a = ap.parse_args()
    scripts = [
        ["bench/learner.py", "--no-long", "--steps", str(a.steps)],
        ["bench/decode.py", "--rows", str(a.decode_rows), "--model", "peer"],
    ]
    runs = []
    for r in range(a.rounds):
        for script in scripts:
            for setting in ("off", "on"):
                got = run(setting, script)
                runs.append(got)
                print(
                    f"round {r} {script[0]} {setting}: wall {got['wall_s']} s, user "
                    f"{got['user_s']} s, sys {got['sys_s']} s, faults {got['minor_faults']}, "
                    f"peak {got['peak_rss_gib']} GiB",
                    file=sys.stderr, flush=True,
                )  # fmt: skip

    def med(setting, script, pick):
        """The median over rounds of ``pick(run)`` for one script and setting."""
        return statistics.median(
            pick(x) for x in runs if x["setting"] == setting and x["script"] == script
        )

    def pair(script, pick, higher_is_better=True):
        """Off, on and on / off of ``pick(result)``, the script's final JSON line."""
        off = med("off", script, lambda x: pick(x["result"]))
        on = med("on", script, lambda x: pick(x["result"]))
        return {"off": round(off, 3), "on": round(on, 3), "ratio": round(on / off, 3),
                "better": "higher" if higher_is_better else "lower"}  # fmt: skip

    learner = "bench/learner.py"
    names = [c["name"] for c in runs[0]["result"]["configs"]]

    def config(name):
        return lambda res: next(c for c in res["configs"] if c["name"] == name)["tokens_per_s"]

    def reference(name, key):
        return lambda res: next(c for c in res["reference"] if c["name"] == name)[key]

    decode_rows = runs[-1]["result"]["rows"]
    result = {
        "bench": "host_memory",
        "tunable": host_memory.HUGE_PAGES_TUNABLE,
        "thp": host_memory.thp_mode(),
        "glibc": ".".join(map(str, host_memory.glibc_version() or ())),
        "cpus": os.cpu_count(),
        "runs": [{k: v for k, v in x.items() if k != "result"} for x in runs],
        "learner": {n: pair(learner, config(n)) for n in names},
        "reference": {
            n: {
                "inside": pair(learner, reference(n, "inside_tokens_per_s")),
                "separate": pair(learner, reference(n, "separate_tokens_per_s")),
            }
            for n in names
        },
        "decode": {
            str(row["rows"]): pair(
                "bench/decode.py",
                lambda res, i=i: res["rows"][i]["engine_s"],
                higher_is_better=False,
            )
            for i, row in enumerate(decode_rows)
        },
        **{
            key: {
                s: {
                    script: med(s, script, lambda x, key=key: x[key])
                    for script in (learner, "bench/decode.py")
                }
                for s in ("off", "on")
            }
            for key in ("minor_faults", "sys_s", "peak_rss_gib")
        },
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
