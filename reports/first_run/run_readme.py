"""Run README.md's examples word for word (full sizes, default budgets) with the Python and
``modelprof`` of the current environment, in an empty folder; print each command, its exit
status and its wall time.

    python3 -m venv /tmp/fresh && . /tmp/fresh/bin/activate     # a fresh venv, no system packages
    pip install -e ".[all]" && modelprof --version                # the README's install command
    mkdir /tmp/tour && cd /tmp/tour && python /path/to/reports/first_run/run_readme.py /path/to/README.md

``pip install`` lines are skipped (run them first, as above). A Python block whose first line is
``# name.py`` is written to that file instead of being run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def main(readme: str) -> int:
    failures = 0
    for lang, body in BLOCK.findall(Path(readme).read_text(encoding="utf-8")):
        if lang == "python":
            first = body.splitlines()[0].strip()
            match = re.fullmatch(r"# ([\w./-]+\.py)", first)
            if match:
                Path(match.group(1)).write_text(body, encoding="utf-8")
                print(f"== wrote {match.group(1)}", flush=True)
                continue
            steps = [("python", [sys.executable, "-c", body], body.splitlines()[0])]
        else:
            steps = []
            for line in body.splitlines():
                line = line.split(" #", 1)[0].strip()
                for part in (p.strip() for p in line.split("&&") if p.strip()):
                    if not part.startswith("pip install"):
                        steps.append(("bash", shlex.split(part), part))
        for kind, argv, label in steps:
            start = time.perf_counter()
            run = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env={**__import__("os").environ, "MPLBACKEND": "Agg"},
            )
            seconds = time.perf_counter() - start
            print(f"== {kind}: {label}  -> exit {run.returncode} in {seconds:.1f} s", flush=True)
            tail = (run.stdout.strip().splitlines() or [""])[-3:]
            for line in tail:
                print(f"   {line[:150]}")
            if run.returncode != 0:
                failures += 1
                print(run.stderr[-2000:])
    print(f"== {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
