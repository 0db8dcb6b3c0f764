"""`modelforge release manifest|verify|check-container`: make the release bundle, check it on the
node, and check the started container. Every failure is one line per reason on stderr."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from modelforge_protocol.release_bundle import IMAGE_VARIABLES, NODE_AGENT_IMAGE, RELEASE_IMAGES
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from .admin_api import add_command
from .release_container import check_container, normalise_image_id
from .release_verify import Refused, UsageError, verify_bundle
from .tables import counted

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: At most this many reasons are printed; the rest are counted.
MAX_PROBLEM_LINES = 40
NODE_COMPOSE_FILES = "-f docker-compose.yml -f docker-compose.node-agent.yml"

EXIT_CODES_HELP = """\
exit codes:
  0  done: written, verified, or the container runs the loaded image
  1  refused: a checksum, tag, layer, architecture, label or image differs, or an archive is corrupt
     (one line per reason on stderr)
  2  usage error: a path that does not exist, an output name taken by a file or link (never
     written through), input that is not docker inspect JSON, a malformed image ID
"""


def _add(commands: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    return add_command(commands, name, help=help, description=description, epilog=EXIT_CODES_HELP)


def register(commands: Any) -> None:
    release = commands.add_parser(
        "release",
        help="the release bundle: one images tarball, its manifest and SHA256SUMS",
        description=(
            f"Release {IMAGE_TAG_VERSION}: make the image bundle, verify it on a node, check the started container."
        ),
    )
    sub = release.add_subparsers(dest="release_command", required=True, metavar="COMMAND")

    manifest = _add(
        sub,
        "manifest",
        help="write the bundle folder: the images tarball, its manifest and SHA256SUMS",
        description=f"Read image archives (docker save tarballs, legacy or Docker 25+ layout, or OCI image "
        f"layouts, folder or tarball), check every digest, and write into --out one tarball with all the "
        f"images (modelforge-{IMAGE_TAG_VERSION}-images.tar, for one `docker image load`), the manifest "
        f"(modelforge-{IMAGE_TAG_VERSION}-manifest.json) and SHA256SUMS. Each image must be tagged "
        f"<name>:{IMAGE_TAG_VERSION} and nothing else, and carry the OCI labels.",
    )
    manifest.add_argument(
        "archives",
        nargs="+",
        type=Path,
        metavar="IMAGE_ARCHIVE",
        help="a docker save tarball (one or more images), or an OCI image layout folder or tarball",
    )
    manifest.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="the bundle folder to write (created if absent)"
    )
    manifest.add_argument(
        "--expect",
        action="append",
        metavar="NAME",
        help=f"an image the bundle must hold (repeat; default: {', '.join(RELEASE_IMAGES)}); no other is accepted",
    )
    manifest.set_defaults(release_handler=run_manifest)

    verify = _add(
        sub,
        "verify",
        help="check a bundle folder against SHA256SUMS and its manifest; print the load command",
        description="Check every file of DIR against SHA256SUMS, then read the images tarball and compare each "
        "image with the manifest: tag, RootFS layer list (in order), architecture, os, variant and every "
        "recorded OCI label. The image/config ID is not compared (docker load may rewrite it). On success, "
        "print the docker image load command and the image reference for the node's .env.",
    )
    verify.add_argument(
        "folder", type=Path, metavar="DIR", help="the bundle folder (SHA256SUMS, manifest, images tarball)"
    )
    verify.set_defaults(release_handler=run_verify)

    container = _add(
        sub,
        "check-container",
        help="check that a started container runs the image ID captured after docker image load",
        description="Read `docker inspect <container>` JSON and pass only when the container's .Image is "
        "--expected-image-id, the ID `docker image inspect --format '{{.Id}}' <tag>` printed after the load.",
    )
    container.add_argument(
        "--inspect",
        default="-",
        metavar="FILE",
        help="the docker inspect output of the container (default -: standard input)",
    )
    container.add_argument(
        "--expected-image-id",
        required=True,
        metavar="ID",
        help="the loaded image's ID (sha256:<64 hex>)",
    )
    container.set_defaults(release_handler=run_check_container)


def run(args: argparse.Namespace) -> int:
    try:
        return int(args.release_handler(args))
    except Refused as refused:
        _print_problems(refused.problems)
        return EXIT_FAILED
    except UsageError as error:
        print(f"modelforge: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        print(f"modelforge: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("modelforge: interrupted", file=sys.stderr)
        return 130


def _print_problems(problems: list[str]) -> None:
    for problem in problems[:MAX_PROBLEM_LINES]:
        print(f"modelforge: {problem}", file=sys.stderr)
    if len(problems) > MAX_PROBLEM_LINES:
        print(f"modelforge: ... and {len(problems) - MAX_PROBLEM_LINES} more", file=sys.stderr)


def run_manifest(args: argparse.Namespace) -> int:
    from .release_manifest import make_bundle

    expected = tuple(dict.fromkeys(args.expect)) if args.expect else RELEASE_IMAGES
    written = make_bundle(args.archives, args.out, expected)
    print(f"wrote {written.bundle} ({', '.join(written.tags)})")
    print(f"wrote {written.manifest}")
    print(f"wrote {written.sums}")
    print(f"ship the folder; on the node: modelforge release verify {shlex.quote(str(written.folder))}")
    return EXIT_OK


def run_verify(args: argparse.Namespace) -> int:
    verified = verify_bundle(args.folder)
    images = verified.manifest["images"]
    print(
        f"verified {verified.folder}: SHA256SUMS, the manifest and the {counted(len(images), 'image')} of release "
        f"{verified.manifest['release']} in {verified.bundle.name}"
    )
    for note in verified.notes:
        print(f"note: {note}")
    print("\nload the images:")
    print(f"  docker image load -i {shlex.quote(str(verified.bundle.resolve()))}")
    settings = [
        f"{IMAGE_VARIABLES[name]}={entry['tag']}" for name, entry in sorted(images.items()) if name in IMAGE_VARIABLES
    ]
    if settings:
        print("\nset in the node's .env (or paste images.modelforge-node-agent from the manifest into the console):")
        print("".join(f"  {line}\n" for line in settings), end="")
    agent = images.get(NODE_AGENT_IMAGE)
    if agent is not None:
        print("\ncapture the loaded image ID before starting the agent, and check the container after:")
        print(f"  IMAGE_ID=$(docker image inspect --format '{{{{.Id}}}}' {agent['tag']})")
        print(
            f'  docker inspect "$(docker compose {NODE_COMPOSE_FILES} ps -q node-agent)" '
            '| modelforge release check-container --expected-image-id "$IMAGE_ID"'
        )
    others = [entry["tag"] for name, entry in sorted(images.items()) if name not in IMAGE_VARIABLES]
    if others:
        print(f"\nalso loaded: {', '.join(others)}")
    return EXIT_OK


def run_check_container(args: argparse.Namespace) -> int:
    try:
        expected = normalise_image_id(args.expected_image_id)
    except ValueError as error:
        raise UsageError(f"--expected-image-id: {error}") from None
    source = "standard input" if args.inspect == "-" else args.inspect
    try:
        document = json.loads(sys.stdin.read() if args.inspect == "-" else Path(args.inspect).read_bytes())
    except ValueError:
        raise UsageError(f"{source}: not JSON (give it the output of docker inspect <container>)") from None
    try:
        result = check_container(document, expected)
    except ValueError as error:
        raise UsageError(f"{source}: {error}") from None
    if not result.ok:
        print(f"modelforge: {result.message}", file=sys.stderr)
        return EXIT_FAILED
    print(result.message)
    return EXIT_OK
