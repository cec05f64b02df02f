"""The SBOM check (builder.build.sbom.validate): CycloneDX 1.6, strict, formats included."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT

# In a process of its own: a test worker may have imported jsonschema (and with it
# rfc3987-syntax) already, which would hide what validate() imports.
CHECK = """
import json, sys
from builder.core.errors import BuilderError
from builder.build.sbom import validate
verdicts = {}
for url in json.loads(sys.argv[1]):
    bom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1,
           "externalReferences": [{"type": "website", "url": url}]}
    try:
        validate(json.dumps(bom), "the SBOM")
        verdicts[url] = "valid"
    except BuilderError as error:
        verdicts[url] = str(error)
print(json.dumps({"verdicts": verdicts, "rfc3987_syntax": sys.modules.get("rfc3987_syntax")
                  is not None}))
"""


def test_iri_references_are_checked_without_building_rfc3987_syntax_grammars() -> None:
    urls = ["https://pypi.org/simple/sglang/", "https://例え.jp/パス?q=ü#frag", "../relative",
            "http://bad host/", "https://[not-an-ip]/"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps(urls)],
        capture_output=True, text=True, cwd=REPO_ROOT, check=True,
    )  # fmt: skip
    found = json.loads(result.stdout)
    assert found["rfc3987_syntax"] is False
    verdicts = found["verdicts"]
    assert [verdicts[u] for u in urls[:3]] == ["valid"] * 3
    for url in urls[3:]:
        assert verdicts[url].startswith("the SBOM is not valid CycloneDX 1.6:"), verdicts[url]
        assert "iri-reference" in verdicts[url], verdicts[url]
