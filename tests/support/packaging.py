"""`modelforge infra package`, run once per test session (the modules that read its template
share the output), and the template as SAM would transform it at deploy time."""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any


@cache
def packaged() -> Path:
    """The folder holding deployment.zip and sam.json (removed at exit)."""
    out = Path(tempfile.mkdtemp(prefix="modelforge-package-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "modelforge_cli.cli", "infra", "package", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def template() -> dict[str, Any]:
    return json.loads((packaged() / "sam.json").read_text())


@cache
def transformed(region: str = "us-east-1") -> str:
    """The template after the AWS::Serverless transform (aws-sam-translator, offline), as JSON:
    what CloudFormation deploys. The code is uploaded first (``aws cloudformation package`` or
    ``sam deploy`` rewrite CodeUri to an S3 URI), so it is given one here."""
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator

    sam = template()
    for resource in sam["Resources"].values():
        if resource["Type"] == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = "s3://modelforge-artifacts/deployment.zip"
    translator = Translator({}, Parser(), boto_session=boto3.Session(region_name=region))
    return json.dumps(translator.translate(sam, {"AdminTokenSha256": "a" * 64}), indent=1)
