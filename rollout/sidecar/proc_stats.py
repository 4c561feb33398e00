"""CPU seconds per process and per kind of process in a process tree, read from /proc.

A rollout sidecar is several processes: the sidecar's own Python process (the
engine, the tokenizer, the egress proxy, which runs on the sidecar's event loop,
and Playwright's client side), Playwright's Node.js driver, each pooled Chromium
(its main process, its zygotes, a renderer per page, GPU and utility helpers)
and the local web (``python -m rollout.web``, a child unless ``web.url`` names
one). :class:`TreeSampler` polls the tree of a root process in a thread and,
over a measured window, sums each process's own CPU time (user + system) by
kind. Short-lived processes (renderers live one episode) are sampled until they
exit; the CPU they used after their last sample is recovered from their
parent's reaped-children times (``cutime`` + ``cstime``) and booked to their kind.
The sampler thread's own CPU is subtracted from the root's.

Linux only (it reads ``/proc``); no dependency.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
KINDS = ("sidecar", "playwright_driver", "browser", "renderer", "gpu_utility", "web", "other")


@dataclass
class _Stat:
    ppid: int
    start: int  # clock ticks after boot
    own: float  # utime + stime, seconds
    reaped: float  # cutime + cstime, seconds: children that exited and were waited for
    rss: int  # bytes


def read_stat(pid: int) -> _Stat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state) of proc(5); utime is field 14 -> index 11
    if fields[0] in (b"Z", b"X"):
        return None  # exited, not yet reaped: its parent's cutime gets its time on reaping
    return _Stat(
        ppid=int(fields[1]),
        start=int(fields[19]),
        own=(int(fields[11]) + int(fields[12])) / CLK_TCK,
        reaped=(int(fields[13]) + int(fields[14])) / CLK_TCK,
        rss=int(fields[21]) * PAGE,
    )


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def classify(cmd: list[str], parent_kind: str | None, parent_cmd: list[str]) -> str:
    """The kind of a process of a sidecar's tree from its command line (and its parent's)."""
    line = " ".join(cmd)
    if parent_kind == "web" or "rollout.web" in cmd:
        return "web"
    if "playwright" in line and ("driver" in line or "node" in line):
        return "playwright_driver"
    if "chrom" in line:
        for a in line.split():  # Chromium's helpers rewrite argv as one space-joined string
            if a.startswith("--type="):
                t = a[len("--type=") :]
                if t == "renderer":
                    return "renderer"
                if t == "zygote":
                    return "browser"  # the browser's fork server
                return "gpu_utility"  # gpu-process, utility (network service, storage), ...
        return "browser"  # the main process (and the /usr/bin wrapper's shell)
    if not cmd:  # exited before its command line was read: a zygote forks renderers
        return "renderer" if "--type=zygote" in " ".join(parent_cmd) else (parent_kind or "other")
    if cmd and cmd[0].endswith("sh") and parent_kind == "sidecar":
        return "browser"  # /usr/bin/chromium-headless-shell is a sh wrapper
    return parent_kind if parent_kind not in (None, "sidecar") else "other"


@dataclass
class _Proc:
    pid: int
    start: int
    kind: str
    cmd: list[str]
    ppid: int
    base_own: float = 0.0
    base_reaped: float = 0.0
    own: float = 0.0
    reaped: float = 0.0
    alive: bool = True


@dataclass
class Window:
    """CPU over one measured window, by kind and by process."""

    wall_s: float
    cpu_s: dict[str, float]  # kind -> CPU seconds (own time of its processes + reaped gap)
    processes: dict[str, int]  # kind -> processes seen
    busiest_s: dict[str, float]  # kind -> the most CPU seconds one process of it used
    sampler_cpu_s: float  # the sampler thread's own CPU, taken off the root's
    unsampled_s: float = 0.0  # part of cpu_s recovered from parents' reaped times
    peak_rss_bytes: int = 0
    per_process: list[tuple[int, str, float]] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(self.cpu_s.values())


class TreeSampler:
    """Polls the tree under ``root`` (default: this process) every ``interval_s`` seconds.

    ``with TreeSampler() as s: w0 = s.mark(); ...; window = s.window(w0)``
    """

    def __init__(self, root: int | None = None, interval_s: float = 0.1) -> None:
        self.root = root if root is not None else os.getpid()
        self.interval_s = interval_s
        self.peak_rss = 0
        self._procs: dict[tuple[int, int], _Proc] = {}  # (pid, start ticks) -> process
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler_cpu = 0.0
        self._t = threading.Thread(target=self._run, daemon=True, name="tree-sampler")
        self._in_sampler = self.root == os.getpid()

    def __enter__(self) -> TreeSampler:
        self.sample()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            t0 = time.thread_time()
            self.sample()
            self._sampler_cpu += time.thread_time() - t0

    def sample(self) -> None:
        stats: dict[int, _Stat] = {}
        for d in os.listdir("/proc"):
            if d.isdigit() and (s := read_stat(int(d))) is not None:
                stats[int(d)] = s
        with self._lock:
            live = {}
            by_pid = {p.pid: p for p in self._procs.values() if p.alive}
            todo = [self.root]
            seen_tree = set()
            children: dict[int, list[int]] = {}
            for pid, s in stats.items():
                children.setdefault(s.ppid, []).append(pid)
            rss = 0
            while todo:
                pid = todo.pop()
                if pid in seen_tree or pid not in stats:
                    continue
                seen_tree.add(pid)
                s = stats[pid]
                rss += s.rss
                key = (pid, s.start)
                p = self._procs.get(key)
                if p is None:
                    parent = by_pid.get(s.ppid)
                    cmd = _cmdline(pid)
                    kind = (
                        "sidecar"
                        if pid == self.root
                        else classify(cmd, parent.kind if parent else None,
                                      parent.cmd if parent else [])
                    )  # fmt: skip
                    p = _Proc(pid, s.start, kind, cmd, s.ppid)
                    self._procs[key] = p
                    by_pid[pid] = p
                p.own, p.reaped, p.ppid = s.own, s.reaped, s.ppid
                live[key] = p
                todo.extend(children.get(pid, ()))
            for key, p in self._procs.items():
                p.alive = key in live
            self.peak_rss = max(self.peak_rss, rss)

    def mark(self) -> dict:
        """The start of a window: every live process's CPU so far."""
        self.sample()
        with self._lock:
            return {
                "t": time.monotonic(),
                "ticks": _uptime_ticks(),
                "sampler": self._sampler_cpu,
                "base": {k: (p.own, p.reaped) for k, p in self._procs.items() if p.alive},
                "peak_rss_reset": self._reset_peak(),
            }

    def _reset_peak(self) -> int:
        old, self.peak_rss = self.peak_rss, 0
        return old

    def window(self, mark: dict) -> Window:
        """CPU used since ``mark``, by kind."""
        self.sample()
        with self._lock:
            base = mark["base"]
            cpu: Counter[str] = Counter()
            count: Counter[str] = Counter()
            busiest: dict[str, float] = {}
            rows = []
            in_window = []
            for key, p in self._procs.items():
                if key in base:
                    b_own, b_reaped = base[key]
                elif p.start >= mark["ticks"] - 1:  # born in the window
                    b_own = b_reaped = 0.0
                else:
                    continue  # gone before the window began
                in_window.append((key, p, b_own, b_reaped))
                own = max(0.0, p.own - b_own)
                if p.pid == self.root and self._in_sampler:
                    own = max(0.0, own - (self._sampler_cpu - mark["sampler"]))
                cpu[p.kind] += own
                count[p.kind] += 1
                busiest[p.kind] = max(busiest.get(p.kind, 0.0), own)
                rows.append((p.pid, p.kind, round(own, 3)))
            # Exited children: their parent's reaped time grew by all they used; what the
            # samples missed (the last interval of their lives) is booked to their kind.
            unsampled = 0.0
            by_parent: dict[int, list] = {}
            for _, p, b_own, b_reaped in in_window:
                by_parent.setdefault(p.ppid, []).append((p, b_own, b_reaped))
            for _, p, _, b_reaped in in_window:
                grown = p.reaped - b_reaped
                if grown <= 0:
                    continue
                gone = [(c, bo, br) for c, bo, br in by_parent.get(p.pid, []) if not c.alive]
                seen = sum((c.own - bo) + (c.reaped - br) for c, bo, br in gone)
                gap = grown - seen
                if gap <= 0.005:
                    continue
                kinds = Counter(c.kind for c, _, _ in gone)
                kind = kinds.most_common(1)[0][0] if kinds else (
                    "renderer" if "--type=zygote" in " ".join(p.cmd) else p.kind
                )  # fmt: skip
                cpu[kind] += gap
                unsampled += gap
            rows.sort(key=lambda r: -r[2])
            return Window(
                wall_s=time.monotonic() - mark["t"],
                cpu_s={k: round(v, 4) for k, v in cpu.items()},
                processes=dict(count),
                busiest_s={k: round(v, 4) for k, v in busiest.items()},
                sampler_cpu_s=round(self._sampler_cpu - mark["sampler"], 4),
                unsampled_s=round(unsampled, 4),
                peak_rss_bytes=self.peak_rss,
                per_process=rows,
            )


def _uptime_ticks() -> int:
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * CLK_TCK)
