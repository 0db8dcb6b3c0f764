"""LocalStack ready hook: ModelForge's tables, outbox stream and state-log bucket, from the one catalogue.

LocalStack runs each ``.py`` file in /etc/localstack/init/ready.d with ``exec(code, {})`` in its
own Python interpreter once it serves requests (so this file has no ``__file__`` and no
``__name__``). This hook starts the provisioning code `modelforge local up` runs
(tools/local_stack/modelforge_local_stack/provision.py, which reads infra/resources.json) in a child of that
interpreter, whose boto3 it uses, against LocalStack's own endpoint. localstack/docker-compose.yml
mounts those files, read-only, under /opt/modelforge; nothing else of the project is needed.

Creating is idempotent: a second run, or a restart, leaves existing resources as they are. A
failure raises, so LocalStack records the script as failed (``curl localhost:4566/_localstack/init``).

Settings (tests/integration/test_localstack_init.py runs this file the same way against the
embedded emulator):
  MODELFORGE_LOCALSTACK_REPO          where the repository's files are mounted (default /opt/modelforge)
  MODELFORGE_LOCALSTACK_ENDPOINT_URL  the endpoint to provision (default http://localhost:4566)
"""

import os
import subprocess
import sys

repo = os.environ.get("MODELFORGE_LOCALSTACK_REPO", "/opt/modelforge")
endpoint = os.environ.get("MODELFORGE_LOCALSTACK_ENDPOINT_URL", "http://localhost:4566")
child_environment = {
    **os.environ,
    # the two mounted packages, modelforge_local_stack (provision) and chalicelib (the catalogue)
    "PYTHONPATH": os.pathsep.join(
        filter(
            None,
            [os.path.join(repo, "tools", "local_stack"), os.path.join(repo, "functions"), os.environ.get("PYTHONPATH")],
        )
    ),
    # LocalStack takes any credentials; one that is not an account id means account 000000000000,
    # the account `modelforge local up --aws-endpoint-url` and the test suite use too
    "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID") or "test",
    "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY") or "test",
}
subprocess.run(
    [sys.executable, "-m", "modelforge_local_stack.provision", "--endpoint-url", endpoint],
    env=child_environment,
    check=True,
    timeout=300,
)
