"""The node's persisted identity in MODELFORGE_AGENT_STATE_VOLUME.

Written atomically (temp file, fsync, rename, fsync of the directory), files 0600, directory
0700. The credential and idempotency key are created and persisted *before* the agent enrolls,
so a lost enroll answer followed by a retry ends with the same node.

Checked as ssh checks its keys: an identity file open to group or others, or that is a symbolic
link, is refused (exit 4); a state volume that is itself a symbolic link is refused; a real state
directory looser than 0700 is tightened, with a warning naming its old mode. A malformed node id
is never persisted.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from modelforge_protocol import credentials, files

from .failures import IdentityRefused

log = logging.getLogger("modelforge.agent.identity")

IDENTITY_FILE = "identity.json"
_FORMAT_VERSION = 1
#: An identity file is a few hundred bytes; anything this large is not one.
_MAX_IDENTITY_BYTES = 64 * 1024
#: Permission bits for group and others: none may be set on the identity file or the directory.
_OPEN_TO_OTHERS = 0o077


class StateVolumeError(IdentityRefused):
    """The state volume cannot hold the identity: never enroll without being able to persist."""


@dataclass(frozen=True)
class Identity:
    control_plane_url: str
    credential: str = field(repr=False)
    idempotency_key: str = field(repr=False)
    node_id: str | None = None

    @property
    def enrolled(self) -> bool:
        return self.node_id is not None


def new_identity(control_plane_url: str) -> Identity:
    return Identity(
        control_plane_url=control_plane_url,
        credential=credentials.new_node_credential(),
        idempotency_key=credentials.new_idempotency_key(),
    )


class StateVolume:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.identity_path = path / IDENTITY_FILE

    def has_identity(self) -> bool:
        """Whether an identity file is there; creates nothing and follows no link (``load`` checks it)."""
        try:
            os.lstat(self.identity_path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError:  # e.g. an unreadable volume: ``prepare`` and ``load`` say what is wrong
            return True
        return True

    def prepare(self) -> None:
        """Create the directory if needed (0700), tighten a looser one, prove it is writable, or refuse."""
        if self.path.is_symlink():
            raise StateVolumeError(
                f"state volume {self.path} is a symbolic link; the agent does not follow it. "
                "Set MODELFORGE_AGENT_STATE_VOLUME to the real directory it points at"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._tighten()
            with tempfile.NamedTemporaryFile(dir=self.path, prefix=".write-check-") as probe:
                probe.write(b"ok")
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as error:
            raise StateVolumeError(
                f"state volume {self.path} is not writable ({error.strerror or error}); "
                "fix MODELFORGE_AGENT_STATE_VOLUME before the agent can enroll"
            ) from None

    def _tighten(self) -> None:
        """chmod 0700 through a descriptor opened without following links: never a link's target."""
        descriptor = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            mode = stat.S_IMODE(os.fstat(descriptor).st_mode)
            if mode & _OPEN_TO_OTHERS:
                os.fchmod(descriptor, 0o700)
                log.warning(
                    f"state volume {self.path} had mode {mode:04o}, open to group or others; changed it to 0700",
                    extra={"event": "state_volume_mode_fixed", "path": str(self.path), "old_mode": f"{mode:04o}"},
                )
        finally:
            os.close(descriptor)

    def _read_identity_file(self) -> bytes | None:
        """The file's bytes, refusing a symbolic link, a non-file, or a file open to others."""
        try:
            descriptor = os.open(self.identity_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise IdentityRefused(
                    f"identity file {self.identity_path} is a symbolic link; the agent does not follow it. "
                    "Replace the link with the file itself (mode 0600)"
                ) from None
            raise StateVolumeError(
                f"cannot read identity file {self.identity_path} ({error.strerror or error})"
            ) from None
        try:
            info = os.fstat(descriptor)
            if not stat.S_ISREG(info.st_mode):
                raise IdentityRefused(f"identity file {self.identity_path} is not a regular file")
            self._check_mode(stat.S_IMODE(info.st_mode))
            return os.read(descriptor, _MAX_IDENTITY_BYTES + 1)
        finally:
            os.close(descriptor)

    def _check_mode(self, mode: int) -> None:
        if mode & _OPEN_TO_OTHERS:
            raise IdentityRefused(
                f"identity file {self.identity_path} has mode {mode:04o}: it is readable or writable by group or "
                f"others, so its credential may have been exposed. The agent refuses to use it. Run "
                f"`chmod 600 {self.identity_path}`; if anyone else could have read it, revoke this node's credential "
                "and enroll the node again"
            )

    def load(self) -> Identity | None:
        raw = self._read_identity_file()
        if raw is None:
            return None
        try:
            if len(raw) > _MAX_IDENTITY_BYTES:
                raise ValueError("too large")
            data = json.loads(raw)
            if data.pop("format_version") != _FORMAT_VERSION:
                raise ValueError("unknown format version")
            identity = Identity(**data)
            self._check(identity)
        except (ValueError, TypeError, KeyError, AttributeError):
            raise IdentityRefused(
                f"identity file {self.identity_path} is corrupt; the agent will not re-enroll silently. "
                "Restore it from backup, or, if this node must become a new node, revoke the old node's "
                "credential and move the file away"
            ) from None
        return identity

    @staticmethod
    def _check(identity: Identity) -> None:
        if not credentials.NODE_CREDENTIAL_RE.fullmatch(identity.credential):
            raise ValueError("credential")
        if not credentials.IDEMPOTENCY_KEY_RE.fullmatch(identity.idempotency_key):
            raise ValueError("idempotency key")
        if identity.node_id is not None and not credentials.NODE_ID_RE.fullmatch(identity.node_id):
            raise ValueError("node id")
        if not isinstance(identity.control_plane_url, str):
            raise ValueError("url")

    def save(self, identity: Identity) -> None:
        try:
            self._check(identity)
        except ValueError as invalid:  # a bug upstream: never persist what ``load`` would refuse
            raise ValueError(f"refusing to persist an identity with a malformed {invalid}") from None
        payload = json.dumps({"format_version": _FORMAT_VERSION, **asdict(identity)}, indent=2).encode()
        try:
            files.atomic_write(self.identity_path, payload, mode=0o600)
        except OSError as error:
            raise StateVolumeError(
                f"cannot write identity file {self.identity_path} ({error.strerror or error})"
            ) from None

    def enrolled_as(self, identity: Identity, node_id: str) -> Identity:
        updated = replace(identity, node_id=node_id)
        self.save(updated)
        return updated


def root_filesystem_warning(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """A warning when ``path`` lies on the container's own root filesystem (an overlay).

    The seed: "if a node reappears as a new identity, its state volume is not durable". A
    container's writable layer disappears with the container, and so would the identity.
    """
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    resolved = str(path.resolve())
    best_point, best_type = "", ""
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        mount_point = fields[4]
        fs_type = fields[fields.index("-") + 1]
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best_point):
            best_point, best_type = mount_point, fs_type
    if best_point == "/" and best_type == "overlay":
        return (
            f"state volume {path} is on the container's root filesystem (overlay), not a mounted volume: "
            "the node identity will be lost with the container and the node will reappear as a new one. "
            "Mount durable storage at MODELFORGE_AGENT_STATE_VOLUME"
        )
    return None
