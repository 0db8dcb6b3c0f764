"""The emulator looks up moto's list of services once, not on every request.

For every request, moto's dispatcher (``DomainDispatcherApplication.get_backend_for_host``) asks
``moto.backends.list_of_moto_modules()``, which lists moto's package folder on disk and tests each
of its ~150 entries with ``isdir``: a few hundred system calls per request, made while the
emulator's lock is held. The folders do not change while the process runs, so the list is read
once and the same answer is given from then on.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The moto internals this module patches (the emulator's canary test checks them).
MOTO_INTERNALS = ("moto.backends.list_of_moto_modules",)

_PATCHED = "_modelforge_listed_once"


def make_service_list_read_once() -> None:
    """Patch moto (once per process): see the module's docstring."""
    from moto import backends

    if getattr(backends.list_of_moto_modules, _PATCHED, False):
        return
    listed = tuple(backends.list_of_moto_modules())

    def list_of_moto_modules() -> Iterable[str]:
        return iter(listed)

    setattr(list_of_moto_modules, _PATCHED, True)
    backends.list_of_moto_modules = list_of_moto_modules
