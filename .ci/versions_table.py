"""The README's "Supported versions" table, from the compatibility matrix's last run.

python .ci/versions_table.py --record ENV INSTALL_S TOUR_RC TESTS_RC EXTRA_RC JUNIT
    writes reports/compat/ENV.json (run by .ci/compat)
python .ci/versions_table.py [--readme]
    prints the table from reports/compat/*.json; --readme writes it into README.md
    between its "supported-versions" markers
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "compat"
COLUMNS = ("python", "torch", "torchvision", "transformers", "numpy", "pandas")
ORDER = ("oldest", "latest", "gpu")
BEGIN, END = "<!-- supported-versions:begin -->", "<!-- supported-versions:end -->"


def record(
    env: str, install_s: str, tour_rc: str, tests_rc: str, extra_rc: str, junit: str
) -> None:
    tour = json.loads((OUT / f"{env}-tour.json").read_text(encoding="utf-8"))
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    (OUT / f"{env}.json").write_text(
        json.dumps(
            {
                "env": env,
                "date": date.today().isoformat(),
                "versions": tour["versions"],
                "install_s": int(install_s),
                "tour": tour["steps"],
                "compat_tests": counts,
                "ok": tour_rc == tests_rc == extra_rc == "0",
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )


def table() -> str:
    runs = [
        json.loads((OUT / f"{e}.json").read_text(encoding="utf-8"))
        for e in ORDER
        if (OUT / f"{e}.json").exists()
    ]
    head = ["stack", *COLUMNS, "result"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        t = run["compat_tests"]
        passed = t["tests"] - t["failures"] - t["errors"] - t["skipped"]
        result = (
            f"{'pass' if run['ok'] else 'FAIL'}: tour, {passed} compat tests passed"
            f"{', %d failed' % (t['failures'] + t['errors']) if not run['ok'] else ''}"
            f" ({run['date']})"
        )
        lines.append(
            "| "
            + " | ".join([run["env"], *(run["versions"].get(c, "-") for c in COLUMNS), result])
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--record"]:
        record(*argv[1:7])
        return
    text = table()
    if argv[:1] == ["--readme"]:
        readme = ROOT / "README.md"
        body = readme.read_text(encoding="utf-8")
        start, end = body.index(BEGIN) + len(BEGIN), body.index(END)
        readme.write_text(body[:start] + "\n" + text + "\n" + body[end:], encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
