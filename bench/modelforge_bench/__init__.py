"""What the benchmark scripts in bench/ share (support.py: failures, ``main()``, child processes;
cost_model.py: what DynamoDB, S3 and Lambda charge), installed by the developer's install (the
root pyproject.toml), so that the scripts and the tests import it like any package."""
