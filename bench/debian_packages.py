"""How many Debian packages `make setup` installs on a fresh machine, with and without
the recommended packages, by asking apt (simulation, nothing installed).

A fresh machine is modelled by a dpkg status holding only this machine's packages of
priority "required" (and the Essential ones), python3 and ca-certificates, with their
dependencies: about what a minimal Debian image has. apt then resolves the Makefile's
package list against it. Prints one JSON line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ("python3", "ca-certificates")


def makefile_packages() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    m = re.search(r"^DEBIAN_PACKAGES := (.*)$", text, re.M)
    return [*m.group(1).split(), "python3-venv"]


def minimal_status(status: str) -> tuple[str, int]:
    stanzas = {}
    for s in status.strip().split("\n\n"):
        m = re.search(r"^Package: (\S+)$", s, re.M)
        if m:
            stanzas[m.group(1)] = s

    def deps(s: str) -> list[str]:
        out = []
        for f in ("Depends", "Pre-Depends"):
            m = re.search(rf"^{f}: (.*)$", s, re.M)
            for alt in m.group(1).split(",") if m else []:
                names = [a.strip().split()[0].split(":")[0] for a in alt.split("|")]
                out += [n for n in names if n in stanzas][:1]
        return out

    keep = {
        p
        for p, s in stanzas.items()
        if re.search(r"^(Priority: required|Essential: yes)$", s, re.M)
    } | {p for p in BASE if p in stanzas}
    todo = list(keep)
    while todo:
        for d in deps(stanzas[todo.pop()]):
            if d not in keep:
                keep.add(d)
                todo.append(d)
    return "\n\n".join(stanzas[p] for p in sorted(keep)) + "\n", len(keep)


def count(status_file: str, packages: list[str], *flags: str) -> int:
    out = subprocess.run(
        ["apt-get", "-s", "install", *flags, "-o", f"Dir::State::status={status_file}", *packages],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sum(line.startswith("Inst ") for line in out.splitlines())


def main() -> int:
    status = Path("/var/lib/dpkg/status")
    if not status.exists():
        print(json.dumps({"skipped": "not a Debian machine"}))
        return 0
    text, base = minimal_status(status.read_text())
    packages = makefile_packages()
    with tempfile.NamedTemporaryFile("w", suffix=".status") as f:
        f.write(text)
        f.flush()
        with_rec = count(f.name, packages)
        without = count(f.name, packages, "--no-install-recommends")
    print(f"{len(packages)} packages asked for on a base of {base}", file=sys.stderr)
    print(json.dumps({
        "bench": "debian_packages", "asked": packages, "base_packages": base,
        "installed_with_recommends": with_rec, "installed_without_recommends": without,
        "ratio": round(with_rec / max(without, 1), 2),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
